#!/usr/bin/env python3
"""Calibrate the iteration-time model (`scheduler.perfmodel.IterationModel`) on the testbed, and
check it on every collective of the job model.

    sudo python experiments/calibrate_perfmodel.py --seed 0 [--models mlp-small,cnn,mlp-large]
        [--collectives ring,star,tree,all-to-all,custom]
        [--check-models cnn,mlp-large,transformer,mobilenetv2,resnet18]

k = 3 worker containers (one per node, `--cpu` cores each) on one switch, every access link
shaped to the bottleneck B; the job is real training of each model: DDP over gloo's ring
all-reduce, or the worker's other collectives (`workloads.collectives`).

1. Compute profile: at `--reference-mbps` (fast links) the median compute time per iteration of
   the slowest task of a ring run is each model's compute term (what a scheduler would know of
   the job), for the fit's models and the check models alike.
2. Fit on the ring runs of `--models` at the `--fit-mbps` points plus the reference: measured
   collective time = flow bytes·8 / min(B·efficiency, max rate) + steps·latency (least squares
   of the relative error: efficiency, per-message latency and the rate a worker's stack
   sustains when the link is not the limit); overhead = median of what iterations spent outside
   compute and collective.
3. Check on the `--check-mbps` points (10, 50, 200 Mbit/s, not used in the fit), ring: measured
   iteration time vs the fitted model's prediction (target ±15%), and measured collective time
   over the bandwidth bound 2(k-1)/k·M/B.
4. Check every collective of `--collectives` on every model of `--check-models` at
   `--collective-mbps` (200 Mbit/s: ResNet-18's 45 MB of gradients take seconds even there):
   the prediction is the scheduler's (`scheduler.metrics.predicted_iteration_s` with the fitted
   constants) for the job the run is (`scheduler.jobs`: the collective's flows and
   `perfmodel.flow_bytes`, `perfmodel.collective_steps`), its flows at their equal shares of the
   links among themselves; and each flow's bytes, as its source counted them, vs the model's.
   Each on the networks of `--networks`: `best-effort`, nothing reserved, TCP shares the links;
   `enforced`, every flow held by a class of its own on its sender's interface, as CES's
   Network Manager holds a flow to its grant (`edge.tc.set_destination`), to its share of the
   `GRANTABLE` part of the links the Master grants from. The ring
   runs best-effort only: each of its flows has a link to itself, so its share is the link.
   The custom graph is a cycle through the three tasks plus a side loop (a->b->c->a and
   a->c->a), the shape of workloads/jobs/custom-cycle.yaml on three nodes.
   ResNet-18 and MobileNetV2 train on CIFAR-10, the Transformer on MNIST-5k (`MODEL_DATASETS`);
   where CIFAR-10's files are absent the worker trains on random data of its shapes, which
   times an iteration the same.
Every run is a fixed number of iterations (about `--budget-s` seconds of them for the ring fit,
`--check-budget-s` for the collective checks, by the uncalibrated model; the target accuracy is
unreachable on purpose). Writes results/calibration.json with the machine and how busy it was
(others' load just before each run, total load during it).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import functools
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table
from scipy.optimize import least_squares

from edge import tc
from experiments.common import RESULTS, require_root
from experiments.machine import machine
from master.network import NetworkController
from scheduler.compose import best_effort_flows
from scheduler.jobs import (
    BUILDERS,
    WORKLOAD_COLLECTIVE,
    custom_job,
    flows_between,
    star_job,
    worker_flows,
    worker_tasks,
)
from scheduler.metrics import predicted_iteration_s
from scheduler.model import Cluster, Decision, Job, Resources
from scheduler.perfmodel import COLLECTIVES, IterationModel, collective_steps, flow_bytes
from testbed import Emulation, EmulationError
from topologies import Topology, parse_topology
from workloads.data import DATASET_SHAPES
from workloads.job import TestbedJobError, run_job
from workloads.models import MODELS, build_model, ddp_buckets, gradient_bytes
from workloads.results import WARMUP_ITERS, JobSummary, read_job

SWITCH = "s1"
# The inputs each architecture is made for (the small models train on `Settings.dataset`).
MODEL_DATASETS = {"resnet18": "cifar10", "mobilenetv2": "cifar10", "transformer": "mnist5k"}
COMPUTE_GUESS_S = 0.05  # per iteration, for planning a run before its model's profile is known


BEST_EFFORT, ENFORCED = "best-effort", "enforced"
GRANTABLE = NetworkController.GRANTABLE
NETWORKS = (BEST_EFFORT, ENFORCED)  # how the collective checks' flows share the links


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...] = ("mlp-small", "cnn", "mlp-large")  # the ring fit's
    # checked on every collective at `collective_mbps`: the light and the heavy model of the
    # fit, and the real architectures
    collectives: tuple[str, ...] = COLLECTIVES
    check_models: tuple[str, ...] = ("cnn", "mlp-large", "transformer", "mobilenetv2", "resnet18")
    workers: int = 3
    cpu: float = 0.6
    mem_mb: int = 1536  # ResNet-18 beside CIFAR-10-sized data: more than 1 GiB
    dataset: str = "digits"
    batch_size: int = 32
    seed: int = 0
    reference_mbps: float = 1000.0
    fit_mbps: tuple[float, ...] = (25.0, 100.0)
    check_mbps: tuple[float, ...] = (10.0, 50.0, 200.0)
    collective_mbps: tuple[float, ...] = (200.0,)
    networks: tuple[str, ...] = NETWORKS  # of the collective checks
    budget_s: float = 45.0  # seconds of iterations per ring-fit run (bounds the iteration count)
    min_iters: int = 12
    max_iters: int = 60
    # ... per run of the collective checks and the check models' profiles: an iteration of
    # ResNet-18 takes seconds, so these get the warm-up (`workloads.results.WARMUP_ITERS`) and
    # three timed iterations at least
    check_budget_s: float = 10.0
    check_min_iters: int = WARMUP_ITERS + 3
    tolerance: float = 0.15
    bytes_tolerance: float = 0.01  # per flow: the worker's shares are whole elements and buckets
    repeats: int = 1  # rounds over all (rate, model) points; each point's median is used


# --- shared with bench_tta.py -------------------------------------------------------------------
def bottleneck_topology(workers: int, cpu: float, mem_mb: int, mbps: float) -> Topology:
    """`workers` nodes on one switch; every access link is the bottleneck."""
    nodes = [f"w{i + 1}" for i in range(workers)]
    return parse_topology(
        {
            "name": f"bottleneck-{workers}",
            "switches": [{"name": SWITCH}],
            "nodes": [{"name": n, "cpu": cpu, "mem_mb": mem_mb} for n in nodes],
            "links": [{"ends": [n, SWITCH], "bw_mbps": mbps} for n in nodes],
        },
        "experiment",
    )


def set_bottleneck(net: Emulation, mbps: float) -> None:
    for node in net.nodes:
        net.set_link(node, SWITCH, mbps)


class HostLoad:
    """How busy the whole machine is: CPU busy fraction from /proc/stat, and the load average."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    def busy(self) -> float:
        """Fraction of all cores busy since construction (0..1)."""
        busy, total = self._read()
        return (busy - self._start[0]) / max(total - self._start[1], 1)

    @staticmethod
    def sample_background(seconds: float = 3.0) -> float:
        """Busy fraction over a short window in which this experiment runs nothing."""
        load = HostLoad()
        time.sleep(seconds)
        return load.busy()


