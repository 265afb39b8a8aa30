"""A discrete-event, flow-level simulator of training jobs sharing an edge network.

What happens in simulated time:
  - jobs arrive and wait in a queue; a *queue policy* (multi.py: CES-Multi, FIFO, SJF, ...) picks
    which to start, each placed by a *single-job algorithm* (the registry of baselines.py,
    CES-PPO): the very objects that run on the testbed;
  - a running job does `job.iterations` iterations, each as long as the shared iteration-time
    model says (`metrics.predicted_iteration_s`) at the rates its flows actually get *now*; when
    rates change the job keeps its progress and goes on at the new pace (fluid model);
  - metered flows (the granted rate, which the testbed enforces with OpenFlow meters) get their
    granted rate — scaled down in proportion only where a link's capacity drops below what is
    granted on it; background traffic takes what the grants leave, so it slows no metered job.
    Where a link shrinks below its grants, the running enforced jobs on it get new paths and
    rates for their placement (the Master's runtime adjustment; `SimConfig.adjust`);
    With `SimConfig.metered` off (plain TCP, nothing enforced) every job flow and every
    background flow shares the links' capacity by max-min fairness (`paths.fair_rates`, elastic
    flows, background flows capped at their demand);
  - nodes leave and join (seed 001's tidal availability, seed 003's registration), links change
    capacity, background flows come and go; the jobs on a node that leaves are re-queued (keeping
    their progress, as after a checkpoint, and paying `restart_overhead_s`) or failed.

Queue policies see the world through a `Round` (`rounds.py`), as they do on the live Master.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from .metrics import bandwidth_satisfaction, node_utilisation, packable, predicted_iteration_s
from .model import ENFORCED, Cluster, Job, Resources, placement_key
from .paths import NoPath, fair_rates, route_placement, shortest_path
from .perfmodel import IterationModel
from .rounds import JobState, QueuePolicy, Round, State, estimated_iteration_s

# --- scenario events (besides job arrivals) -----------------------------------------------------


@dataclass(frozen=True)
class NodeLeave:
    time: float
    node: str


@dataclass(frozen=True)
class NodeJoin:
    time: float
    node: str


@dataclass(frozen=True)
class LinkChange:
    """Link u–v gets capacity `bw_mbps` (each direction)."""

    time: float
    u: str
    v: str
    bw_mbps: float


@dataclass(frozen=True)
class BackgroundFlow:
    """Unscheduled traffic from compute node `src` to `dst` over `path` (default: a shortest path)
    for `duration_s`, taking up to `demand_mbps` (inf: whatever max-min fairness leaves it)."""

    time: float
    src: str
    dst: str
    duration_s: float
    demand_mbps: float = math.inf
    path: tuple[str, ...] | None = None


ScenarioEvent = NodeLeave | NodeJoin | LinkChange | BackgroundFlow


# --- the simulator ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimConfig:
    model: IterationModel = IterationModel()
    on_node_loss: Literal["requeue", "fail"] = "requeue"
    restart_overhead_s: float = 10.0  # a re-queued or preempted job reloads its checkpoint
    metered: bool = True  # False: no job flow is metered, all share max-min (plain TCP)
    adjust: bool = True  # runtime adjustment: re-route enforced jobs off a link shrunk below them
    until: float = math.inf  # stop simulated time here


# Order of simultaneous events: resources are freed before new demands come in.
_FINISH, _BG_END, _INFRA, _BG_START, _ARRIVAL, _TICK = range(6)


@dataclass
class SimResult:
    jobs: list[JobState]
    end_time: float
    job_events: int  # arrivals, starts, completions, failures, re-queues
    wall_s: float
    balance_std: float  # time average of the std of node utilisation across online nodes
    # ... only up to the last arrival: the drain after it is as long as the policy left the
    # longest jobs for last, so whole-run averages cover windows of different lengths
    balance_std_arrivals: float
    # ... only while a job waits in the queue (None if none ever did), and the share of the run
    # with one waiting: a policy that keeps a backlog keeps every node full, which alone lowers
    # the std, so balance is compared where placement has a choice to make
    balance_std_queued: float | None
    queued_share: float
    utilisation: float  # time average of the mean node utilisation
    starts: list[
        tuple[float, str, tuple[tuple[str, str], ...]]
    ]  # (time, job, placement): the schedule

    @property
    def events_per_s(self) -> float:
        return self.job_events / self.wall_s if self.wall_s > 0 else math.inf

    def summary(self) -> dict[str, float | None]:
        """The multi-job figures of one run.

        Waits count every queued period (re-queues too); a job still waiting at the end counts
        with the wait it has so far (censored: starvation shows). JCT and slowdown are over
        finished jobs; slowdown = JCT / (iterations × `estimated_iteration_s`), and fairness is
        Jain's index of the slowdowns, (Σx)² / (n·Σx²). The deadline hit rate is over jobs with
        a deadline (unfinished ones miss); None when no job has one. The deadline satisfaction
        ratio (seed 001's) is over every *submitted* job with a deadline: jobs rejected on arrival
        miss too. Migrations per job: runs on another placement than the job's previous run
        (re-allocation, preemption or a node leaving), per job not rejected.
        """
        jobs = [js for js in self.jobs if js.state != "rejected"]
        waits = sorted(js.wait(self.end_time) for js in jobs)
        done = [js for js in jobs if js.state == "finished"]
        jct = [js.finish - js.submit for js in done]
        slow = [
            (js.finish - js.submit) / (js.job.iterations * estimated_iteration_s(js.job))
            for js in done
        ]
        due = [js for js in jobs if js.job.deadline is not None]
        hits = sum(
            js.state == "finished" and js.finish <= js.submit + js.job.deadline + 1e-9 for js in due
        )
        submitted_due = sum(js.job.deadline is not None for js in self.jobs)
        started = [js for js in jobs if js.first_start is not None]
        decisions = [d for js in jobs for d in js.decision_s]
        out = {
            "jobs": len(self.jobs),
            "finished": len(done),
            "rejected": len(self.jobs) - len(jobs),
            "failed": sum(js.state == "failed" for js in jobs),
            "unfinished": sum(js.state in ("queued", "running") for js in jobs),
            "avg_wait_s": statistics.fmean(waits) if waits else 0.0,
            "p95_wait_s": waits[min(len(waits) - 1, math.ceil(0.95 * len(waits)) - 1)]
            if waits
            else 0.0,
            "max_wait_s": waits[-1] if waits else 0.0,
            "jct_s": statistics.fmean(jct) if jct else None,
            "bw_satisfaction": statistics.fmean(js.bw_satisfaction for js in started)
            if started
            else None,
            "balance_std": self.balance_std,
            "balance_std_arrivals": self.balance_std_arrivals,
            "balance_std_queued": self.balance_std_queued,
            "queued_share": self.queued_share,
            "utilisation": self.utilisation,
            "fairness": sum(slow) ** 2 / (len(slow) * sum(x * x for x in slow)) if slow else None,
            "deadline_hit_rate": hits / len(due) if due else None,
            "deadline_satisfaction": hits / submitted_due if submitted_due else None,
            "preemptions": sum(js.preemptions for js in jobs),
            "migrations_per_job": sum(js.migrations for js in jobs) / len(jobs) if jobs else 0.0,
            "makespan_s": self.end_time - min((js.submit for js in self.jobs), default=0.0),
            "decision_ms": 1000 * statistics.fmean(decisions) if decisions else 0.0,
            "job_events": self.job_events,
            "events_per_s": self.events_per_s,
        }
        return {k: v if v is None else float(v) for k, v in out.items()}


class Simulator:
    """Runs one scenario: `Simulator(cluster, policy).run(jobs, events)`. The cluster is mutated
    (pass a copy to keep the original)."""

    def __init__(self, cluster: Cluster, policy: QueuePolicy, config: SimConfig = SimConfig()):
        self.cluster, self.policy, self.config = cluster, policy, config

    def run(self, jobs: Iterable[Job], events: Iterable[ScenarioEvent] = ()) -> SimResult:
        wall = time.perf_counter()
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self.states: list[JobState] = []
        self.queue: list[JobState] = []
        self.running: dict[str, JobState] = {}
        self.epoch = 0
        self.job_events = 0
        self.starts: list = []
        self._bg: dict[int, tuple[tuple[str, ...], float]] = {}  # id -> (path, demand)
        self._net_dirty = self._links_changed = False
        self._tick_pending = False
        self._clock: float | None = None
        self._clock_start: float | None = None  # the first event's time: metrics start here
        self._balance_area = self._util_area = self._arrivals_area = 0.0
        self._queued_area = self._queued_time = 0.0
        self._last_arrival = max((j.submit_time for j in jobs), default=0.0)
        self._balance: tuple[float, float] | None = None  # (std, mean) of _util, when fresh
        self._util = {
            n: node_utilisation(self.cluster, n)  # Ū_n of the online nodes
            for n in self.cluster.compute_nodes(online_only=True)
        }
        self._open = 0  # jobs not yet finished, failed or rejected
        self._packable: dict[tuple, bool] = {}  # task demands -> fits the empty cluster
        for i, job in enumerate(sorted(jobs, key=lambda j: j.submit_time)):
            if not job.iterations or job.iterations <= 0:
                raise ValueError(f"job {job.name}: the simulator needs 'iterations' > 0")
            self.states.append(JobState(job, i))
            self._open += 1
            self._push(job.submit_time, _ARRIVAL, self.states[-1])
        for ev in events:
            self._push(ev.time, _BG_START if isinstance(ev, BackgroundFlow) else _INFRA, ev)

        while self._heap:
            now, kind, _, payload = self._heap[0]
            if kind == _FINISH and payload[0].version != payload[1]:
                heapq.heappop(self._heap)  # superseded when the job's pace changed
                continue
            if now > self.config.until:
                break
            self._integrate(now)
            self.now = now
            wake = False
            while self._heap and self._heap[0][0] == now:
                _, kind, _, payload = heapq.heappop(self._heap)
                wake |= self._handle(kind, payload)
            if wake and (self.queue or getattr(self.policy, "reallocates", False)):
                self._round()
            if self._net_dirty:
                self._refresh_rates()
            if self._open == 0:
                break  # every job finished, failed or was rejected: the rest is scenery
        end = self.config.until if self._open and self._heap else self.now
        self._integrate(end)
        self.now = end
        start = self._clock_start if self._clock_start is not None else end
        span, arrivals_span = end - start, min(end, self._last_arrival) - start
        balance = self._balance_area / span if span > 0 else 0.0
        return SimResult(
            self.states,
            end,
            self.job_events,
            time.perf_counter() - wall,
            balance,
            self._arrivals_area / arrivals_span if arrivals_span > 0 else balance,
            self._queued_area / self._queued_time if self._queued_time > 0 else None,
            self._queued_time / span if span > 0 else 0.0,
            self._util_area / span if span > 0 else 0.0,
            self.starts,
        )

    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    def _handle(self, kind: int, payload) -> bool:
        """Apply one event; True if it may let a waiting job start."""
        if kind == _ARRIVAL:
            return self._arrive(payload)
        if kind == _FINISH:
            js, version = payload
            if js.version != version:
                return False
            self._advance(js)
            self._stop(js, "finished")
            return True
        if kind == _TICK:
            self._tick_pending = False
            self._ensure_tick()
            return True
        if kind == _BG_START:
            if not self.config.metered:  # metered job flows keep their grants whatever it does
                path = payload.path or shortest_path(self.cluster, payload.src, payload.dst)
                self._bg[self._seq] = (tuple(path), payload.demand_mbps)
                self._push(self.now + payload.duration_s, _BG_END, self._seq)
                self._net_dirty = True
            return False
        if kind == _BG_END:
            del self._bg[payload]
            self._net_dirty = True
            return False
        return self._infrastructure(payload)

    def _arrive(self, js: JobState) -> bool:
        self.job_events += 1
        shape = tuple(sorted(t.demand.as_tuple() for t in js.job.tasks))
        if shape not in self._packable:  # could it run here at all, on the empty cluster?
            empty = self.cluster.copy(share_graph=True)
            empty.used, empty.offline = {n: Resources() for n in empty.used}, set()
            self._packable[shape] = packable(empty, js.job, budget=20_000) is not False
        if not self._packable[shape]:
            js.state = "rejected"
            self._open -= 1
            return False
        js.state, js.queued_since = "queued", self.now
        self.queue.append(js)
        return True

    def _infrastructure(self, ev: NodeLeave | NodeJoin | LinkChange) -> bool:
        g = self.cluster.graph
        if isinstance(ev, LinkChange):
            if not g.has_edge(ev.u, ev.v):
                raise ValueError(f"link change at t={ev.time}: no link {ev.u}–{ev.v}")
            grew = ev.bw_mbps > g.edges[ev.u, ev.v]["bw_mbps"]
            g.edges[ev.u, ev.v]["bw_mbps"] = ev.bw_mbps
            self._net_dirty = self._links_changed = True
            self.epoch += grew
            if self.config.metered and self.config.adjust and not grew:
                self._adjust()
            return grew
        if ev.node not in g or g.nodes[ev.node].get("kind") != "compute":
            raise ValueError(f"{type(ev).__name__} at t={ev.time}: unknown compute node {ev.node}")
        if isinstance(ev, NodeJoin):
            if ev.node not in self.cluster.offline:
                return False
            self.cluster.offline.discard(ev.node)
            self._touch([ev.node])
            self.epoch += 1
            return True
        self.cluster.offline.add(ev.node)
        self._util.pop(ev.node, None)
        self._balance = None
        hit = [js for js in self.running.values() if ev.node in js.decision.placement.values()]
        for js in hit:
            self._advance(js)
            self._stop(js, "failed" if self.config.on_node_loss == "fail" else "queued")
        return bool(hit) or getattr(self.policy, "reallocates", False)

    def _adjust(self) -> None:
        """The Master's runtime adjustment: each running enforced job with a flow on a link whose
        grants no longer fit gets CES's paths and rates for its placement (`route_placement`) on
        what the others leave; one that finds none keeps its flows, scaled down on the link."""
        g = self.cluster.graph
        hot = {lk for lk, r in self.cluster.reserved.items() if r > g.edges[lk]["bw_mbps"] + 1e-9}
        for js in sorted(self.running.values(), key=lambda j: j.name):
            d = js.decision
            if d.network != ENFORCED or not any(
                lk in hot for f in d.flows for lk in f.directed_links()
            ):
                continue
            view = self.cluster.copy(share_graph=True)
            view.release(js.name)
            try:
                flows = route_placement(view, js.allocated_job, d.placement)
            except NoPath:
                continue
            self.cluster.release(js.name)
            js.decision = replace(d, flows=flows)
            js.reroutes += 1
            self.cluster.allocate(js.allocated_job, js.decision)
            self._net_dirty = True

    def _ensure_tick(self) -> None:
        """Periodic rounds (policies with `period_s`) while jobs run."""
        if self.policy.period_s and self.running and not self._tick_pending:
            self._tick_pending = True
            self._push(self.now + self.policy.period_s, _TICK, None)

    # --- scheduling --------------------------------------------------------------------------------
    def _round(self) -> None:
        rnd = Round(
            self.now,
            self.cluster,
            self.policy.algorithm,
            self.queue,
            list(self.running.values()),
            self.epoch,
        )
        self.policy.schedule(rnd)
        self.epoch = rnd.epoch
        for js in rnd.preempted:
            self._advance(js)
            js.preemptions += 1
            self._stop(js, "queued", released=True)
        for js in rnd.moved:
            self._move(js)
        for js in rnd.placed:
            self._start(js)

    def _start(self, js: JobState) -> None:
        self.job_events += 1
        self.queue.remove(js)
        js.waited_s += self.now - js.queued_since
        js.state, js.last_update = "running", self.now
        if js.first_start is None:
            js.first_start = self.now
        else:
            js.ready_at = self.now + self.config.restart_overhead_s
        self._migrated(js)
        js.bw_satisfaction = bandwidth_satisfaction(js.job, js.decision)[0]
        self.running[js.name] = js
        self.starts.append((self.now, js.name, placement_key(js.decision.placement)))
        self._touch(js.decision.placement.values())
        self._net_dirty |= self._shares_network(js)
        if not self._net_dirty:  # its flows get exactly their granted rates
            self._set_pace(
                js,
                predicted_iteration_s(
                    self.cluster, js.allocated_job, js.decision, self.config.model
                ),
            )
        self._ensure_tick()

    def _migrated(self, js: JobState) -> bool:
        """Count a run on a placement other than the previous run's (a migration)."""
        moved = js.last_placement is not None and js.last_placement != js.decision.placement
        js.migrations += moved
        js.last_placement = dict(js.decision.placement)
        return moved

    def _move(self, js: JobState) -> None:
        """A running job re-allocated by the policy (`Round.moved`): progress up to now at the
        old pace, then the new share; a new placement is a migration and pays the restart."""
        self.job_events += 1
        old = list(js.last_placement.values())
        self._advance(js)
        if self._migrated(js):
            js.ready_at = max(js.ready_at, self.now + self.config.restart_overhead_s)
        js.bw_satisfaction = bandwidth_satisfaction(js.job, js.decision)[0]
        self.starts.append((self.now, js.name, placement_key(js.decision.placement)))
        self._touch([*old, *js.decision.placement.values()])
        js.version += 1  # its completion event is stale whatever the new pace
        js.iter_s = js.expected_end = math.inf
        self._net_dirty |= not self.config.metered or self._shares_network(js)
        if not self._net_dirty:
            self._set_pace(
                js,
                predicted_iteration_s(
                    self.cluster, js.allocated_job, js.decision, self.config.model
                ),
            )

    def _stop(self, js: JobState, state: State, released: bool = False) -> None:
        """End a job's run: finished, failed, or back in the queue (progress kept)."""
        self.job_events += 1
        if not released:
            self.cluster.release(js.name)
        del self.running[js.name]
        js.version += 1
        js.state, js.expected_end, js.iter_s = state, math.inf, math.inf
        if state == "queued":
            js.queued_since, js.failed_at = self.now, None
            self.queue.append(js)
            self.queue.sort(key=lambda q: q.seq)
        else:
            js.finish = self.now
            self._open -= 1
        self.epoch += 1
        self._touch(js.decision.placement.values())
        self._net_dirty |= self._shares_network(js)

    # --- progress ------------------------------------------------------------------------------------
    def _advance(self, js: JobState) -> None:
        """Bring a running job's progress up to now at its current pace."""
        start = max(js.last_update, js.ready_at)
        if self.now > start and js.iter_s < math.inf:
            js.done_iters = min(
                js.done_iters + (self.now - start) / js.iter_s, float(js.job.iterations)
            )
        js.attained += js.workers * max(self.now - js.last_update, 0.0)
        js.last_update = self.now

    def _set_pace(self, js: JobState, iter_s: float) -> None:
        js.iter_s = iter_s
        js.version += 1
        js.expected_end = (
            max(self.now, js.ready_at) + js.remaining_iters() * iter_s
            if iter_s < math.inf
            else math.inf
        )
        if js.expected_end < math.inf:
            self._push(js.expected_end, _FINISH, (js, js.version))

    # --- the network ---------------------------------------------------------------------------------
    def _shares_network(self, js: JobState) -> bool:
        """Whether this job's flows starting or stopping can change other jobs' rates: elastic
        flows share, and a link shrunk below its grants scales all its metered flows."""
        return bool(js.decision.flows) and (not self.config.metered or self._oversubscribed())

    def _oversubscribed(self) -> bool:
        g = self.cluster.graph
        return self._links_changed and any(
            r > g.edges[link]["bw_mbps"] + 1e-9 for link, r in self.cluster.reserved.items()
        )

    def _refresh_rates(self) -> None:
        """Recompute every job flow's actual rate; re-pace the jobs whose iteration time changed.

        Metered: the granted rate, scaled down where a link shrank below its grants (background
        traffic only takes what the grants leave, so it changes no job's rate). Unmetered: max-min
        fair shares of the links' capacity among all job and background flows (elastic).
        """
        self._net_dirty = False
        g = self.cluster.graph
        moving = [js for js in self.running.values() if js.decision.flows]
        if self.config.metered:
            scale = {
                lk: min(1.0, g.edges[lk]["bw_mbps"] / r)
                for lk, r in self.cluster.reserved.items()
                if r > 1e-12
            }
            actual = {
                (js.name, f.src, f.dst): f.rate_mbps
                * min(scale.get(lk, 1.0) for lk in f.directed_links())
                for js in moving
                for f in js.decision.flows
            }
        else:
            paths: dict[object, tuple[str, ...]] = {}
            demand: dict[object, float] = {}
            for js in moving:
                for f in js.decision.flows:
                    paths[(js.name, f.src, f.dst)] = f.path
                    demand[(js.name, f.src, f.dst)] = math.inf
            for i, (path, cap) in self._bg.items():
                paths[i], demand[i] = path, cap
            bare = self.cluster.copy(share_graph=True)
            bare.reserved = {}  # nothing is reserved: every flow competes for the capacity
            actual = fair_rates(bare, paths, demand)
        for js in moving:
            flows = [
                replace(f, rate_mbps=actual[(js.name, f.src, f.dst)]) for f in js.decision.flows
            ]
            iter_s = predicted_iteration_s(
                self.cluster, js.allocated_job, replace(js.decision, flows=flows), self.config.model
            )
            if not math.isclose(iter_s, js.iter_s, rel_tol=1e-12):
                self._advance(js)
                self._set_pace(js, iter_s)

    # --- time-averaged cluster state -------------------------------------------------------------------
    def _touch(self, nodes: Iterable[str]) -> None:
        """Refresh Ū_n of nodes whose allocations changed."""
        for n in set(nodes) - self.cluster.offline:
            self._util[n] = node_utilisation(self.cluster, n)
        self._balance = None

    def _integrate(self, t: float) -> None:
        """Accumulate the cluster's balance (std of Ū_n over online nodes, as
        `metrics.load_balance`) and mean utilisation over time up to `t`; the queue is as the
        last round at `self._clock` left it."""
        if self._clock is None:
            self._clock_start = t
        elif t > self._clock:
            if self._balance is None:
                u = np.fromiter(self._util.values(), float)
                self._balance = (float(u.std()), float(u.mean())) if u.size else (0.0, 0.0)
            self._balance_area += self._balance[0] * (t - self._clock)
            self._arrivals_area += self._balance[0] * max(
                0.0, min(t, self._last_arrival) - self._clock
            )
            self._util_area += self._balance[1] * (t - self._clock)
            if self.queue:
                self._queued_area += self._balance[0] * (t - self._clock)
                self._queued_time += t - self._clock
        self._clock = t
