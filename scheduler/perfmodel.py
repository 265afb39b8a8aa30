"""The iteration-time model: the one place that predicts how long a training iteration takes.

Used by the simulator, the schedulers' rewards and objectives, and compared against the testbed's
measurements (`experiments/calibrate_perfmodel.py` fits `IterationModel`'s constants).

    iteration = slowest task's compute + collective time / efficiency + fixed overhead

The collective is expressed as bytes per logical flow per iteration; flows run in parallel, so the
collective takes as long as its slowest flow: max_f bytes_f / rate_f. For gloo's ring all-reduce
of M bytes over k workers each rank sends 2(k-1)/k·M to its ring neighbour, which gives the
bandwidth bound 2(k-1)/k · M / b_min.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

COLLECTIVES = ("ring", "star", "tree", "all-to-all", "custom")
# Written by experiments/calibrate_perfmodel.py (measured on the testbed, with the machine).
CALIBRATION_FILE = Path(__file__).resolve().parent.parent / "results" / "calibration.json"


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
    """Constants fitted against the testbed (see `experiments/calibrate_perfmodel.py`)."""

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

    def communication_s(
        self, flows: Iterable[tuple[float, float]], steps: int = 1, rtt_s: float = 0.0
    ) -> float:
        """Collective time for (bytes, rate_mbps) pairs running in parallel.

        `steps` is the number of sequential messages the collective needs (2(k-1) for a ring),
        each paying the per-message latency plus the path's round-trip time.
        A flow with a zero rate never finishes: the result is infinite.
        """
        worst = 0.0
        for nbytes, rate_mbps in flows:
            if nbytes <= 0:
                continue
            if rate_mbps <= 0:
                return float("inf")
            goodput_mbps = min(rate_mbps * self.efficiency, self.max_rate_mbps)
            worst = max(worst, nbytes * 8 / (goodput_mbps * 1e6))
        if worst == 0.0:
            return 0.0
        return worst + steps * (self.per_message_latency_s + rtt_s)

    def iteration_s(
        self,
        compute_times_s: Iterable[float],
        flows: Iterable[tuple[float, float]],
        steps: int = 1,
        rtt_s: float = 0.0,
    ) -> float:
        return (
            max(compute_times_s, default=0.0)
            + self.communication_s(flows, steps, rtt_s)
            + self.overhead_s
        )


def collective_steps(collective: str, workers: int) -> int:
    """Sequential message rounds of one collective (latency term of the model)."""
    k = max(workers, 1)
    if k == 1:
        return 0
    return {"ring": 2 * (k - 1), "star": 2, "tree": 2, "all-to-all": 2}.get(collective, 2)