def measured_run(
    net: Emulation, out_root: Path, name: str, cpu: float, mem_mb: int, deadline_s: float, **options
) -> tuple[JobSummary, dict]:
    """One job on the running emulation: its summary and the machine's load around it."""
    background = HostLoad.sample_background()
    load = HostLoad()
    t0 = time.monotonic()
    paths = run_job(
        net,
        list(net.nodes),
        out_root / name,
        job=name,
        cpu=cpu,
        mem_mb=mem_mb,
        deadline_s=deadline_s,
        **options,
    )
    return read_job(paths), {
        "cpu_busy_background": round(background, 3),
        "cpu_busy_during": round(load.busy(), 3),
        "loadavg_1m_after": round(os.getloadavg()[0], 2),
        "wall_s": round(time.monotonic() - t0, 1),
    }


# --- calibration --------------------------------------------------------------------------------
Point = tuple[str, str, float, str]  # (collective, model, Mbit/s, network): what one run measures


def dataset_of(s: Settings, model: str) -> str:
    return MODEL_DATASETS.get(model, s.dataset)


def model_bytes(model: str, dataset: str) -> int:
    return gradient_bytes(build_model(model, *DATASET_SHAPES[dataset]))


@functools.cache
def model_buckets(model: str, dataset: str) -> tuple[int, ...]:
    """The model's gradient as the ring's DDP buckets it (`workloads.models.ddp_buckets`)."""
    return tuple(ddp_buckets(build_model(model, *DATASET_SHAPES[dataset])))


