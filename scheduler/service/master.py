"""The Master: Manager + Scheduler + Compute Controller + Network Controller behind one HTTP API.

Threads: the HTTP server (one thread per request) records registrations, heartbeats, metric lines
and new jobs under one lock and wakes the *control loop*; the control loop is the only place that
changes a job's life cycle (schedule, launch, tear down, retry, finish, cancel) and it talks to
agents without holding the lock, so heartbeats are never delayed by a slow `docker run`.

Closed loop: an agent reports a worker's exit at once (its next heartbeat is sent immediately);
a node whose heartbeats stop for `heartbeat_timeout_s` is taken offline. Either ends the job's
attempt: it is scheduled again on what is left, or fails with the reason.

API (JSON):
  GET  /health                      the Master is up; scheduler; nodes online
  POST /agents                      Registration  -> {"expected_workers": [...]}
  POST /agents/{node}/heartbeat     Heartbeat     -> {"stop": [...]}
  GET  /nodes                       per node: capacity, allocated, online, usage, cordoned
  PUT  /nodes/{node}                {"schedulable": bool}   (cordon / uncordon)
  GET  /links                       per directed link: capacity, granted, measured, background
  GET  /scheduler   PUT /scheduler  {"algorithm": name, "seed": n, "queue": policy}
  POST /jobs                        {"job": mapping as in a job YAML, "algorithm": optional}
  GET  /jobs                        summaries
  GET  /jobs/{name}[?records=1]     details (+ every metric line of every worker)
  DELETE /jobs/{name}               cancel
"""
from __future__ import annotations

import itertools
import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from topologies import Topology

from ..jobs import JobError, parse_job
from ..metrics import predicted_iteration_s
from ..model import Cluster, Decision, check_decision
from .compute import AgentError, ComputeController, worker_command, worker_image
from .http import ApiError, JsonApp, Server, json_body
from .manager import EXIT_BAD_PARAMETERS, TERMINAL, Attempt, JobRecord, Manager, ManagerError
from .network import NetworkController, SdnApi
from .protocol import Heartbeat, Registration, WorkerSpec, WorkerState, from_json
from .scheduling import Scheduler, UnknownAlgorithm, expected_end

log = logging.getLogger(__name__)


@dataclass
class MasterConfig:
    algorithm: str = "network-aware"  # the default single-job scheduler
    queue: str = "fifo-backfill"  # the queue policy (scheduler.multi)
    seed: int = 0
    image: str = ""  # worker image for jobs that name none
    heartbeat_timeout_s: float = 6.0  # silence after which a node is offline
    max_attempts: int = 2  # placements per job before it fails
    tick_s: float = 0.5  # control loop period
    links_poll_s: float = 2.0  # how often the SDN app's link statistics are read
    first_port: int = 29500  # rendezvous ports: one per attempt, counting up


