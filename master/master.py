"""The Master: Manager + Scheduler + Compute Controller + Network Controller, and its control loop.

Threads and the lock: the HTTP server (`api.py`, one thread per request) records registrations,
heartbeats, metric lines and new jobs under `lock` and wakes the *control loop*. The control loop
is the only place that changes a job's life cycle (schedule, launch, tear down, retry, finish,
cancel) and the only one that talks to agents and the SDN app. It decides under the lock and
talks without it: a slow `docker run`, a slow SDN app or a silent agent delays the control loop,
never a heartbeat (which would take healthy nodes offline). The scheduling algorithms run in a
process of their own (`scheduling.SchedulerProcess`): their CPU time would otherwise be
interpreter-lock time the heartbeats wait for (experiments/bench_load.py measures their replies).

The Master holds the cluster view (`cluster`: nodes, links, what every running job uses) and
allocates from it; the Network Controller holds the flows and enforces them.

Closed loop: an agent reports a worker's exit at once (its next heartbeat is sent immediately);
a node whose heartbeats stop for `heartbeat_timeout_s` is taken offline. Either ends the job's
attempt: it is scheduled again on what is left, or fails with the reason. Queued jobs get a
scheduling round on every such event, and when a read of the link statistics changes the
unscheduled traffic the view reserves (a link another tenant filled may be free again).

A job's network (`scheduler.compose`): an enforced decision's flows are installed (SDN paths and
meters, sender tc) and reserved; a best-effort one installs and reserves nothing. Runtime
adjustment (`adjust`): after every read of the link statistics, the enforced jobs whose grants no
longer fit a link (`NetworkController.contended`) get new paths and rates for the placement they
have (`scheduler.paths.route_placement`, on the view with the unscheduled traffic; off the
contended links unless what is left of them is faster, `_reroute`), installed in place — the SDN
app adds the new entries before it removes the old ones. Work-conserving rates
(`spare`): the enforced pairs also share the capacity nobody is granted, re-shared when the grants
change and when unscheduled traffic moves the shares (`NetworkController`); each attempt's info
notes its flows' installed rates as they change (`installed`).
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

from protocol.dilation import NONE, Dilation
from protocol.http import Server
from protocol.messages import Heartbeat, Registration, WorkerSpec, WorkerState
from protocol.tls import Tls
from protocol.worker import RENDEZVOUS_PORT
from scheduler import compose
from scheduler.metrics import predicted_iteration_s
from scheduler.model import ENFORCED, Cluster, Decision, check_decision
from scheduler.paths import NoPath, route_placement
from topologies import Topology

from .api import MasterApi
from .compute import AgentError, ComputeController, NotRegistered, worker_command, worker_image
from .manager import EXIT_BAD_PARAMETERS, TERMINAL, Attempt, JobRecord, Manager, ManagerError
from .network import NetworkController, NetworkState, SdnApi
from .scheduling import SchedulerProcess, UnknownAlgorithm, expected_end
from .store import Changes, StateError, Store, take_changes, take_lines

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MasterConfig:
    algorithm: str = "network-aware"  # the default single-job scheduler
    queue: str = "fifo-backfill"  # the queue policy (scheduler.multi)
    seed: int = 0
    image: str = ""  # worker image for jobs that name none
    heartbeat_timeout_s: float = 6.0  # silence after which a node is offline
    max_attempts: int = 2  # placements per job before it fails
    tick_s: float = 0.5  # control loop period
    links_poll_s: float = 2.0  # how often the SDN app's link statistics are read
    first_port: int = RENDEZVOUS_PORT  # rendezvous ports: one per attempt, counting up
    adjust: bool = True  # re-route enforced jobs whose grants no longer fit (runtime adjustment)
    spare: bool = True  # work-conserving rates: enforced pairs share the capacity nobody is granted
    # The emulation's time dilation (protocol.dilation): the Master's clock runs K times slower
    # than the host's, so its periods and timeouts above are emulated seconds and every time it
    # records (submission, start, end, events) is on the emulated clock the workers report on.
    dilation: Dilation = NONE


class Master:
    def __init__(
        self,
        topo: Topology,
        config: MasterConfig = MasterConfig(),
        sdn: SdnApi | None = None,
        sdn_job_id: str = "ces",
        token: str | None = None,
        state: str | None = None,
        tls: Tls | None = None,
    ):
        """`token`: the deployment's shared secret, required of the API's callers and sent to
        the agents (kept out of `config`, which results record). `tls`: the control machine's
        identity: the API serves over mutual TLS with it, and the agents are called with it. `state`: a file (SQLite) that
        keeps every job; a Master started on an existing one takes its jobs over."""
        self.topo, self.cfg, self.sdn, self._token = topo, config, sdn, token
        self._tls = tls
        self.lock = threading.RLock()
        self.cluster = Cluster.from_topology(topo)
        self.clock = config.dilation.time
        self.manager = Manager(config.max_attempts, clock=self.clock)
        self.compute = ComputeController(
            config.heartbeat_timeout_s, clock=self.clock, token=token, tls=tls
        )
        self.network = NetworkController(
            topo, self.cluster, self.compute, sdn, sdn_job_id, spare=config.spare
        )
        self.scheduler = SchedulerProcess(config.algorithm, config.seed, config.queue)
        self.cordoned: set[str] = set()
        self.capacities: dict[tuple[str, str], float] = {}  # links whose capacity was set
        self.worker_job: dict[str, str] = {}  # every worker ever started -> its job
        self._unsaved_lines: list[tuple[str, str, dict]] = []  # (job, worker, line) not on disk
        # Metric lines counted as they arrive, and how many of them are on disk (`persist_lines`)
        self._lines_seen = self._lines_durable = 0
        self._lines_writing = False
        self._lines_written = threading.Condition()
        self._ports = itertools.count(config.first_port)
        self._events: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._dirty = True
        self._network_changed = False  # released flows not pushed yet (`_push_changes`)
        self._thread: threading.Thread | None = None
        self.server: Server | None = None
        self._adopting: float | None = None  # when restored jobs began waiting for their agents
        self._last_poll: float | None = None  # when the link statistics were last read
        try:
            self.store = Store(state) if state else None
            if self.store:
                self._restore()
        except BaseException:
            self.scheduler.close()
            raise

    # --- life ----------------------------------------------------------------------------------
    def _restore(self) -> None:
        """Take over the stored jobs: queued ones queue again; active ones keep their attempt —
        resources, flows, rendezvous port — and their workers, which the agents keep when they
        register (the registration reply names them); a node of theirs that does not come back
        within the heartbeat timeout ends the attempt (`_check_heartbeats`). The operator's
        settings (`keep_settings`) apply again."""
        now, last_port = self.clock(), self.cfg.first_port - 1
        settings = self.store.settings()
        try:
            if "scheduler" in settings:
                sch = settings["scheduler"]
                try:
                    self.scheduler.configure(sch["algorithm"], sch["seed"], sch["queue"])
                except UnknownAlgorithm as e:  # e.g. its checkpoint is gone: say so, keep ours
                    log.warning(
                        "state %s: the stored scheduler cannot be used (%s); using %s",
                        self.store.path,
                        e,
                        self.scheduler.default,
                    )
            self.cordoned = set(settings.get("cordoned", [])) & set(self.cluster.compute_nodes())
            for u, v, bw in settings.get("capacities", []):
                if self.cluster.graph.has_edge(u, v):
                    self.capacities[(u, v)] = float(bw)
                    self.network.set_capacity(u, v, float(bw))
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"state file {self.store.path}: a setting: {e!r}") from None
        for rec in self.store.load():
            self.manager.adopt(rec)
            for attempt in rec.attempts:
                self.worker_job.update(dict.fromkeys(attempt.workers.values(), rec.name))
                last_port = max(last_port, attempt.master_port)
            if rec.state in TERMINAL:
                continue
            self.scheduler.submitted(rec.job, rec.submitted_at)
            if rec.current is not None:
                decision = rec.current.decision
                self.cluster.allocate(rec.job, decision)
                if decision.network == ENFORCED:
                    self.network.add(rec.job, decision)
                for w in rec.current.workers.values():
                    self.compute.started[w] = now  # missing from its agent past the grace: ended
                self._adopting = now
            rec.log(now, "taken over by a restarted Master")
        self._ports = itertools.count(last_port + 1)
        log.info(
            "state %s: %d jobs (%d active)",
            self.store.path,
            len(self.manager.jobs),
            len(self.manager.active()),
        )

    def persist(self) -> None:
        """Write the job records that changed and the metric lines that arrived (no-op without a
        state file)."""
        if self.store is not None:
            self._write(docs=True)

    def persist_lines(self, upto: int) -> None:
        """Have the first `upto` metric lines that arrived on disk: what a heartbeat must have
        before it is answered. Group commit: one heartbeat at a time writes every line that
        arrived, and those that brought lines meanwhile wait for its write (or the next) instead
        of each queueing for a transaction of its own; the records that changed are left to the
        control loop's `persist`, not serialised under the lock here."""
        if self.store is None:
            return
        with self._lines_written:
            while self._lines_durable < upto and self._lines_writing:
                self._lines_written.wait()
            if self._lines_durable >= upto:
                return
            self._lines_writing = True
        try:
            self._write(docs=False)
        finally:
            with self._lines_written:
                self._lines_writing = False
                self._lines_written.notify_all()

    def _write(self, docs: bool) -> None:
        taken = 0

        def take() -> Changes:
            nonlocal taken
            with self.lock:
                taken = self._lines_seen
                return (
                    take_changes(self.manager.jobs.values(), self._unsaved_lines)
                    if docs
                    else take_lines(self._unsaved_lines)
                )

        self.store.write(take)
        with self._lines_written:
            self._lines_durable = max(self._lines_durable, taken)
            self._lines_written.notify_all()

    def keep_settings(self) -> None:
        """Write what an operator set through the API — the scheduler, the cordoned nodes, link
        capacities — before the API answers (no-op without a state file): a restarted Master
        schedules as it was told to."""

        def take() -> Changes:
            with self.lock:
                s = self.scheduler
                return Changes(
                    [],
                    [],
                    {
                        "scheduler": {"algorithm": s.default, "seed": s.seed, "queue": s.queue},
                        "cordoned": sorted(self.cordoned),
                        "capacities": [
                            [u, v, bw] for (u, v), bw in sorted(self.capacities.items())
                        ],
                    },
                )

        if self.store is not None:
            self.store.write(take)

    def start(self, host: str = "127.0.0.1", port: int = 0) -> Master:
        if self._adopting is not None and self.sdn is not None:
            with self.lock:  # the SDN app holds the flows still; make sure it holds these
                state = self._desired()
            self._push_quietly(state)
        self.server = Server(MasterApi(self, self._token).app, host, port, self._tls).start()
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
        if self.store:
            self.persist()
            self.store.close()
        self.scheduler.close()

    def wake(self) -> None:
        self._dirty = True
        self._events.put(("wake",))

    def unschedulable(self) -> set[str]:
        """The nodes no job may be placed on: those not online (the Compute Controller's
        heartbeats say which) and those an operator cordoned. Derived at each use, never kept in
        the cluster view: the view the algorithms decide on marks them offline
        (`NetworkController.view`)."""
        nodes = set(self.cluster.compute_nodes())
        return (nodes - self.compute.online()) | self.cordoned

    # --- the control loop ----------------------------------------------------------------------
    def _loop(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            events = []
            try:
                events.append(
                    self._events.get(timeout=self.cfg.dilation.host_seconds(self.cfg.tick_s))
                )
                while True:
                    events.append(self._events.get_nowait())
            except queue.Empty:
                pass
            for ev in events:
                self._guarded(self._handle, ev)
            self._guarded(self._check_heartbeats)
            if self.sdn is not None and self.cfg.dilation.monotonic() >= next_poll:
                next_poll = self.cfg.dilation.monotonic() + self.cfg.links_poll_s
                self._guarded(self._poll_links)
                if self.cfg.adjust:
                    self._guarded(self._adjust)
            if self._dirty:
                self._dirty = False
                self._guarded(self._schedule)
            self._guarded(self._push_changes)
            self._guarded(self.persist)

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
            with self.lock:
                state = self._desired()
            self.network.resync(ev[1], state)
            self._dirty = True
        elif kind == "cancel":
            self._cancel(ev[1], ev[2])

    def _check_heartbeats(self) -> None:
        with self.lock:
            stale = self.compute.stale()
            for node, _ in stale:
                self.compute.mark_offline(node)
            now = self.clock()
            if self._adopting is not None and now - self._adopting > self.cfg.heartbeat_timeout_s:
                placed = {
                    n for r in self.manager.active() for n in r.current.decision.placement.values()
                }
                # never came back (not online, so `unschedulable` already leaves them out)
                for node in sorted(placed - set(self.compute.agents)):
                    stale.append((node, now - self._adopting))
                self._adopting = None
        for node, silent in stale:
            log.warning("node %s stopped heartbeating (%.1f s)", node, silent)
            with self.lock:
                affected = self.manager.on_node(node)
            for rec in affected:
                self._fail_attempt(
                    rec,
                    f"node {node} stopped heartbeating (silent for {silent:.1f} s)",
                    retryable=True,
                )
            self._dirty = True

    def _poll_links(self) -> None:
        """Read the link statistics and the scheduled pairs' counters; push again when the spare
        capacity's shares moved (`NetworkController.observe`)."""
        read_at = time.monotonic()  # the host's: only its order against a pair's end matters
        links, flows = self.network.read_usage()
        with self.lock:
            # Jobs waiting for bandwidth were judged on the last reading; the traffic that filled
            # a link may be gone (a job that just ended is measured as another tenant's until
            # its counters stop): another round on this reading, or they wait for an event that
            # may never come. Only while jobs wait: every poll would otherwise pay for it.
            waiting = bool(self.manager.queued())
            before = self.network.unscheduled() if waiting else None
            moved = self.network.observe(links, flows, read_at)
            if waiting and self.network.unscheduled() != before:
                self._dirty = True
            self._note_contention()
            if not moved:
                return
            state = self._desired()
        self._push_quietly(state)

    def _note_contention(self) -> None:
        """Note (under the lock), per enforced attempt, when its flows cross a contended link and
        when they stop: {"contended": [[since, t, ["src>dst", ...]], ...]} — the set changed
        between the readings of the link statistics at `since` and `t` — the seconds in which
        another tenant's traffic or a link's loss left its grants more than the link holds: what
        judging a flow's rate against its grant leaves out (docs/e2e.md, "Results")."""
        now = self.clock()
        since, self._last_poll = self._last_poll or now, now
        hot = self.network.contended_flows()
        for rec in self.manager.active():
            if rec.current.info.get("network") != ENFORCED:
                continue
            history = rec.current.info.setdefault("contended", [])
            flows = hot.get(rec.name, [])
            if flows != (history[-1][2] if history else []):
                history.append([since, now, flows])
                rec.changed = True

    def _desired(self) -> NetworkState:
        """What the network should hold (under the lock), each enforced attempt's installed
        rates noted when they change: {"installed": [[t, {"src>dst": Mbit/s}], ...]}."""
        state = self.network.desired()
        now = self.clock()
        installed = self.network.installed()
        for rec in self.manager.active():
            if rec.current.info.get("network") != ENFORCED:
                continue
            history = rec.current.info.setdefault("installed", [])
            rates = installed.get(rec.name)
            if rates and (not history or history[-1][1] != rates):
                history.append([now, rates])
                rec.changed = True
        return state

    # --- scheduling ----------------------------------------------------------------------------
    def _schedule(self) -> None:
        """One round of the queue policy per single-job algorithm in use (jobs may name their
        own), in submit order; each job it starts is pinned to the node pairs' paths, checked
        again, and launched; the others wait with the reason. The algorithms decide on a copy of
        the view, outside the lock."""
        with self.lock:  # the HTTP threads add jobs meanwhile
            queued = self.manager.queued()
        for algorithm in dict.fromkeys(r.algorithm for r in queued):
            recs = {r.name: r for r in queued if r.algorithm == algorithm}
            with self.lock:
                view = self.network.view(self.unschedulable())
                running = [
                    (
                        r.job,
                        r.current.decision,
                        expected_end(
                            r.current.started_at,
                            r.job,
                            r.current.info.get("predicted_iteration_s", math.inf),
                        ),
                    )
                    for r in self.manager.active()
                ]
            try:
                placed, reasons = self.scheduler.round(
                    view, algorithm, list(recs), running, self.clock()
                )
            except Exception as e:  # the algorithm itself broke: say so, do not retry forever
                log.exception("scheduler %s failed", algorithm)
                with self.lock:
                    for rec in recs.values():
                        self.manager.reject(
                            rec, f"scheduler {algorithm} failed: {type(e).__name__}: {e}"
                        )
                        self.scheduler.finished(rec.name)
                continue
            self._launch([(recs[p.job], p.decision) for p in placed])
            with self.lock:
                for name, why in reasons.items():
                    self.manager.wait(recs[name], why)

    def _launch(self, placed: list[tuple[JobRecord, Decision]]) -> None:
        """Start a round's jobs: pin, check and allocate each under the lock; install the
        enforced ones' flows in one push (a refusal is then traced to its jobs, one push each);
        then start the workers, outside the lock."""
        launched = [rec for rec, decision in placed if self._allocate(rec, decision)]
        enforced = [rec for rec in launched if rec.current.decision.network == ENFORCED]
        refused: dict[str, Exception] = {}
        if enforced:
            with self.lock:
                state = self._desired()
            try:
                self.network.push(state)
                self._network_changed = False
            except Exception:
                refused = self._install_one_by_one(enforced)
        for rec in launched:
            if rec.name in refused:
                with self.lock:
                    self._release(rec.name)
                    self.manager.end_attempt(
                        rec, f"the network refused the flows: {refused[rec.name]}", retryable=False
                    )
                    self.scheduler.finished(rec.name)
                self._network_changed = True
            else:
                self._start_workers(rec)

    def _allocate(self, rec: JobRecord, decision: Decision) -> bool:
        """Pin the decision to the node pairs' paths, check it on the view, start an attempt and
        allocate (the flows join the Network Controller's state, not the network yet). False
        when it no longer fits (the job waits with the reason)."""
        job = rec.job
        enforced = decision.network == ENFORCED
        with self.lock:
            view = self.network.view(self.unschedulable())
            if enforced:
                decision = self.network.pin(decision)
            problems = check_decision(view, job, decision)
            if problems:
                self.manager.wait(rec, f"sharing a node pair's path: {problems[0]}")
                return False
            names = {t.name: f"{job.name}-{t.name}-a{len(rec.attempts) + 1}" for t in job.tasks}
            port = next(self._ports)
            attempt = self.manager.start_attempt(rec, decision, names, port)
            attempt.info.update(
                predicted_iteration_s=predicted_iteration_s(view, job, decision),
                decision_s=decision.decision_s,
                network=decision.network,
                adjustable=enforced and compose.adjustable(rec.algorithm),
                adjustments=[],
            )
            self.worker_job.update(dict.fromkeys(names.values(), job.name))
            self.cluster.allocate(job, decision)
            if enforced:
                self.network.add(job, decision)
        return True

    def _install_one_by_one(self, launches: list[JobRecord]) -> dict[str, Exception]:
        """After a push of several new jobs' flows was refused: push them again one job at a
        time; the jobs whose push is refused, with the refusal (their flows are forgotten)."""
        with self.lock:
            for rec in launches:
                self.network.forget(rec.name)
        refused = {}
        for rec in launches:
            with self.lock:
                self.network.add(rec.job, rec.current.decision)
                state = self._desired()
            try:
                self.network.push(state)
            except Exception as e:
                refused[rec.name] = e
                with self.lock:
                    self.network.forget(rec.name)
        return refused

    def _start_workers(self, rec: JobRecord) -> None:
        job = rec.job
        with self.lock:
            attempt = rec.current
            agents = {
                t.name: self.compute.agents[attempt.decision.placement[t.name]].reg
                for t in job.tasks
            }
        names, port = attempt.workers, attempt.master_port
        rank0 = agents[job.tasks[0].name]
        for rank, task in enumerate(job.tasks):
            agent = agents[task.name]
            try:
                command = worker_command(
                    job, rank, rank0.ip, port, agent.iface, self.scheduler.seed
                )
            except ValueError as e:
                self._fail_attempt(rec, str(e), retryable=False)
                return
            spec = WorkerSpec(
                names[task.name],
                job.name,
                task.name,
                worker_image(job.image, self.cfg.image),
                command,
                task.demand.cpu,
                task.demand.mem_mb,
            )
            try:
                self.compute.start_worker(agent.node, spec)
            except AgentError as e:
                self._fail_attempt(
                    rec, f"could not start {task.name} on {agent.node}: {e}", retryable=True
                )
                return
        with self.lock:
            self.manager.mark_running(rec)

    # --- runtime adjustment --------------------------------------------------------------------
    def _adjust(self) -> None:
        """Re-route the enforced jobs whose grants no longer fit a link (module doc)."""
        with self.lock:
            hot = self.network.contended()
            if not hot:
                return
            moved = self._reroute(hot)
            if not moved:
                return
            for rec, _ in moved:
                self._release(rec.name)
            # Recorded with the change, before the push: nobody sees the network moved and the
            # job's record not saying so.
            now = self.clock()
            for rec, decision in moved:
                self.cluster.allocate(rec.job, decision)
                self.network.add(rec.job, decision)
                rec.current.decision = decision
                where = ", ".join(
                    f"{f.src}->{f.dst} {'-'.join(f.path[1:-1])} {f.rate_mbps:.1f}"
                    for f in decision.flows
                )
                rec.current.info["adjustments"].append(
                    {"at": now, "links": sorted(f"{u}>{v}" for u, v in hot), "flows": where}
                )
                rec.log(
                    now,
                    f"re-routed ({', '.join(sorted(f'{u}>{v}' for u, v in hot))} "
                    f"contended): {where}",
                )
            state = self._desired()
        self._push_quietly(state)

    def _reroute(self, hot: set[tuple[str, str]]) -> list[tuple[JobRecord, Decision]]:
        """New paths and rates for the adjustable jobs that use a `hot` link, and for those that
        share a node pair with them (one path per pair), on the view with the unscheduled
        traffic; the others' pairs keep their paths. Off the hot links where another path
        exists (the unscheduled traffic there is elastic: what was measured is only what it got
        beside the grants), unless what is left of them gives the shorter predicted iteration.
        Only jobs whose paths change or whose grants must shrink by more than 5 %: a grant is
        never raised here (the spare already gives a job what is free), or the counters, read
        at slightly different moments, would swing it up and down at every poll."""

        def uses(rec: JobRecord, links: set) -> bool:
            return any(lk in links for f in rec.current.decision.flows for lk in f.directed_links())

        adjustable = [r for r in self.manager.active() if r.current.info.get("adjustable")]
        affected = {r.name for r in adjustable if uses(r, hot)}
        grew = True
        while grew:  # the closure over shared node pairs
            pairs = {
                (f.path[0], f.path[-1])
                for r in adjustable
                if r.name in affected
                for f in r.current.decision.flows
            }
            more = {
                r.name
                for r in adjustable
                if any((f.path[0], f.path[-1]) in pairs for f in r.current.decision.flows)
            }
            grew = not more <= affected
            affected |= more
        view = self.network.view(self.unschedulable(), without=affected)
        fixed = {
            pair: p.path
            for pair, p in self.network.pairs.items()
            if not {job for job, _, _ in p.shares} & affected
        }
        moved = []
        for rec in sorted((r for r in adjustable if r.name in affected), key=lambda r: r.name):
            old = rec.current.decision
            # off the hot links (`avoid`), or staying on them (the view itself, which keeps
            # 1 - GRANTABLE of every link: the room TCP's competition needs beside the grants)
            avoid = view.copy(share_graph=True)
            for link in hot:
                avoid.reserved[link] = avoid.reserved.get(link, 0.0) + avoid.residual(*link)
            options = []
            for cluster in (avoid, view):
                try:
                    flows = route_placement(cluster, rec.job, old.placement, fixed=fixed)
                except NoPath as e:
                    reason = e
                    continue
                new = Decision(old.job, dict(old.placement), flows, old.decision_s, old.network)
                options.append((predicted_iteration_s(view, rec.job, new), len(options), new))
            if not options:
                log.warning("job %s keeps its paths: %s", rec.name, reason)
                continue
            # Off the hot links unless what is left of them is faster: a detour over a thin
            # link would cost the job more than sharing the contended one.
            new = min(options)[2]
            view.allocate(rec.job, new)  # unmoved, it keeps its paths: the same links taken
            for f in new.flows:
                fixed.setdefault((f.path[0], f.path[-1]), f.path)
            before = {(f.src, f.dst): (f.path, f.rate_mbps) for f in old.flows}
            if any(
                before[(f.src, f.dst)][0] != f.path
                or f.rate_mbps < 0.95 * before[(f.src, f.dst)][1]
                for f in new.flows
            ):
                moved.append((rec, new))
        return moved

    def set_link_capacity(self, u: str, v: str, bw_mbps: float) -> None:
        """An operator or monitoring reports a link's new capacity; the next adjustment sees
        it, and new decisions use it."""
        with self.lock:
            self.capacities[min(u, v), max(u, v)] = bw_mbps  # a link, both directions
            self.network.set_capacity(u, v, bw_mbps)
        self.keep_settings()
        self.wake()

    def _release(self, job_name: str) -> None:
        """Free a job's resources and flows in the view (under the lock)."""
        if job_name in self.cluster.jobs:
            self.cluster.release(job_name)
        self.network.forget(job_name)

    def _push_quietly(self, state: NetworkState) -> None:
        try:
            self.network.push(state)
        except Exception as e:  # the SDN app refused a removal: its next push retries
            log.warning("the network did not take the change: %s", e)

    def _teardown(self, rec: JobRecord, attempt: Attempt) -> None:
        """Stop an ended attempt's workers (those on silent nodes are stopped when their agent
        answers again) and free its network share and resources."""
        for task, name in attempt.workers.items():
            self.compute.stop_worker(attempt.decision.placement[task], name)
        with self.lock:
            self._release(rec.name)
        self._network_changed = True

    def _push_changes(self) -> None:
        """Push what the teardowns of this pass of the control loop released: once per pass,
        not once per job (a burst of jobs ending would push, and re-share the spare, per job)."""
        if self._network_changed:
            self._network_changed = False
            with self.lock:
                state = self._desired()
            self._push_quietly(state)

    def _fail_attempt(self, rec: JobRecord, reason: str, retryable: bool) -> None:
        with self.lock:  # recorded first: the time of the event is when it was noticed
            attempt = rec.current
            if attempt is None:
                return
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
            attempt = rec.current
            done = (
                w.state == "exited"
                and w.exit_code == 0
                and all(
                    self._exited_ok(attempt.decision.placement[t], n)
                    for t, n in attempt.workers.items()
                )
            )
            if done:
                self.manager.finish(rec)
                self.scheduler.finished(rec.name)
        if w.state == "exited" and w.exit_code == 0:
            if done:
                self._teardown(rec, attempt)
                self._dirty = True
            return
        what = f"exited with code {w.exit_code}" if w.state == "exited" else "disappeared"
        detail = f" ({w.detail})" if w.detail else ""
        self._fail_attempt(
            rec,
            f"worker {task} on {node} {what}{detail}",
            retryable=w.exit_code != EXIT_BAD_PARAMETERS,
        )

    def _exited_ok(self, node: str, worker: str) -> bool:
        st = self.compute.agents[node].workers.get(worker)
        return st is not None and st.state == "exited" and st.exit_code == 0

    def _cancel(self, name: str, done: Future) -> None:
        try:
            with self.lock:
                rec = self.manager.get(name)
                attempt = rec.current
                self.manager.cancel(rec)
                self.scheduler.finished(rec.name)
            if attempt is not None:
                self._teardown(rec, attempt)
                self._push_changes()  # the user's answer comes with the job's flows gone
            done.set_result(name)
        except ManagerError as e:
            done.set_exception(e)
        self._dirty = True

    def cancel(self, name: str, timeout_s: float = 60.0) -> None:
        """Cancel a job through the control loop (it owns the life cycle); ManagerError if the
        job is unknown or already over."""
        done: Future = Future()
        self._events.put(("cancel", name, done))
        done.result(timeout=timeout_s)

    # --- the agents' side (called by the HTTP threads: record and wake, nothing else) -----------
    def register(self, reg: Registration) -> dict[str, int]:
        """Record an agent; the workers the Master expects it to run, each with the number of
        its metric lines the Master holds (a restarted agent sends the rest)."""
        with self.lock:
            self.compute.register(reg)
            held = {
                w: len(self.manager.worker_owner(w)[0].records.get(w, []))
                for w in self.manager.expected_workers(reg.node)
            }
        log.info("agent %s registered from %s", reg.node, reg.url)
        self._events.put(("node_up", reg.node))
        return held

    def heartbeat(self, hb: Heartbeat) -> list[str]:
        """Record a heartbeat; the workers the agent should stop."""
        with self.lock:
            if hb.node not in self.compute.agents:
                raise NotRegistered(hb.node)
            expected = set(self.manager.expected_workers(hb.node))
            came_back, ended = self.compute.heartbeat(hb, expected)
            for line in hb.records:
                job = self.worker_job.get(line.get("worker", ""))
                if job in self.manager.jobs:
                    rec = self.manager.jobs[job]
                    rec.records.setdefault(line["worker"], []).append(line)
                    if self.store:
                        self._unsaved_lines.append((job, line["worker"], line))
                        self._lines_seen += 1
            upto = self._lines_seen
            stop = self.compute.unwanted(hb.node, expected)
        if hb.records:  # on disk before the answer: the agent forgets what we acknowledge
            self.persist_lines(upto)
        for w in ended:
            self._events.put(("ended", hb.node, w))
        if came_back:
            log.info("node %s is back", hb.node)
            self._events.put(("node_up", hb.node))
        return stop