def planned_points(s: Settings) -> list[Point]:
    """Every point to measure, in order: each model's compute profile (a ring at the reference
    rate) first, then the ring fit and its checks, then every collective on the check models."""
    profiled = dict.fromkeys((*s.models, *s.check_models))
    plan = [("ring", m, s.reference_mbps, BEST_EFFORT) for m in profiled]
    plan += [("ring", m, b, BEST_EFFORT) for b in (*s.fit_mbps, *s.check_mbps) for m in s.models]
    plan += [
        (c, m, b, n)
        for n in s.networks
        for b in s.collective_mbps
        for c in s.collectives
        for m in s.check_models
        if c != "ring" or n == BEST_EFFORT
    ]
    return list(dict.fromkeys(plan))


def ring_fit_run(s: Settings, point: Point) -> bool:
    """Whether a point is one of the ring fit's runs, fit or check (they get the fit's budget),
    rather than one of the collective checks or the check models' profiles."""
    collective, model, mbps, _ = point
    rates = (s.reference_mbps, *s.fit_mbps, *s.check_mbps)
    return collective == "ring" and model in s.models and mbps in rates


def custom_pairs(k: int) -> list[tuple[int, int]]:
    """The custom graph the calibration runs: a cycle through every task, 0 -> 1 -> ... -> 0, and
    a side loop through a chord 0 -> 2 (on three tasks a->b->c->a and a->c->a)."""
    return [(i, (i + 1) % k) for i in range(k)] + [(0, 2)]


def calibration_job(
    s: Settings,
    collective: str,
    nbytes: float,
    mbps: float,
    compute_s: float,
    buckets: tuple[float, ...] = (),
) -> Job:
    """The scheduler's model of one run: `s.workers` tasks of `s.cpu` cores (task i is rank i;
    a star's server is one of them), the collective's flows and bytes per flow for a gradient
    of `nbytes`, `compute_s` seconds of one reference core per iteration, a ring's gradient in
    DDP's `buckets`."""
    k, demand = s.workers, Resources(s.cpu, s.mem_mb)
    fields = {"compute_s": compute_s, "iterations": 1}
    if collective == "ring":
        fields["ddp_buckets"] = buckets
    if collective == "star":
        return star_job(collective, k - 1, demand, nbytes, mbps, **fields)
    if collective == "custom":
        tasks = worker_tasks(k, demand)
        pairs = [(tasks[a].name, tasks[b].name) for a, b in custom_pairs(k)]
        flows = flows_between(pairs, mbps, flow_bytes("custom", k, nbytes))
        return custom_job(collective, tasks, flows, nbytes, **fields)
    return BUILDERS[collective](collective, k, demand, nbytes, mbps, **fields)


def modelled(
    s: Settings, point: Point, nbytes: float, compute_s: float
) -> tuple[Cluster, Job, Decision]:
    """One run as the scheduler sees it: the bottleneck network, the job, its task i on node
    w{i+1}, each flow at its equal share of the links among the job's flows: what TCP gives it
    when nothing is reserved; enforced, of the `GRANTABLE` share of every link the Master's view
    shows the scheduler, what its grant holds it to."""
    collective, model, mbps, network = point
    cluster = Cluster.from_topology(bottleneck_topology(s.workers, s.cpu, s.mem_mb, mbps))
    buckets = model_buckets(model, dataset_of(s, model)) if collective == "ring" else ()
    job = calibration_job(s, collective, nbytes, mbps, compute_s, buckets)
    placement = {t.name: f"w{i + 1}" for i, t in enumerate(job.tasks)}
    flows = best_effort_flows(cluster, job, placement)
    if network == ENFORCED:
        flows = [replace(f, rate_mbps=f.rate_mbps * GRANTABLE) for f in flows]
    return cluster, job, Decision(job.name, placement, flows)