class Master:
    def __init__(self, topo: Topology, config: MasterConfig = MasterConfig(),
                 sdn: SdnApi | None = None, sdn_job_id: str = "ces"):
        self.topo, self.cfg, self.sdn = topo, config, sdn
        self.lock = threading.RLock()
        self.cluster = Cluster.from_topology(topo)
        self.manager = Manager(config.max_attempts)
        self.compute = ComputeController(config.heartbeat_timeout_s)
        self.network = NetworkController(topo, self.cluster, self.compute, sdn, sdn_job_id)
        self.scheduler = Scheduler(config.algorithm, config.seed, config.queue)
        self.cordoned: set[str] = set()
        self.worker_job: dict[str, str] = {}  # every worker ever started -> its job
        self._ports = itertools.count(config.first_port)
        self._events: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._dirty = True
        self._thread: threading.Thread | None = None
        self.server: Server | None = None
        self.app = self._routes()

    # --- life ----------------------------------------------------------------------------------
    def start(self, host: str = "127.0.0.1", port: int = 0) -> Master:
        self.server = Server(self.app, host, port).start()
        self._thread = threading.Thread(target=self._loop, name="control", daemon=True)
        self._thread.start()
        log.info("master on %s (scheduler %s)", self.server.url, self.scheduler.default)
        return self

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self._stop.set()
        self._events.put(("wake",))
        if self._thread:
            self._thread.join(timeout=10)
        if self.server:
            self.server.stop()

    def _wake(self) -> None:
        self._dirty = True
        self._events.put(("wake",))

    def unschedulable(self) -> set[str]:
        nodes = set(self.cluster.compute_nodes())
        return (nodes - self.compute.online()) | self.cordoned

    # --- the control loop ----------------------------------------------------------------------
    def _loop(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            events = []
            try:
                events.append(self._events.get(timeout=self.cfg.tick_s))
                while True:
                    events.append(self._events.get_nowait())
            except queue.Empty:
                pass
            for ev in events:
                self._guarded(self._handle, ev)
            self._guarded(self._check_heartbeats)
            if self.sdn is not None and time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.cfg.links_poll_s
                self._guarded(self._poll_links)
            if self._dirty:
                self._dirty = False
                self._guarded(self._schedule)

    def _guarded(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # the control loop must survive any single failure
            log.exception("control loop: %s failed", getattr(fn, "__name__", fn))

    def _handle(self, ev: tuple) -> None:
        kind = ev[0]
        if kind == "ended":
            self._worker_ended(ev[1], ev[2])
        elif kind == "node_up":
            self.network.resync(ev[1])
            self._dirty = True
        elif kind == "cancel":
            self._cancel(ev[1], ev[2])

    def _check_heartbeats(self) -> None:
        with self.lock:
            stale = self.compute.stale()
            for node, _ in stale:
                self.compute.mark_offline(node)
                self.cluster.offline.add(node)
        for node, silent in stale:
            log.warning("node %s stopped heartbeating (%.1f s)", node, silent)
            with self.lock:
                affected = self.manager.on_node(node)
            for rec in affected:
                self._fail_attempt(rec, f"node {node} stopped heartbeating "
                                        f"(silent for {silent:.1f} s)", retryable=True)
            self._dirty = True

    def _poll_links(self) -> None:
        links = self.sdn.links()
        with self.lock:
            self.network.observe(links)

    # --- scheduling ----------------------------------------------------------------------------
    def _schedule(self) -> None:
        """One round of the queue policy per single-job algorithm in use (jobs may name their
        own), in submit order; each job it starts is pinned to the node pairs' paths, checked
        again, and launched; the others wait with the reason."""
        with self.lock:  # the HTTP threads add jobs meanwhile
            queued = self.manager.queued()
        for algorithm in dict.fromkeys(r.algorithm for r in queued):
            recs = {r.name: r for r in queued if r.algorithm == algorithm}
            with self.lock:
                view = self.network.view(self.unschedulable())
                running = [(r.job, r.current.decision,
                            expected_end(r.current.started_at, r.job,
                                         r.current.info.get("predicted_iteration_s", math.inf)))
                           for r in self.manager.active()]
            try:
                placed, reasons = self.scheduler.round(view, algorithm,
                                                       [r.job for r in recs.values()], running,
                                                       time.time())
            except Exception as e:  # the algorithm itself broke: say so, do not retry forever
                log.exception("scheduler %s failed", algorithm)
                with self.lock:
                    for rec in recs.values():
                        self.manager.reject(rec, f"scheduler {algorithm} failed: "
                                                 f"{type(e).__name__}: {e}")
                        self.scheduler.finished(rec.name)
                continue
            for p in placed:
                rec = recs[p.job]
                with self.lock:
                    fresh = self.network.view(self.unschedulable())
                decision = self.network.pin(p.decision)
                problems = check_decision(fresh, rec.job, decision)
                if problems:
                    with self.lock:
                        self.manager.wait(rec, f"sharing a node pair's path: {problems[0]}")
                    continue
                self._launch(rec, decision, fresh)
            with self.lock:
                for name, why in reasons.items():
                    self.manager.wait(recs[name], why)

    def _launch(self, rec: JobRecord, decision: Decision, view: Cluster) -> None:
        job = rec.job
        names = {t.name: f"{job.name}-{t.name}-a{len(rec.attempts) + 1}" for t in job.tasks}
        port = next(self._ports)
        with self.lock:
            attempt = self.manager.start_attempt(rec, decision, names, port)
            attempt.info.update(predicted_iteration_s=predicted_iteration_s(view, job, decision),
                                decision_s=decision.decision_s)
            self.worker_job.update({n: job.name for n in names.values()})
            try:
                self.network.install(job, decision)
            except Exception as e:
                self.manager.end_attempt(rec, f"the network refused the flows: {e}",
                                         retryable=False)
                self.scheduler.finished(rec.name)
                return
        rank0 = self.compute.agents[decision.placement[job.tasks[0].name]].reg
        for rank, task in enumerate(job.tasks):
            node = decision.placement[task.name]
            agent = self.compute.agents[node].reg
            try:
                command = worker_command(job, rank, rank0.ip, port, agent.iface, self.scheduler.seed)
            except ValueError as e:
                self._fail_attempt(rec, str(e), retryable=False)
                return
            spec = WorkerSpec(names[task.name], job.name, task.name,
                              worker_image(job.image, self.cfg.image), command, task.demand.cpu,
                              task.demand.mem_mb)
            try:
                self.compute.start_worker(node, spec)
            except AgentError as e:
                self._fail_attempt(rec, f"could not start {task.name} on {node}: {e}",
                                   retryable=True)
                return
        with self.lock:
            self.manager.mark_running(rec)

    def _teardown(self, rec: JobRecord, attempt: Attempt) -> None:
        """Stop an ended attempt's workers (those on silent nodes are stopped when their agent
        answers again) and free its network share and resources."""
        for task, name in attempt.workers.items():
            self.compute.stop_worker(attempt.decision.placement[task], name)
        with self.lock:
            self.network.remove(rec.name)

    def _fail_attempt(self, rec: JobRecord, reason: str, retryable: bool) -> None:
        attempt = rec.current
        if attempt is None:
            return
        with self.lock:  # recorded first: the time of the event is when it was noticed
            if self.manager.end_attempt(rec, reason, retryable) in TERMINAL:
                self.scheduler.finished(rec.name)
        self._teardown(rec, attempt)
        self._dirty = True

    def _worker_ended(self, node: str, w: WorkerState) -> None:
        with self.lock:
            owner = self.manager.worker_owner(w.name)
        if owner is None:
            return  # an earlier attempt's worker, already dealt with
        rec, task = owner
        if w.state == "exited" and w.exit_code == 0:
            attempt = rec.current
            done = all(self._exited_ok(attempt.decision.placement[t], n)
                       for t, n in attempt.workers.items())
            if done:
                with self.lock:
                    self.manager.finish(rec)
                    self.scheduler.finished(rec.name)
                self._teardown(rec, attempt)
                self._dirty = True
            return
        what = f"exited with code {w.exit_code}" if w.state == "exited" else "disappeared"
        detail = f" ({w.detail})" if w.detail else ""
        self._fail_attempt(rec, f"worker {task} on {node} {what}{detail}",
                           retryable=w.exit_code != EXIT_BAD_PARAMETERS)

    def _exited_ok(self, node: str, worker: str) -> bool:
        st = self.compute.agents[node].workers.get(worker)
        return st is not None and st.state == "exited" and st.exit_code == 0

    def _cancel(self, name: str, done: Future) -> None:
        try:
            rec = self.manager.get(name)
            attempt = rec.current
            with self.lock:
                self.manager.cancel(rec)
                self.scheduler.finished(rec.name)
            if attempt is not None:
                self._teardown(rec, attempt)
            done.set_result(self.job_view(rec))
        except ManagerError as e:
            done.set_exception(e)
        self._dirty = True

    # --- the agents' side ----------------------------------------------------------------------
    def register(self, reg: Registration) -> dict:
        if reg.node not in self.cluster.compute_nodes():
            raise ApiError(400, f"node '{reg.node}' is not a compute node of topology "
                                f"'{self.topo.name}'")
        with self.lock:
            self.compute.register(reg)
            self.cluster.offline.discard(reg.node)
            expected = self.manager.expected_workers(reg.node)
        log.info("agent %s registered from %s", reg.node, reg.url)
        self._events.put(("node_up", reg.node))
        return {"expected_workers": expected}

    def heartbeat(self, hb: Heartbeat) -> dict:
        with self.lock:
            if hb.node not in self.compute.agents:
                raise ApiError(409, f"node '{hb.node}' has not registered")
            expected = set(self.manager.expected_workers(hb.node))
            came_back, ended = self.compute.heartbeat(hb, expected)
            if came_back:
                self.cluster.offline.discard(hb.node)
            for line in hb.records:
                job = self.worker_job.get(line.get("worker", ""))
                if job in self.manager.jobs:
                    self.manager.jobs[job].records.setdefault(line["worker"], []).append(line)
            stop = self.compute.unwanted(hb.node, expected)
        for w in ended:
            self._events.put(("ended", hb.node, w))
        if came_back:
            log.info("node %s is back", hb.node)
            self._events.put(("node_up", hb.node))
        return {"stop": stop}

    # --- views ---------------------------------------------------------------------------------
    def job_view(self, rec: JobRecord, records: bool = False) -> dict:
        job = rec.job
        end = rec.finished_at if rec.finished_at is not None else time.time()
        out: dict[str, Any] = {
            "name": rec.name, "state": rec.state.value, "reason": rec.reason,
            "algorithm": rec.algorithm, "collective": job.collective,
            "tasks": [t.name for t in job.tasks], "workload": job.workload,
            "submitted_at": rec.submitted_at, "finished_at": rec.finished_at,
            "jct_s": round(end - rec.submitted_at, 3) if rec.state in TERMINAL else None,
            "progress": rec.progress(),
            "events": [{"t": round(t - rec.submitted_at, 3), "event": e} for t, e in rec.events],
            "attempts": [], "result": self._result(rec)}
        for a in rec.attempts:
            nodes = a.decision.placement
            out["attempts"].append({
                "number": a.number, "placement": dict(nodes), "workers": dict(a.workers),
                "master_port": a.master_port, "outcome": a.outcome,
                "started_at": a.started_at, "ended_at": a.ended_at, **a.info,
                "flows": [{"src": f.src, "dst": f.dst, "src_node": f.path[0],
                           "dst_node": f.path[-1], "path": list(f.path),
                           "rate_mbps": f.rate_mbps} for f in a.decision.flows]})
        if records:
            out["records"] = {w: list(lines) for w, lines in rec.records.items()}
        return out

    def _result(self, rec: JobRecord) -> dict | None:
        """Rank 0's end-of-training line of the last attempt (the workload's own figures)."""
        end = rec.last_of("end", rec.job.tasks[0].name)
        return {k: end.get(k) for k in ("reached_target", "tta_s", "tta_iter", "stop_reason",
                                        "iters", "train_s", "startup_s", "jct_s")} if end else None

    def nodes_view(self) -> list[dict]:
        with self.lock:
            out = []
            for n in self.cluster.compute_nodes():
                cap, used = self.cluster.capacity(n), self.cluster.used[n]
                out.append({"node": n, "capacity": {"cpu": cap.cpu, "mem_mb": cap.mem_mb},
                            "allocated": {"cpu": round(used.cpu, 3), "mem_mb": used.mem_mb},
                            "cordoned": n in self.cordoned, **self.compute.node_view(n)})
            return out

    # --- HTTP ----------------------------------------------------------------------------------
    def _routes(self) -> JsonApp:
        app = JsonApp()
        app.route("GET", "/health", lambda req: {
            "ok": True, "topology": self.topo.name, "scheduler": self.scheduler.default,
            "queue": self.scheduler.queue, "seed": self.scheduler.seed,
            "nodes_online": len(self.compute.online())})
        app.route("POST", "/agents", lambda req: self.register(_msg(Registration, req)))
        app.route("POST", "/agents/(?P<node>[^/]+)/heartbeat",
                  lambda req, node: self.heartbeat(_msg(Heartbeat, req, node=node)))
        app.route("GET", "/nodes", lambda req: self.nodes_view())
        app.route("PUT", "/nodes/(?P<node>[^/]+)", self._put_node)
        app.route("GET", "/links", lambda req: self._locked(self.network.report))
        app.route("GET", "/scheduler", lambda req: self._scheduler_view())
        app.route("PUT", "/scheduler", self._put_scheduler)
        app.route("POST", "/jobs", self._post_job)
        app.route("GET", "/jobs", lambda req: self._locked(
            lambda: [self.job_view(r) for r in self.manager.jobs.values()]))
        app.route("GET", "/jobs/(?P<name>[^/]+)", lambda req, name: self._locked(
            lambda: self.job_view(self._job(name), records=req.GET.get("records") == "1")))
        app.route("DELETE", "/jobs/(?P<name>[^/]+)", self._delete_job)
        return app

    def _locked(self, fn):
        with self.lock:
            return fn()

    def _job(self, name: str) -> JobRecord:
        try:
            return self.manager.get(name)
        except ManagerError as e:
            raise ApiError(e.status, str(e)) from None

    def _put_node(self, req, node: str) -> dict:
        body = json_body(req)
        if node not in self.cluster.compute_nodes():
            raise ApiError(404, f"no compute node named '{node}'")
        if not isinstance(body, dict) or not isinstance(body.get("schedulable"), bool):
            raise ApiError(400, 'expected {"schedulable": true|false}')
        with self.lock:
            (self.cordoned.discard if body["schedulable"] else self.cordoned.add)(node)
        self._wake()
        return {"node": node, "schedulable": body["schedulable"]}

    def _scheduler_view(self) -> dict:
        return {"algorithm": self.scheduler.default, "seed": self.scheduler.seed,
                "queue": self.scheduler.queue}

    def _put_scheduler(self, req) -> dict:
        body = json_body(req)
        if not isinstance(body, dict) or not isinstance(body.get("algorithm"), str) \
                or not isinstance(body.get("seed", 0), int) \
                or not isinstance(body.get("queue", ""), str):
            raise ApiError(400, 'expected {"algorithm": name, "seed": integer, '
                                '"queue": policy (optional)}')
        with self.lock:
            try:
                self.scheduler.configure(body["algorithm"], body.get("seed", 0),
                                         body.get("queue") or "fifo-backfill")
            except UnknownAlgorithm as e:
                raise ApiError(400, str(e)) from None
            return self._scheduler_view()

    def _post_job(self, req) -> tuple[int, dict]:
        body = json_body(req)
        if not isinstance(body, dict) or "job" not in body:
            raise ApiError(400, 'expected {"job": {...job mapping...}, "algorithm": optional}')
        try:
            job = parse_job(body["job"], str(body.get("source", "<request>")))
        except JobError as e:
            raise ApiError(400, str(e)) from None
        with self.lock:
            try:
                algorithm = self.scheduler.resolve(body.get("algorithm"))
                rec = self.manager.submit(job, algorithm)
                self.scheduler.submitted(job, rec.submitted_at)
            except UnknownAlgorithm as e:
                raise ApiError(400, str(e)) from None
            except ManagerError as e:
                raise ApiError(e.status, str(e)) from None
            view = self.job_view(rec)
        self._wake()
        return 201, view

    def _delete_job(self, req, name: str) -> dict:
        done: Future = Future()
        self._events.put(("cancel", name, done))
        try:
            return done.result(timeout=60)
        except ManagerError as e:
            raise ApiError(e.status, str(e)) from None


def _msg(cls: type, req, **must: str):
    """A protocol message from the request body; 400 when malformed or inconsistent."""
    try:
        msg = from_json(cls, json_body(req))
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    for k, v in must.items():
        if getattr(msg, k) != v:
            raise ApiError(400, f"{cls.__name__}: field '{k}' is '{getattr(msg, k)}', the URL "
                                f"says '{v}'")
    return msg
