"""Workloads for the simulator: job mixes, arrival processes, tidal node availability, background
traffic. Everything is drawn from a `numpy` generator, so a seed gives the same scenario.

Job mix (`JobMix`, shaped after the Alibaba PAI GPU trace, cluster-trace-gpu-v2020, as its NSDI'22
analysis describes it: most jobs are small, a few are large, durations are heavy-tailed; the
task table is not available offline, so the numbers below are ours, not fitted):
  workers      1: 35 %, 2: 25 %, 4: 20 %, 8: 15 %, 16: 5 %  (a star job adds its parameter server);
               halved until the job asks at most `max_job_share` (25 %) of the cluster's cpu
  collective   ring 60 %, star 25 %, tree 10 %, all-to-all 5 %  (single-worker jobs: ring, no flows)
  cpu / task   1/8: 45 %, 1/4: 35 %, 1/2: 15 %, 1: 5 % of the cluster's median node cpu
  mem / task   the same share of the median node's memory × U(0.5, 1)
  gpu / task   1 for half of the jobs when the cluster has GPUs (nodes sampled from the trace's
               machine table), else 0
  model        10^U(5, 7.5) float32 parameters (0.4 MB – 126 MB)
  compute      log-uniform 0.05 – 2 s of one reference core per iteration
  bandwidth    per flow: what lets the flow's bytes move in one iteration's compute time,
               clipped to 5 – 1000 Mbit/s (jobs ask for what keeps communication off the
               critical path)
  duration     lognormal, median 15 min, σ = 1.3, clipped to 1 min – 8 h of nominal run time
               (`simulator.estimated_iteration_s`); iterations = duration / nominal iteration
  priority     0: 60 %, 1: 30 %, 2: 10 %
  deadline     30 % of jobs: U(1.5, 4) × nominal duration after submission (seed 001)

Arrival processes: `poisson` (exponential gaps) and `bursty` (a two-state Markov-modulated Poisson
process: bursts at `burst`× the quiet rate for a `burst_frac` share of the time, cycles of
`cycle_s` on average). The rate comes from the offered `load`: nominal cpu-seconds asked per second
over the cluster's cpu cores.

Tidal availability (seed 001: edge servers are busy with their own users by day — at midnight the
CPU use of edge SoCs is ~1/50 of the peak, and about half the time utilisation is below 50 % — so
training may use them when they are idle): each node not in the `always_on` share is busy (off
limits: it leaves) for a `busy` share of every day around its peak hour, then joins again. Peaks
are 14:00 (office sites) or 21:00 (residential sites), ±1 h.

A scenario spec is `PROCESS[:key=value,...]`, e.g. `poisson:n=500,load=0.8` or
`bursty:n=600,load=0.9,tidal=1,background=20`; see `ArrivalSpec` for the keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import numpy as np

from .jobs import BUILDERS, BYTES_PER_PARAM
from .model import Cluster, Job, Resources
from .perfmodel import compute_time_s, flow_bytes
from .rounds import estimated_iteration_s
from .simulator import BackgroundFlow, NodeJoin, NodeLeave, ScenarioEvent

DAY_S = 86400.0


class ArrivalError(ValueError):
    """A scenario spec that cannot be used; the message says which key and what was expected."""


def _pick(rng: np.random.Generator, table: tuple[tuple[object, float], ...]):
    values, weights = zip(*table)
    return values[int(rng.choice(len(values), p=np.asarray(weights) / sum(weights)))]


@dataclass(frozen=True)
class JobMix:
    """The job distribution (module doc); tables are (value, probability)."""

    workers: tuple[tuple[int, float], ...] = (
        (1, 0.35),
        (2, 0.25),
        (4, 0.20),
        (8, 0.15),
        (16, 0.05),
    )
    collectives: tuple[tuple[str, float], ...] = (
        ("ring", 0.60),
        ("star", 0.25),
        ("tree", 0.10),
        ("all-to-all", 0.05),
    )
    cpu_share: tuple[tuple[float, float], ...] = (
        (0.125, 0.45),
        (0.25, 0.35),
        (0.5, 0.15),
        (1.0, 0.05),
    )
    max_job_share: float = 0.25
    gpu_job_share: float = 0.5
    log10_params: tuple[float, float] = (5.0, 7.5)
    compute_s: tuple[float, float] = (0.05, 2.0)
    mbps: tuple[float, float] = (5.0, 1000.0)
    duration_median_s: float = 900.0
    duration_sigma: float = 1.3
    duration_s: tuple[float, float] = (60.0, 8 * 3600.0)
    priorities: tuple[tuple[int, float], ...] = ((0, 0.60), (1, 0.30), (2, 0.10))
    deadline_share: float = 0.3
    deadline_slack: tuple[float, float] = (1.5, 4.0)

    def sample(
        self, rng: np.random.Generator, cluster: Cluster, name: str, submit_time: float = 0.0
    ) -> Job:
        nodes = cluster.compute_nodes()
        cpu0 = float(np.median([cluster.capacity(n).cpu for n in nodes]))
        mem0 = float(np.median([cluster.capacity(n).mem_mb for n in nodes]))
        has_gpu = any(cluster.capacity(n).gpu >= 1 for n in nodes)
        k = int(_pick(rng, self.workers))
        share = float(_pick(rng, self.cpu_share))
        gpu = 1.0 if has_gpu and rng.random() < self.gpu_job_share else 0.0
        demand = Resources(round(share * cpu0, 4), round(share * mem0 * rng.uniform(0.5, 1.0)), gpu)
        total_cpu = sum(cluster.capacity(n).cpu for n in nodes)
        while k > 1 and (k + 1) * demand.cpu > self.max_job_share * total_cpu:
            k //= 2
        collective = str(_pick(rng, self.collectives)) if k > 1 else "ring"
        model_bytes = BYTES_PER_PARAM * round(10 ** rng.uniform(*self.log10_params))
        compute = float(math.exp(rng.uniform(*np.log(self.compute_s))))
        seconds = compute_time_s(compute, 1.0, demand.cpu)
        mbps = float(
            np.clip(flow_bytes(collective, k, model_bytes) * 8 / seconds / 1e6, *self.mbps)
        )
        fields_ = dict(
            compute_s=compute,
            iterations=1,
            priority=int(_pick(rng, self.priorities)),
            submit_time=submit_time,
        )
        job = BUILDERS[collective](name, k, demand, model_bytes, round(mbps, 1), **fields_)
        duration = float(
            np.clip(
                self.duration_median_s * math.exp(rng.normal(0, self.duration_sigma)),
                *self.duration_s,
            )
        )
        job.iterations = max(1, round(duration / estimated_iteration_s(job)))
        if rng.random() < self.deadline_share:
            job.deadline = round(rng.uniform(*self.deadline_slack) * duration, 1)
        return job


# --- arrival processes ------------------------------------------------------------------------------


def poisson_times(rng: np.random.Generator, n: int, rate: float, start: float = 0.0) -> list[float]:
    """n arrival times of a Poisson process of `rate` jobs/s."""
    return list(start + np.cumsum(rng.exponential(1.0 / rate, n)))


def bursty_times(
    rng: np.random.Generator,
    n: int,
    rate: float,
    burst: float = 8.0,
    burst_frac: float = 0.1,
    cycle_s: float = 3600.0,
) -> list[float]:
    """n arrival times of a two-state MMPP with long-run mean `rate`: bursts at `burst`× the quiet
    rate for a `burst_frac` share of the time; a burst plus a quiet spell last `cycle_s` on
    average (exponential sojourns)."""
    quiet = rate / (1 - burst_frac + burst * burst_frac)
    times, t, bursting = [], 0.0, False
    while len(times) < n:
        sojourn = rng.exponential(cycle_s * (burst_frac if bursting else 1 - burst_frac))
        lam = quiet * (burst if bursting else 1.0)
        arrival = t + rng.exponential(1.0 / lam)
        while arrival < t + sojourn and len(times) < n:
            times.append(arrival)
            arrival += rng.exponential(1.0 / lam)
        t, bursting = t + sojourn, not bursting
    return times


# --- node availability and background traffic -----------------------------------------------------


def tidal_availability(
    rng: np.random.Generator,
    nodes: list[str],
    horizon_s: float,
    busy: float = 0.5,
    always_on: float = 0.3,
    day_s: float = DAY_S,
) -> list[ScenarioEvent]:
    """Leave/join events of seed 001's tidal edge nodes over [0, horizon_s) (module doc)."""
    events: list[ScenarioEvent] = []
    tidal = [n for n in nodes if rng.random() >= always_on]
    for node in tidal:
        peak = (14.0 if rng.random() < 0.5 else 21.0) + rng.normal(0.0, 1.0)
        start = (peak / 24.0 - busy / 2) * day_s
        day = math.floor(-start / day_s) * day_s if start < 0 else 0.0
        while start + day < horizon_s:
            leave, join = start + day, start + day + busy * day_s
            if join > 0:
                events.append(NodeLeave(max(leave, 0.0), node))
                events.append(NodeJoin(join, node))
            day += day_s
    return sorted(events, key=lambda e: (e.time, isinstance(e, NodeLeave), e.node))