def planned_iters(s: Settings, point: Point, compute: dict[str, float]) -> int:
    """Iterations that fit the run's budget by the uncalibrated model (the model's compute when
    its profile is measured, else guessed)."""
    _, model, _, _ = point
    at_cpu = compute.get(model, COMPUTE_GUESS_S)
    cluster, job, decision = modelled(
        s, point, model_bytes(model, dataset_of(s, model)), at_cpu * s.cpu
    )
    iteration = predicted_iteration_s(cluster, job, decision, IterationModel())
    budget, least = (
        (s.budget_s, s.min_iters)
        if ring_fit_run(s, point)
        else (s.check_budget_s, s.check_min_iters)
    )
    return int(min(s.max_iters, max(least, budget // iteration)))


@contextmanager
def held_to_shares(net: Emulation, decision: Decision) -> Iterator[None]:
    """Every inter-node flow of `decision` held to its rate by a class of its own on its
    sender's interface, as the Network Manager holds a flow to its grant (`edge.tc`); the
    classes go when the run ends."""
    classes = [
        (
            net.nodes[decision.placement[f.src]].container_pid,
            net.topo.node(decision.placement[f.dst]).ip,
            f.rate_mbps,
        )
        for f in decision.flows
    ]
    try:
        for pid, ip, rate in classes:
            tc.set_destination("eth0", ip, rate, pid=pid, dilation=net.dilation)
        yield
    finally:
        for pid, ip, _ in classes:
            tc.remove_destination("eth0", ip, pid=pid)


def run_point(
    net: Emulation,
    s: Settings,
    point: Point,
    repeat: int,
    out_root: Path,
    compute: dict[str, float],
) -> dict:
    collective, model, mbps, network = point
    iters = planned_iters(s, point, compute)
    dataset = dataset_of(s, model)
    nbytes = model_bytes(model, dataset)
    _, job, decision = modelled(s, point, nbytes, 0.0)
    with held_to_shares(net, decision) if network == ENFORCED else nullcontext():
        summary, load = measured_run(
            net,
            out_root,
            f"{collective}-{network}-{model}-{mbps:g}-{repeat}".replace(".", "_"),
            s.cpu,
            s.mem_mb,
            deadline_s=600 + 3 * s.budget_s,
            model=model,
            dataset=dataset,
            collective=WORKLOAD_COLLECTIVE[collective],
            **({"flows": worker_flows(job)} if collective == "custom" else {}),
            target_acc=1.0,
            eval_every=iters,
            max_iters=iters,
            batch_size=s.batch_size,
            seed=s.seed,
            threads=1,
            max_seconds=10 * s.budget_s + 300,
            timeout_s=300,
        )
    return {
        "collective": collective,
        "network": network,
        "model": model,
        "dataset": dataset,
        "synthetic": summary.synthetic,
        "mbps": mbps,
        "repeat": repeat,
        "iters": summary.iters,
        "gradient_bytes": summary.gradient_bytes,
        "iter_s": summary.iter_s,
        "compute_s": summary.compute_s,
        "comm_s": summary.comm_s,
        "payload_tx_bytes": summary.payload_tx_bytes,
        "iface_tx_bytes": summary.iface_tx_bytes,
        "flow_bytes": summary.flow_bytes,
        "startup_s": summary.startup_s,
        "container_startup_s": summary.container_startup_s,
        **load,
    }


def collective_of(r: dict) -> str:
    """A run's collective; runs written before the collective checks were all rings."""
    return r.get("collective", "ring")


def network_of(r: dict) -> str:
    """A run's network; runs written before the enforced checks were all best-effort."""
    return r.get("network", BEST_EFFORT)


def point_of(r: dict) -> Point:
    return (collective_of(r), r["model"], r["mbps"], network_of(r))


def aggregate(runs: list[dict]) -> list[dict]:
    """One point per (collective, model, rate, network): the median over its repeats (load
    spikes of the shared machine hit single runs; rounds interleave the points so no point gets
    only bad ones). Bytes per flow are the same in every repeat: the first's are kept."""
    points = []
    for key in dict.fromkeys(point_of(r) for r in runs):
        mine = [r for r in runs if point_of(r) == key]
        point = {
            **mine[0],
            "collective": key[0],
            "network": key[3],
            "repeats": len(mine),
            "iter_s_range": [min(r["iter_s"] for r in mine), max(r["iter_s"] for r in mine)],
        }
        for field in ("iter_s", "compute_s", "comm_s", "cpu_busy_background", "cpu_busy_during"):
            point[field] = float(np.median([r[field] for r in mine]))
        point.pop("repeat", None)
        points.append(point)
    return points


def fit(runs: list[dict], s: Settings, fit_points: set[float]) -> tuple[IterationModel, dict]:
    """Least squares (relative errors, so small and large models weigh alike) of the model's
    collective time over the fit points; overhead = the median time outside compute and
    collective."""
    steps = collective_steps("ring", s.workers)
    pts = [
        r
        for r in runs
        if collective_of(r) == "ring"
        and network_of(r) == BEST_EFFORT
        and r["model"] in s.models
        and r["mbps"] in fit_points
    ]

    def model_of(p: np.ndarray) -> IterationModel:
        return IterationModel(efficiency=p[0], per_message_latency_s=p[1], max_rate_mbps=p[2])

    def residuals(p: np.ndarray) -> np.ndarray:
        m = model_of(p)
        return np.array(
            [m.communication_s(_flows(r, s), steps=steps) / r["comm_s"] - 1 for r in pts]
        )

    # min(B·efficiency, max rate) has a kink and the latency term can stand in for the stack
    # bound, so one start may end in a poor local minimum (measured: cost 0.129 vs 0.0086):
    # start from several points and keep the best. The stack-bound rate starts at or below the
    # best goodput any run achieved: above every link's goodput, min() would hide it from the
    # optimiser (zero gradient).
    best_mbps = max(
        flow_bytes("ring", s.workers, r["gradient_bytes"]) * 8 / r["comm_s"] / 1e6 for r in pts
    )
    result = min(
        (
            least_squares(
                residuals,
                x0=[0.9, latency, rate],
                bounds=([0.2, 0.0, 1.0], [1.2, 1.0, 10 * s.reference_mbps]),
            )
            for latency in (0.0, 0.0005, 0.005)
            for rate in (0.9 * best_mbps, best_mbps)
        ),
        key=lambda r: r.cost,
    )
    model = model_of(result.x)
    if model.max_rate_mbps >= s.reference_mbps * model.efficiency:
        model = replace(model, max_rate_mbps=float("inf"))  # the stack never limited a run
    # What an iteration spends outside its compute and its collective (measured, not fitted).
    outside = [r["iter_s"] - r["compute_s"] - r["comm_s"] for r in pts]
    model = replace(
        model,
        efficiency=float(model.efficiency),
        per_message_latency_s=float(model.per_message_latency_s),
        max_rate_mbps=float(model.max_rate_mbps),
        overhead_s=float(np.median(outside)),
    )
    return model, {
        "fit_points_mbps": sorted(fit_points),
        "n": len(pts),
        "comm_relative_errors": [round(float(v), 3) for v in result.fun],
        "outside_s": [round(float(v), 4) for v in outside],
    }


def compute_profile(runs: list[dict], s: Settings) -> dict[str, float]:
    return {
        r["model"]: r["compute_s"]
        for r in runs
        if collective_of(r) == "ring"
        and network_of(r) == BEST_EFFORT
        and r["mbps"] == s.reference_mbps
    }


def _flows(r: dict, s: Settings) -> list[tuple[float, float]]:
    return [(flow_bytes("ring", s.workers, r["gradient_bytes"]), r["mbps"])]


# Every flow at its whole share and nothing else: the bandwidth bound of a collective's flows
# (for the ring 2(k-1)/k·M/B, `perfmodel.ring_lower_bound_s`).
BANDWIDTH_ONLY = IterationModel(efficiency=1.0, per_message_latency_s=0.0)


def check(runs: list[dict], s: Settings, model: IterationModel) -> list[dict]:
    """Every point outside the fit: its iteration time vs the fitted model's prediction, and
    the bytes each flow carried vs the model's."""
    compute = compute_profile(runs, s)
    rows = []
    for r in runs:
        if r["mbps"] in (s.reference_mbps, *s.fit_mbps):
            continue
        point = point_of(r)
        cluster, job, decision = modelled(
            s, point, r["gradient_bytes"], compute[r["model"]] * s.cpu
        )
        predicted = predicted_iteration_s(cluster, job, decision, model)
        bound = predicted_iteration_s(
            cluster, replace(job, compute_s=0.0), decision, BANDWIDTH_ONLY
        )
        rows.append(
            {
                "collective": r["collective"],
                "network": point[3],
                "model": r["model"],
                "dataset": r.get("dataset", s.dataset),
                "synthetic": r.get("synthetic", False),  # random data of the dataset's shapes
                "mbps": r["mbps"],
                "measured_iter_s": r["iter_s"],
                "predicted_iter_s": predicted,
                "error": r["iter_s"] / predicted - 1,
                "within_tolerance": abs(r["iter_s"] / predicted - 1) <= s.tolerance,
                "measured_comm_s": r["comm_s"],
                "lower_bound_s": bound,
                "comm_over_bound": r["comm_s"] / bound,
                "measured_compute_s": r["compute_s"],
                "profile_compute_s": compute[r["model"]],
                "steps": collective_steps(job.collective, len(job.tasks)),
                **bytes_check(r.get("flow_bytes"), job, s.bytes_tolerance),
            }
        )
    return rows


def bytes_check(measured: dict[str, float] | None, job: Job, tolerance: float) -> dict:
    """Each flow's bytes per iteration as its source counted them ("SRC>DST" ranks,
    `JobSummary.flow_bytes`) vs the job model's (`perfmodel.flow_bytes`); `measured` is None
    for runs written before the worker counted them."""
    rank = {t.name: i for i, t in enumerate(job.tasks)}
    modelled_bytes = {f"{rank[f.src]}>{rank[f.dst]}": f.bytes_per_iter for f in job.flows}
    if measured is None:
        return {"model_flow_bytes": modelled_bytes, "measured_flow_bytes": None}
    error = max(abs(measured.get(k, 0.0) / v - 1) for k, v in modelled_bytes.items())
    stray = sorted(k for k, v in measured.items() if v > 0 and k not in modelled_bytes)
    return {
        "model_flow_bytes": modelled_bytes,
        "measured_flow_bytes": measured,
        "flow_bytes_error": error,  # the largest relative difference over the model's flows
        "unmodelled_flows": stray,  # pairs that talked outside the model
        "flow_bytes_within_tolerance": error <= tolerance and not stray,
    }


def print_tables(console: Console, rows: list[dict], model: IterationModel, s: Settings) -> None:
    console.print(
        f"fitted IterationModel: efficiency={model.efficiency:.3f} "
        f"per_message_latency_s={model.per_message_latency_s:.5f} "
        f"overhead_s={model.overhead_s:.4f} max_rate_mbps={model.max_rate_mbps:.1f}"
    )
    for label in dict.fromkeys(checked_as(r) for r in rows):
        table = Table(title=f"{label}, k={s.workers}, {s.cpu} cores/worker")
        for col in (
            "model",
            "B Mbit/s",
            "measured iter s",
            "predicted s",
            "error",
            "comm s",
            "bound s",
            "comm/bound",
            "bytes/flow vs model",
        ):
            table.add_column(col, justify="right")
        for r in rows:
            if checked_as(r) != label:
                continue
            err = f"{r['error']:+.1%}"
            if r["measured_flow_bytes"] is None:
                flows = "–"
            else:
                flows = f"±{r['flow_bytes_error']:.1%}" + (
                    f" + {', '.join(r['unmodelled_flows'])}" if r["unmodelled_flows"] else ""
                )
                flows = flows if r["flow_bytes_within_tolerance"] else f"[red]{flows}[/red]"
            table.add_row(
                r["model"] if r["dataset"] == s.dataset else f"{r['model']} ({r['dataset']})",
                f"{r['mbps']:g}",
                f"{r['measured_iter_s']:.3f}",
                f"{r['predicted_iter_s']:.3f}",
                err if r["within_tolerance"] else f"[red]{err}[/red]",
                f"{r['measured_comm_s']:.3f}",
                f"{r['lower_bound_s']:.3f}",
                f"{r['comm_over_bound']:.2f}",
                flows,
            )
        console.print(table)


def checked_as(row: dict) -> str:
    """A check row's collective, and its network when enforced: 'all-to-all (enforced)'."""
    enforced = network_of(row) == ENFORCED
    return f"{row['collective']} ({ENFORCED})" if enforced else row["collective"]


def within(rows: list[dict]) -> dict[str, str]:
    """Per collective and network (`checked_as`): check points within the tolerance, of all."""
    counts = {}
    for c in dict.fromkeys(checked_as(r) for r in rows):
        mine = [r for r in rows if checked_as(r) == c]
        counts[c] = f"{sum(r['within_tolerance'] for r in mine)}/{len(mine)}"
    return counts


def mbps_list(text: str) -> tuple[float, ...]:
    """argparse type: comma-separated rates in Mbit/s, all > 0."""
    try:
        values = tuple(float(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated Mbit/s, got '{text}'") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"rates must be > 0, got '{text}'")
    return values


def names_of(choices: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """argparse type: a non-empty comma-separated list of some of `choices`."""

    def parse(text: str) -> tuple[str, ...]:
        values = tuple(x for x in text.split(",") if x)
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(bad) or 'empty list'} (expected some of {', '.join(choices)})"
            )
        return values

    return parse


def parse_args(argv: list[str] | None) -> tuple[Settings, Path, dict | None]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = Settings()

    p.add_argument(
        "--models", type=names_of(tuple(MODELS)), default=d.models, help="the ring fit's models"
    )
    p.add_argument(
        "--collectives",
        type=names_of(COLLECTIVES),
        default=d.collectives,
        help="checked on the --check-models at --collective-mbps",
    )
    p.add_argument("--check-models", type=names_of(tuple(MODELS)), default=d.check_models)
    p.add_argument(
        "--networks",
        type=names_of(NETWORKS),
        default=d.networks,
        help="how the collective checks' flows share the links: TCP alone, or each held to its share",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--cpu", type=float, default=d.cpu, help="cores per worker")
    p.add_argument("--reference-mbps", type=float, default=d.reference_mbps)
    p.add_argument("--fit-mbps", type=mbps_list, default=d.fit_mbps)
    p.add_argument("--check-mbps", type=mbps_list, default=d.check_mbps)
    p.add_argument("--collective-mbps", type=mbps_list, default=d.collective_mbps)
    p.add_argument("--budget-s", type=float, default=d.budget_s)
    p.add_argument("--check-budget-s", type=float, default=d.check_budget_s)
    p.add_argument(
        "--repeats",
        type=int,
        default=d.repeats,
        help="rounds over all points (interleaved); each point's median is used",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "calibration.json")
    p.add_argument(
        "--refit",
        action="store_true",
        help="measure nothing: fit and check again the runs already in --out",
    )
    a = p.parse_args(argv)
    if a.refit:
        try:
            saved = json.loads(a.out.read_text())
            d = Settings(
                **{k: tuple(v) if isinstance(v, list) else v for k, v in saved["settings"].items()}
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            p.error(f"--refit: cannot read the runs in {a.out}: {e}")
        return d, a.out, saved
    if not 0.05 <= a.cpu <= (os.cpu_count() or 1):
        p.error(f"--cpu must be in [0.05, {os.cpu_count()}], got {a.cpu}")
    if a.budget_s <= 0 or a.check_budget_s <= 0 or a.reference_mbps <= 0 or a.repeats < 1:
        p.error("--budget-s, --check-budget-s and --reference-mbps must be > 0, --repeats ≥ 1")
    overlap = {a.reference_mbps, *a.fit_mbps} & {*a.check_mbps, *a.collective_mbps}
    if overlap:
        p.error(
            f"--reference-mbps/--fit-mbps and --check-mbps/--collective-mbps share "
            f"{sorted(overlap)}: the check would not be independent of the fit"
        )
    return (
        replace(
            d,
            models=a.models,
            collectives=a.collectives,
            check_models=a.check_models,
            seed=a.seed,
            cpu=a.cpu,
            reference_mbps=a.reference_mbps,
            fit_mbps=a.fit_mbps,
            check_mbps=a.check_mbps,
            collective_mbps=a.collective_mbps,
            networks=a.networks,
            budget_s=a.budget_s,
            check_budget_s=a.check_budget_s,
            repeats=a.repeats,
        ),
        a.out,
        None,
    )


def main(argv: list[str] | None = None) -> int:
    s, out, saved = parse_args(argv)
    if saved is not None:
        return report(s, out, saved["machine"], saved["runs"], saved.get("elapsed_min", 0.0))
    require_root("the testbed creates bridges, namespaces, containers")
    console = Console(width=None if sys.stdout.isatty() else 130)
    info = machine()
    plan = planned_points(s)
    runs: list[dict] = []
    t0 = time.monotonic()

    def save() -> None:
        """Written after every run, so an interrupted calibration keeps what it measured."""
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(
                {
                    "machine": info,
                    "settings": asdict(s),
                    "runs": runs,
                    "complete": False,
                    "elapsed_min": round((time.monotonic() - t0) / 60, 1),
                },
                indent=1,
            )
        )

    try:
        topo = bottleneck_topology(s.workers, s.cpu, s.mem_mb, s.reference_mbps)
        with Emulation(topo) as net, tempfile.TemporaryDirectory(prefix="calib-") as tmp:
            rates = dict.fromkeys(p[2] for p in plan)
            for repeat, mbps in itertools.product(range(s.repeats), rates):
                set_bottleneck(net, mbps)
                for point in (p for p in plan if p[2] == mbps):
                    compute = compute_profile(runs, s)
                    runs.append(run_point(net, s, point, repeat, Path(tmp), compute))
                    save()
                    r = runs[-1]
                    console.print(
                        f"[{repeat}] B={mbps:g} Mbit/s {point[0]} {point[1]} ({point[3]}): "
                        f"{r['iters']} iters, "
                        f"iter {r['iter_s']:.3f} s (compute {r['compute_s']:.3f}, "
                        f"comm {r['comm_s']:.3f}); others' load "
                        f"{r['cpu_busy_background']:.0%}, during "
                        f"{r['cpu_busy_during']:.0%}"
                    )
    except (EmulationError, TestbedJobError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; the emulation was torn down", file=sys.stderr)
        return 130

    return report(s, out, info, runs, (time.monotonic() - t0) / 60)


def report(s: Settings, out: Path, info: dict, runs: list[dict], elapsed_min: float) -> int:
    """Fit, check, print and write the calibration of measured `runs`."""
    console = Console(width=None if sys.stdout.isatty() else 130)
    points = aggregate(runs)
    fitted, fit_info = fit(points, s, {s.reference_mbps, *s.fit_mbps})
    rows = check(points, s, fitted)
    print_tables(console, rows, fitted, s)
    counts = within(rows)
    for collective, count in counts.items():
        console.print(f"{collective}: {count} check points within ±{s.tolerance:.0%}")
    counted = [r for r in rows if r["measured_flow_bytes"] is not None]
    console.print(
        f"bytes per flow as modelled (±{s.bytes_tolerance:.0%}, no other pair): "
        f"{sum(r['flow_bytes_within_tolerance'] for r in counted)}/{len(counted)} check points"
    )
    compute = compute_profile(points, s)
    profiles = {
        m: {
            "dataset": dataset_of(s, m),
            "gradient_bytes": model_bytes(m, dataset_of(s, m)),
            "compute_s_at_cpu": compute[m],
            "reference_core_s": compute[m] * s.cpu,
        }
        for m in compute
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": info,
                "settings": asdict(s),
                "fitted_model": asdict(fitted),
                "fit": fit_info,
                "profiles": profiles,
                "check": rows,
                "within_tolerance": counts,
                "points": points,
                "runs": runs,
                "complete": True,
                "elapsed_min": round(elapsed_min, 1),
            },
            indent=1,
        )
    )
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
