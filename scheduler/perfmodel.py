"""The iteration-time model: the one place that predicts how long a training iteration takes.

Used by the simulator, the schedulers' rewards and objectives, and compared against the testbed's
measurements (`experiments/calibrate_perfmodel.py` fits `IterationModel`'s constants).

    iteration = slowest task's compute + collective time / efficiency + fixed overhead

less what a ring's DDP hides of its all-reduce under the backward pass (`overlapped_s`).

The collective is expressed as bytes per logical flow per iteration, grouped into the phases the
worker (`workloads.collectives`) runs one after the other (`collective_phases`). The flows of a
phase run in parallel, so a phase takes as long as its slowest flow, and the collective as long
as its phases together: Σ_phases max_{f in phase} bytes_f / rate_f. For gloo's ring all-reduce
of M bytes over k workers (one phase: the ring is pipelined) each rank sends 2(k-1)/k·M to its
ring neighbour, which gives the bandwidth bound 2(k-1)/k · M / b_min. The star sends every
worker's gradient to the server and only then the average back (two phases), the tree sums up
level by level and brings the average down the same way (2⌊log2 k⌋ phases); all-to-all (its
flow's 2M/k covers both of its rounds on the pair) and a custom graph are one phase. The
calibration (`experiments/calibrate_perfmodel.py`) checks every collective's prediction on the
testbed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeVar

from protocol.worker import tree_parent

COLLECTIVES = ("ring", "star", "tree", "all-to-all", "custom")
# Written by experiments/calibrate_perfmodel.py (measured on the testbed, with the machine).
CALIBRATION_FILE = Path(__file__).resolve().parent.parent / "results" / "calibration.json"
Transfer = tuple[float, float]  # one flow of a collective: (bytes per iteration, rate in Mbit/s)
T = TypeVar("T")
# The backward pass's share of a training step's compute. Measured on one core here (forward and
# backward at batch 32, workloads.models): ResNet-18 0.67, the large MLP 0.58, MobileNetV2 0.55,
# the Transformer 0.45. The ring's ResNet-18 prediction moves by about 1 % between 0.55 and 0.67,
# so one value serves every model.
BACKWARD_SHARE = 2 / 3


def flow_bytes(collective: str, workers: int, model_bytes: float) -> float:
    """Bytes each logical flow carries per iteration for the given collective.

    ring: reduce-scatter + all-gather, 2(k-1)/k·M per ring edge;
    star (parameter server): M up and M down per worker, each direction its own flow;
    tree: M per tree edge and direction (reduce up, broadcast down);
    all-to-all (direct all-reduce): each pair exchanges the peer's 1/k share twice, 2M/k;
    custom: M per flow (the job file may give explicit per-flow bytes instead).
    """
    k = max(workers, 1)
    if collective == "ring":
        return 2.0 * (k - 1) / k * model_bytes if k > 1 else 0.0
    if collective in ("star", "tree", "custom"):
        return float(model_bytes)
    if collective == "all-to-all":
        return 2.0 * model_bytes / k
    raise ValueError(
        f"unknown collective '{collective}' (expected one of {', '.join(COLLECTIVES)})"
    )


def ring_lower_bound_s(workers: int, model_bytes: float, b_min_mbps: float) -> float:
    """The physical lower bound of a ring all-reduce: 2(k-1)/k · M / b_min."""
    return flow_bytes("ring", workers, model_bytes) * 8 / (b_min_mbps * 1e6)


def compute_time_s(compute_s: float, speed: float, cpu: float) -> float:
    """Compute time of a task: `compute_s` is seconds of work per iteration on one reference
    core (speed 1.0); the task gets `cpu` cores on a node of relative speed `speed`."""
    return compute_s / (max(speed, 1e-9) * max(cpu, 1e-9))


@dataclass(frozen=True)
class IterationModel:
    """The constants of the iteration-time model.

    The defaults are round values, not a fit: the simulator, the schedulers and the trained
    policies (CES-PPO's checkpoint, TapFinger's, EADE's) all use them, so that a decision does
    not depend on which machine last ran the calibration. `experiments/calibrate_perfmodel.py`
    measures the constants on the testbed and `from_calibration()` reads them; the committed fit
    (results/calibration.json, the development VM) is efficiency 0.972, 0.68 ms per message,
    0.5 ms of overhead and 544 Mbit/s of goodput per worker (earlier fits gave 0.965, 1.35 ms
    and 431 Mbit/s, 0.944, 0.94 ms and 389 Mbit/s, 0.871, 1.40 ms and 342 Mbit/s, and 0.947,
    0.41 ms and 492 Mbit/s: the latency and the stack bound move with the VM's load and the
    testbed's shaping). Against it the defaults' transfers take 6 % more (efficiency 0.92),
    each message 0.18 ms less, and there is no stack bound: above about 560 Mbit/s per flow
    (544 / 0.972) the defaults predict collectives much faster than that machine ran them.
    """

    efficiency: float = 0.92  # goodput / granted rate of a metered/shaped TCP flow
    per_message_latency_s: float = 0.0005  # per collective step (framing, syscalls, RTT)
    overhead_s: float = 0.0  # per iteration, outside compute and communication
    # The goodput one worker's stack sustains however fast the link (CPU-bound: gloo, TCP and,
    # on the testbed, the userspace switch): granting more than this buys nothing.
    max_rate_mbps: float = float("inf")

    @classmethod
    def from_calibration(cls, path: str | Path = CALIBRATION_FILE) -> IterationModel:
        """The constants `experiments/calibrate_perfmodel.py` fitted on the testbed."""
        try:
            fitted = json.loads(Path(path).read_text())["fitted_model"]
            return cls(**{f.name: float(fitted[f.name]) for f in fields(cls)})
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{path}: no fitted IterationModel ({e}); run experiments/calibrate_perfmodel.py"
            ) from e

    def transfer_s(self, flows: Iterable[Transfer]) -> float:
        """Time of one phase: (bytes, rate_mbps) pairs running in parallel take as long as the
        slowest. A flow with a zero rate never finishes: the result is infinite."""
        worst = 0.0
        for nbytes, rate_mbps in flows:
            if nbytes <= 0:
                continue
            if rate_mbps <= 0:
                return float("inf")
            goodput_mbps = min(rate_mbps * self.efficiency, self.max_rate_mbps)
            worst = max(worst, nbytes * 8 / (goodput_mbps * 1e6))
        return worst

    def communication_s(
        self, *phases: Iterable[Transfer], steps: int = 1, rtt_s: float = 0.0
    ) -> float:
        """Collective time for its sequential phases (`collective_phases`), each an iterable of
        (bytes, rate_mbps) pairs running in parallel: the phases' `transfer_s` one after the
        other (one phase: its slowest flow).

        `steps` is the number of sequential messages the collective needs (2(k-1) for a ring),
        each paying the per-message latency plus the path's round-trip time.
        """
        total = 0.0
        for phase in phases:
            total += self.transfer_s(phase)
        if total == 0.0:
            return 0.0
        return total + steps * (self.per_message_latency_s + rtt_s)

    def iteration_s(
        self,
        compute_times_s: Iterable[float],
        *phases: Iterable[Transfer],
        steps: int = 1,
        rtt_s: float = 0.0,
        buckets: Sequence[float] = (),
    ) -> float:
        """Slowest task's compute + the collective's phases (`communication_s`) + overhead; the
        collective in DDP's gradient `buckets` (a ring's `Job.ddp_buckets`) overlaps the
        backward pass as `overlapped_s` says."""
        return (
            overlapped_s(
                max(compute_times_s, default=0.0),
                self.communication_s(*phases, steps=steps, rtt_s=rtt_s),
                buckets,
            )
            + self.overhead_s
        )


def overlapped_s(compute_s: float, comm_s: float, buckets: Sequence[float] = ()) -> float:
    """A training step's compute and its all-reduce of `comm_s` together, when DDP hands the
    gradient to gloo in `buckets` (their bytes, in the order DDP launches them): bucket i is
    all-reduced once the backward pass has produced it — the gradient's bytes taken to come at
    an even pace through the backward pass (`BACKWARD_SHARE` of the compute, after the forward
    pass) — and after bucket i-1 (gloo runs them one after the other), each taking its share of
    `comm_s`. With one bucket, or none given, nothing overlaps: compute + comm_s. (The ring's
    ResNet-18 measured 3.57 s an iteration with 2.83 s of compute and 2.80 s of all-reduce in
    the same run: docs/workloads.md.)"""
    total = float(sum(buckets))
    if len(buckets) < 2 or total <= 0 or comm_s <= 0:
        return compute_s + comm_s
    forward, backward = compute_s * (1 - BACKWARD_SHARE), compute_s * BACKWARD_SHARE
    produced = done = 0.0
    for size in buckets:
        produced += size / total
        done = max(done, forward + backward * produced) + comm_s * size / total
    return done


def collective_phases(collective: str, flows: Iterable[tuple[int, int, T]]) -> list[list[T]]:
    """A collective's flows grouped into the phases the worker (`workloads.collectives`) runs one
    after the other, in that order; each phase's flows run at once. `flows` are (source rank,
    destination rank, item) with task i of the job rank i (`scheduler.jobs`); each phase is the
    items of its flows, in the order given. Any subset of the job's flows will do (the
    inter-node ones): a phase none of them is in is left out.

    star: every worker's gradient to the server (the end all the flows share: rank 0, the `ps`
    task of `scheduler.jobs.star_job`), and only then the average back: [into the server],
    [out of it];
    tree (`protocol.worker.tree_parent`): each rank sends its subtree's sum to its parent once
    its children's have arrived, and the average comes down the same way: the up phases of
    levels ⌊log2 k⌋ .. 1, then the down phases of levels 1 .. ⌊log2 k⌋, the flows between depth
    d and d-1 being level d's (a leaf higher up than the deepest level is counted with its level,
    as if it waited for the level below);
    ring (gloo's ring is pipelined), all-to-all (the flow's 2M/k carries both of its rounds on
    the pair) and custom (every flow at once): one phase.
    """
    flows = list(flows)
    if collective in ("ring", "all-to-all", "custom"):
        return [[item for _, _, item in flows]]
    keyed: dict[tuple[int, int], list[T]] = {}
    if collective == "star":
        shared = set.intersection(*({s, d} for s, d, _ in flows)) if flows else {0}
        if not shared:
            raise ValueError("a star's flows share no end (its server)")
        server = min(shared)  # two tasks only: either end gives the same two phases
        for _, d, item in flows:
            keyed.setdefault((0 if d == server else 1, 0), []).append(item)
    elif collective == "tree":
        for s, d, item in flows:
            if s > 0 and tree_parent(s) == d:
                key = (0, -_depth(s))  # up: the deepest level first
            elif d > 0 and tree_parent(d) == s:
                key = (1, _depth(d))  # down: the shallowest first
            else:
                raise ValueError(f"flow {s}>{d} is not an edge of the tree (tree_parent)")
            keyed.setdefault(key, []).append(item)
    else:
        raise ValueError(
            f"unknown collective '{collective}' (expected one of {', '.join(COLLECTIVES)})"
        )
    return [keyed[k] for k in sorted(keyed)]


def _depth(rank: int) -> int:
    """A rank's depth in the binary tree of `tree_parent` (the root, rank 0, is at depth 0)."""
    return (rank + 1).bit_length() - 1


def collective_steps(collective: str, workers: int) -> int:
    """Sequential message rounds of one collective of `workers` tasks (the latency term of the
    model), as the worker runs it (`workloads.collectives`):

    ring: gloo's reduce-scatter then all-gather, k-1 steps each: 2(k-1);
    star: the workers' gradients to the server, then the average back: 2 (the server task is
    one of the `workers`);
    tree: the binary tree of `protocol.worker.tree_parent` has depth ⌊log2 k⌋; the sums go up
    level by level and the average comes down the same way: 2⌊log2 k⌋;
    all-to-all: every share at once to its owner, then every averaged share at once to the
    others: 2;
    custom: every flow's bytes sent at once, each task averaging what it received: 1.
    """
    k = max(workers, 1)
    if k == 1:
        return 0
    if collective == "ring":
        return 2 * (k - 1)
    if collective == "tree":
        return 2 * (k.bit_length() - 1)
    if collective == "custom":
        return 1
    if collective in ("star", "all-to-all"):
        return 2
    raise ValueError(
        f"unknown collective '{collective}' (expected one of {', '.join(COLLECTIVES)})"
    )