def background_traffic(
    rng: np.random.Generator,
    nodes: list[str],
    horizon_s: float,
    per_hour: float,
    mean_duration_s: float = 300.0,
    mbps: tuple[float, float] = (1.0, 100.0),
) -> list[BackgroundFlow]:
    """Unscheduled flows between random node pairs: Poisson arrivals (`per_hour`), exponential
    durations, each capped at a log-uniform rate in `mbps` (video, backups, user traffic)."""
    if per_hour <= 0 or len(nodes) < 2:
        return []
    flows = []
    for t in poisson_times(rng, max(1, int(per_hour * horizon_s / 3600 * 1.5)), per_hour / 3600):
        if t >= horizon_s:
            break
        src, dst = rng.choice(len(nodes), 2, replace=False)
        flows.append(
            BackgroundFlow(
                float(t),
                nodes[src],
                nodes[dst],
                float(rng.exponential(mean_duration_s)),
                float(math.exp(rng.uniform(*np.log(mbps)))),
            )
        )
    return flows


# --- scenarios ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrivalSpec:
    process: str = "poisson"  # poisson | bursty
    n: int = 500  # jobs
    load: float = 0.8  # offered nominal cpu load (ignored when rate > 0)
    rate: float = 0.0  # jobs per second
    burst: float = 8.0  # bursty: rate multiplier inside a burst
    burst_frac: float = 0.1  # bursty: share of time in bursts
    cycle_s: float = 3600.0  # bursty: mean burst + quiet cycle
    tidal: int = 0  # 1: seed 001's day/night node availability
    busy: float = 0.5  # tidal: share of the day a tidal node is busy
    always_on: float = 0.3  # tidal: share of nodes never busy
    day_s: float = DAY_S
    background: float = 0.0  # background flows per hour
    deadline_share: float = 0.3  # share of jobs with a deadline


