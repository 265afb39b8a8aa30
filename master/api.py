"""The Master's HTTP face: the API users, run.py and the agents call, as JSON over HTTP.

  GET  /health                      the Master is up; scheduler; nodes online
  POST /agents                      Registration  -> {"expected_workers": [...], "lines": {...}}
  POST /agents/{node}/heartbeat     Heartbeat     -> {"stop": [...]}
  GET  /nodes                       per node: capacity, allocated, online, usage, cordoned
  PUT  /nodes/{node}                {"schedulable": bool}   (cordon / uncordon)
  GET  /links                       per directed link: capacity, up, granted, measured, unscheduled
  PUT  /links/{u}/{v}               {"bw_mbps": capacity}   (a link's capacity changed)
  GET  /scheduler   PUT /scheduler  {"algorithm": name, "seed": n, "queue": policy}
  POST /jobs                        {"job": mapping as in a job YAML, "algorithm": optional}
  GET  /jobs                        summaries
  GET  /jobs/{name}[?records=1]     details (+ every metric line of every worker)
  DELETE /jobs/{name}               cancel

Handlers validate, read or record under the Master's lock and wake its control loop; they never
talk to an agent or the SDN app. A refused request is a 4xx with {"error": ...} and changes
nothing. Over TLS the caller's certificate says what it may do (`peer_may`): the control
machine's everything, an agent's only its own node's registration and heartbeats (403 else).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protocol.http import ApiError, JsonApp, Request
from protocol.messages import Heartbeat, Registration, from_json
from protocol.tls import CONTROL, agent_node
from scheduler.jobs import JobError, parse_job

from .compute import NotRegistered
from .manager import TERMINAL, JobRecord, ManagerError
from .scheduling import UnknownAlgorithm


def peer_may(peer: str | None, method: str, path: str) -> bool:
    """Over TLS, whether the holder of certificate `peer` may make this request: the control
    machine (the operator, run.py) anything; an agent what an agent does, as its own node
    only (`_post_agent` checks the node a registration names)."""
    if peer == CONTROL:
        return True
    node = agent_node(peer)
    return node is not None and (method, path.rstrip("/")) in {
        ("POST", "/agents"),
        ("POST", f"/agents/{node}/heartbeat"),
        ("GET", "/nodes"),  # a leaving agent waits to be taken offline
    }


class MasterApi:
    """The routes of a `master.Master` (`master`), with `token` required when given."""

    def __init__(self, master, token: str | None = None):
        self.m = master
        app = self.app = JsonApp(token=token, peers=peer_may)
        app.route("GET", "/health", lambda req: self.health())
        app.route("POST", "/agents", self._post_agent)
        app.route("POST", "/agents/(?P<node>[^/]+)/heartbeat", self._post_heartbeat)
        app.route("GET", "/nodes", lambda req: self.nodes_view())
        app.route("PUT", "/nodes/(?P<node>[^/]+)", self._put_node)
        app.route("GET", "/links", lambda req: self._locked(self.m.network.report))
        app.route("PUT", "/links/(?P<u>[^/]+)/(?P<v>[^/]+)", self._put_link)
        app.route("GET", "/scheduler", lambda req: self._scheduler_view())
        app.route("PUT", "/scheduler", self._put_scheduler)
        app.route("POST", "/jobs", self._post_job)
        app.route(
            "GET",
            "/jobs",
            lambda req: self._locked(
                lambda: [self.job_view(r) for r in self.m.manager.jobs.values()]
            ),
        )
        app.route(
            "GET",
            "/jobs/(?P<name>[^/]+)",
            lambda req, name: self._locked(
                lambda: self.job_view(self._job(name), records=req.query.get("records") == "1")
            ),
        )
        app.route("DELETE", "/jobs/(?P<name>[^/]+)", self._delete_job)

    def _locked(self, fn: Callable[[], Any]) -> Any:
        with self.m.lock:
            return fn()

    # --- the agents -----------------------------------------------------------------------------
    def _post_agent(self, req: Request) -> dict:
        reg = _msg(Registration, req)
        if agent_node(req.peer) not in (None, reg.node):
            raise ApiError(
                403, f"the certificate of '{req.peer}' may not register node '{reg.node}'", "node"
            )
        if not reg.url.startswith(("http://", "https://")):  # the Master will call it
            raise ApiError(
                400, f"Registration: field 'url' is {reg.url!r}, expected http://HOST:PORT", "url"
            )
        if reg.node not in self.m.cluster.compute_nodes():
            raise ApiError(
                400,
                f"node '{reg.node}' is not a compute node of topology '{self.m.topo.name}'",
                "node",
            )
        held = self.m.register(reg)
        return {"expected_workers": list(held), "lines": held}

    def _post_heartbeat(self, req: Request, node: str) -> dict:
        hb = _msg(Heartbeat, req, node=node)
        for i, line in enumerate(hb.records):  # the Master files each line under its worker
            if not isinstance(line.get("worker", ""), str):
                raise ApiError(
                    400,
                    f"Heartbeat: records[{i}].worker: expected a worker name "
                    f"(a string), got {line['worker']!r}",
                    f"records[{i}].worker",
                )
        try:
            return {"stop": self.m.heartbeat(hb)}
        except NotRegistered:
            raise ApiError(409, f"node '{hb.node}' has not registered") from None

    # --- views ----------------------------------------------------------------------------------
    def health(self) -> dict:
        s = self.m.scheduler
        with self.m.lock:
            jobs: dict[str, int] = {}
            for rec in self.m.manager.jobs.values():
                jobs[rec.state.value] = jobs.get(rec.state.value, 0) + 1
        return {
            "ok": True,
            "topology": self.m.topo.name,
            "scheduler": s.default,
            "queue": s.queue,
            "seed": s.seed,
            "nodes_online": len(self.m.compute.online()),
            "jobs": jobs,
        }

    def job_view(self, rec: JobRecord, records: bool = False) -> dict:
        job = rec.job
        end = rec.finished_at if rec.finished_at is not None else self.m.clock()
        out: dict[str, Any] = {
            "name": rec.name,
            "state": rec.state.value,
            "reason": rec.reason,
            "algorithm": rec.algorithm,
            "collective": job.collective,
            "tasks": [t.name for t in job.tasks],
            "workload": job.workload,
            "submitted_at": rec.submitted_at,
            "finished_at": rec.finished_at,
            "jct_s": round(end - rec.submitted_at, 3) if rec.state in TERMINAL else None,
            "progress": rec.progress(),
            "events": [{"t": round(t - rec.submitted_at, 3), "event": e} for t, e in rec.events],
            "attempts": [],
            "result": _result(rec),
        }
        for a in rec.attempts:
            out["attempts"].append(
                {
                    "number": a.number,
                    "placement": dict(a.decision.placement),
                    "workers": dict(a.workers),
                    "master_port": a.master_port,
                    "outcome": a.outcome,
                    "started_at": a.started_at,
                    "ended_at": a.ended_at,
                    **a.info,
                    "flows": [
                        {
                            "src": f.src,
                            "dst": f.dst,
                            "src_node": f.path[0],
                            "dst_node": f.path[-1],
                            "path": list(f.path),
                            "rate_mbps": f.rate_mbps,
                        }
                        for f in a.decision.flows
                    ],
                }
            )
        if records:
            out["records"] = {w: list(lines) for w, lines in rec.records.items()}
        return out

    def nodes_view(self) -> list[dict]:
        m = self.m
        with m.lock:
            out = []
            for n in m.cluster.compute_nodes():
                cap, used = m.cluster.capacity(n), m.cluster.used[n]
                out.append(
                    {
                        "node": n,
                        "capacity": {"cpu": cap.cpu, "mem_mb": cap.mem_mb},
                        "allocated": {"cpu": round(used.cpu, 3), "mem_mb": used.mem_mb},
                        "cordoned": n in m.cordoned,
                        **m.compute.node_view(n),
                    }
                )
            return out

    def _scheduler_view(self) -> dict:
        s = self.m.scheduler
        return {"algorithm": s.default, "seed": s.seed, "queue": s.queue}

    def _job(self, name: str) -> JobRecord:
        try:
            return self.m.manager.get(name)
        except ManagerError as e:
            raise ApiError(e.status, str(e)) from None

    # --- changes --------------------------------------------------------------------------------
    def _put_node(self, req: Request, node: str) -> dict:
        body = req.json()
        _no_unknown(body, {"schedulable"})
        if node not in self.m.cluster.compute_nodes():
            raise ApiError(404, f"no compute node named '{node}'")
        if not isinstance(body, dict) or not isinstance(body.get("schedulable"), bool):
            raise ApiError(400, 'expected {"schedulable": true|false}')
        with self.m.lock:
            (self.m.cordoned.discard if body["schedulable"] else self.m.cordoned.add)(node)
        self.m.keep_settings()
        self.m.wake()
        return {"node": node, "schedulable": body["schedulable"]}

    def _put_link(self, req: Request, u: str, v: str) -> dict:
        body = req.json()
        _no_unknown(body, {"bw_mbps"})
        if not self.m.cluster.graph.has_edge(u, v):
            raise ApiError(404, f"no link between '{u}' and '{v}'")
        bw = body.get("bw_mbps") if isinstance(body, dict) else None
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not 0 < bw < 1e7:
            raise ApiError(400, f'expected {{"bw_mbps": a number > 0}}, got {body!r}', "bw_mbps")
        self.m.set_link_capacity(u, v, float(bw))
        return {"src": u, "dst": v, "bw_mbps": float(bw)}

    def _put_scheduler(self, req: Request) -> dict:
        body = req.json()
        _no_unknown(body, {"algorithm", "seed", "queue"})
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("algorithm"), str)
            or not isinstance(body.get("seed", 0), int)
            or body.get("seed", 0) < 0
            or not isinstance(body.get("queue", ""), str)
        ):
            raise ApiError(
                400,
                'expected {"algorithm": name, "seed": integer >= 0, "queue": policy (optional)}',
            )
        try:  # not under the Master's lock: the scheduler's process may be in a round
            self.m.scheduler.configure(
                body["algorithm"], body.get("seed", 0), body.get("queue") or "fifo-backfill"
            )
        except UnknownAlgorithm as e:
            raise ApiError(400, str(e), e.field) from None
        self.m.keep_settings()
        return self._scheduler_view()

    def _post_job(self, req: Request) -> tuple[int, dict]:
        body = req.json()
        _no_unknown(body, {"job", "algorithm", "source"})
        if not isinstance(body, dict) or "job" not in body:
            raise ApiError(400, 'expected {"job": {...job mapping...}, "algorithm": optional}')
        try:
            source = str(body.get("source", "<request>"))
            job = parse_job(body["job"], source)
        except JobError as e:
            raise ApiError(400, str(e)) from None
        m = self.m
        try:  # not under the Master's lock: the scheduler's process may be in a round
            algorithm = m.scheduler.resolve(body.get("algorithm"))
        except UnknownAlgorithm as e:
            raise ApiError(400, str(e), e.field) from None
        with m.lock:
            for t in job.tasks:  # waiting would never end: no node, online or not, holds it
                if not any(
                    t.demand.fits_in(m.cluster.capacity(n)) for n in m.cluster.compute_nodes()
                ):
                    d = t.demand
                    raise ApiError(
                        422,
                        f"job '{job.name}': task {t.name} (cpu {d.cpu:g}, "
                        f"mem {d.mem_mb:g} MB, gpu {d.gpu:g}) fits on no node of "
                        f"topology '{m.topo.name}'",
                        "task",
                    )
            try:
                rec = m.manager.submit(job, algorithm, body["job"], source)
                m.scheduler.submitted(job, rec.submitted_at)
            except ManagerError as e:
                raise ApiError(e.status, str(e)) from None
            view = self.job_view(rec)
        m.persist()  # acknowledged means on disk
        m.wake()
        return 201, view

    def _delete_job(self, req: Request, name: str) -> dict:
        try:
            self.m.cancel(name)
        except ManagerError as e:
            raise ApiError(e.status, str(e)) from None
        self.m.persist()
        return self._locked(lambda: self.job_view(self.m.manager.get(name)))


def _result(rec: JobRecord) -> dict | None:
    """Rank 0's end-of-training line of the last attempt (the workload's own figures)."""
    end = rec.last_of("end", rec.job.tasks[0].name)
    return (
        {
            k: end.get(k)
            for k in (
                "reached_target",
                "tta_s",
                "tta_iter",
                "stop_reason",
                "iters",
                "train_s",
                "startup_s",
                "jct_s",
            )
        }
        if end
        else None
    )


def _no_unknown(body: Any, allowed: set[str]) -> None:
    """A 400 naming a field the handler does not read: a typo ("algoritm") is not ignored."""
    unknown = sorted(set(body) - allowed) if isinstance(body, dict) else []
    if unknown:
        raise ApiError(
            400, f"unknown field '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})", unknown[0]
        )


def _msg(cls: type, req: Request, **must: str):
    """A protocol message from the request body; 400 when malformed or inconsistent."""
    try:
        msg = from_json(cls, req.json())
    except ValueError as e:
        raise ApiError(400, str(e)) from None
    for k, v in must.items():
        if getattr(msg, k) != v:
            raise ApiError(
                400, f"{cls.__name__}: field '{k}' is '{getattr(msg, k)}', the URL says '{v}'", k
            )
    return msg