PROCESSES = ("poisson", "bursty")


def parse_arrivals(spec: str) -> ArrivalSpec:
    """`PROCESS[:key=value,...]` → `ArrivalSpec`; `ArrivalError` says what is wrong."""
    process, _, rest = spec.partition(":")
    if process not in PROCESSES:
        raise ArrivalError(
            f"arrivals '{spec}': unknown process '{process}' (expected "
            f"{' or '.join(PROCESSES)}, e.g. poisson:n=500,load=0.8)"
        )
    kinds = {f.name: f.type for f in fields(ArrivalSpec) if f.name != "process"}
    values: dict[str, float | int] = {}
    for item in filter(None, rest.split(",")):
        key, eq, text = item.partition("=")
        if key not in kinds or not eq:
            raise ArrivalError(
                f"arrivals '{spec}': '{item}' is not KEY=VALUE with KEY one of {', '.join(kinds)}"
            )
        try:
            value = int(text) if kinds[key] == "int" else float(text)
        except ValueError:
            raise ArrivalError(
                f"arrivals '{spec}': {key} must be a{'n integer' if kinds[key] == 'int' else ' number'}, "
                f"got '{text}'"
            ) from None
        if not value >= 0 or math.isinf(value):
            raise ArrivalError(f"arrivals '{spec}': {key} must be a finite number ≥ 0, got {text}")
        values[key] = value
    out = replace(ArrivalSpec(process=process), **values)
    for key, ok, expected in (
        ("n", out.n >= 1, "≥ 1"),
        ("busy", out.busy < 1, "< 1"),
        ("always_on", out.always_on <= 1, "≤ 1"),
        ("burst", out.burst >= 1, "≥ 1"),
        ("burst_frac", 0 < out.burst_frac < 1, "in (0, 1)"),
        ("deadline_share", out.deadline_share <= 1, "≤ 1"),
        ("day_s", out.day_s > 0, "> 0"),
        ("cycle_s", out.cycle_s > 0, "> 0"),
    ):
        if not ok:
            raise ArrivalError(
                f"arrivals '{spec}': {key} must be {expected}, got {getattr(out, key)}"
            )
    if out.rate <= 0 and out.load <= 0:
        raise ArrivalError(f"arrivals '{spec}': give load > 0 or rate > 0")
    return out


@dataclass
class Scenario:
    jobs: list[Job]
    events: list[ScenarioEvent]
    rate: float  # jobs per second


def make_scenario(
    spec: ArrivalSpec, cluster: Cluster, seed: int, mix: JobMix = JobMix()
) -> Scenario:
    """The jobs and events of one run; the same (spec, cluster, seed) gives the same scenario."""
    rng = np.random.default_rng(seed)
    mix = replace(mix, deadline_share=spec.deadline_share)
    nodes = cluster.compute_nodes()
    rate = spec.rate
    if rate <= 0:
        # Nominal work of the mix, estimated on a separate stream so it does not shift the jobs.
        probe = np.random.default_rng([seed, 1])
        work = np.mean(
            [
                sum(t.demand.cpu for t in j.tasks) * j.iterations * estimated_iteration_s(j)
                for j in (mix.sample(probe, cluster, "probe") for _ in range(2000))
            ]
        )
        cores = sum(cluster.capacity(n).cpu for n in nodes)
        if spec.tidal:
            cores *= spec.always_on + (1 - spec.always_on) * (1 - spec.busy)
        rate = spec.load * cores / work
    if spec.process == "poisson":
        times = poisson_times(rng, spec.n, rate)
    else:
        times = bursty_times(rng, spec.n, rate, spec.burst, spec.burst_frac, spec.cycle_s)
    jobs = [mix.sample(rng, cluster, f"j{i:04d}", round(t, 3)) for i, t in enumerate(times)]
    # Scenario events cover the arrivals plus a margin for the queue to drain.
    horizon = times[-1] + 2 * spec.day_s
    events: list[ScenarioEvent] = []
    if spec.tidal:
        events += tidal_availability(
            np.random.default_rng([seed, 2]), nodes, horizon, spec.busy, spec.always_on, spec.day_s
        )
    if spec.background > 0:
        events += background_traffic(
            np.random.default_rng([seed, 3]), nodes, horizon, spec.background
        )
    return Scenario(jobs, events, rate)
