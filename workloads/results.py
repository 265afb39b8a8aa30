"""Reading the tasks' JSON lines back and summarising one job (used by experiments and tests)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

# Records every "type" must carry (the JSONL schema the experiments rely on).
SCHEMA: dict[str, tuple[str, ...]] = {
    "start": (
        "config",
        "host",
        "threads",
        "cpu_quota",
        "torch",
        "parameters",
        "gradient_bytes",
        "process_start",
        "container_start",
    ),
    "data": ("dataset", "synthetic", "train", "test", "shard_eval"),
    "iter": (
        "iter",
        "loss",
        "iter_s",
        "compute_s",
        "comm_s",
        "tx_bytes",
        "rx_bytes",
        "payload_tx_bytes",
        "payload_rx_bytes",
        "payload_tx_by_peer",
        "payload_rx_by_peer",
    ),
    "eval": ("iter", "elapsed_s", "eval_s", "accuracy"),
    "end": (
        "reached_target",
        "tta_s",
        "tta_iter",
        "target_acc",
        "stop_reason",
        "synthetic",
        "iters",
        "train_s",
        "clock_start",
        "init_s",
        "startup_s",
        "container_startup_s",
        "jct_s",
        "param_sum",
    ),
    "error": ("message",),
}
# The first iterations pay one-off costs (DDP rebuilds its buckets, caches warm up).
WARMUP_ITERS = 3


class LogError(ValueError):
    pass


@dataclass
class TaskLog:
    path: Path
    start: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    iters: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    end: dict | None = None
    error: dict | None = None

    @property
    def rank(self) -> int:
        return self.start["config"]["rank"]


def read_task_log(path: str | Path) -> TaskLog:
    """Parse one task's JSONL, checking every record against SCHEMA (LogError says where)."""
    path = Path(path)
    log = TaskLog(path)
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise LogError(f"{path}:{n}: not JSON ({e})") from e
        kind = rec.get("type")
        if kind not in SCHEMA:
            raise LogError(f"{path}:{n}: unknown record type {kind!r}")
        missing = [k for k in SCHEMA[kind] if k not in rec]
        if missing:
            raise LogError(f"{path}:{n}: '{kind}' record lacks {', '.join(missing)}")
        if kind == "iter":
            log.iters.append(rec)
        elif kind == "eval":
            log.evals.append(rec)
        else:
            setattr(log, kind, rec)
    if not log.start:
        raise LogError(f"{path}: no 'start' record")
    return log


@dataclass(frozen=True)
class JobSummary:
    model: str
    dataset: str
    collective: str
    world_size: int
    parameters: int
    gradient_bytes: int
    iters: int
    reached_target: bool
    tta_s: float | None  # the job reaches the target when its last task does
    tta_iter: int | None
    jct_s: float
    startup_s: float  # process start → first iteration, slowest task
    container_startup_s: float | None
    iter_s: float  # medians after warm-up; iteration of the job = its slowest task
    compute_s: float
    comm_s: float
    payload_tx_bytes: float  # per iteration, the busiest task
    iface_tx_bytes: float | None  # per iteration, the busiest interface
    # per iteration and flow ("SRC>DST" ranks), as its source counted it: compare with the
    # model's `scheduler.perfmodel.flow_bytes`
    flow_bytes: dict[str, float]
    synthetic: bool  # random data of the dataset's shapes: iteration times only

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def summarize_job(logs: list[TaskLog]) -> JobSummary:
    if not logs:
        raise LogError("no task logs")
    unfinished = [str(t.path) for t in logs if t.end is None]
    if unfinished:
        raise LogError(f"tasks did not finish: {', '.join(unfinished)}")
    cfg = logs[0].start["config"]

    def worst_median(key: str) -> float:
        return max(_median([r[key] for r in t.iters[WARMUP_ITERS:] or t.iters]) for t in logs)

    iface = [
        [r["tx_bytes"] for r in t.iters[WARMUP_ITERS:] or t.iters if r["tx_bytes"] is not None]
        for t in logs
    ]
    reached = all(t.end["reached_target"] for t in logs)
    container = [t.end["container_startup_s"] for t in logs]
    return JobSummary(
        model=cfg["model"],
        dataset=cfg["dataset"],
        collective=cfg["collective"],
        world_size=cfg["world_size"],
        parameters=logs[0].start["parameters"],
        gradient_bytes=logs[0].start["gradient_bytes"],
        iters=max(t.end["iters"] for t in logs),
        reached_target=reached,
        tta_s=max(t.end["tta_s"] for t in logs) if reached else None,
        tta_iter=max(t.end["tta_iter"] for t in logs) if reached else None,
        jct_s=max(t.end["jct_s"] for t in logs),
        startup_s=max(t.end["startup_s"] for t in logs),
        container_startup_s=None if None in container else max(container),
        iter_s=worst_median("iter_s"),
        compute_s=worst_median("compute_s"),
        comm_s=worst_median("comm_s"),
        payload_tx_bytes=worst_median("payload_tx_bytes"),
        iface_tx_bytes=max(_median(x) for x in iface) if all(iface) else None,
        flow_bytes={
            f"{t.rank}>{peer}": _median(
                [r["payload_tx_by_peer"].get(peer, 0) for r in t.iters[WARMUP_ITERS:] or t.iters]
            )
            for t in logs
            for peer in sorted({p for r in t.iters for p in r["payload_tx_by_peer"]}, key=int)
        },
        synthetic=any(t.end["synthetic"] for t in logs),
    )


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def read_job(paths: list[str | Path]) -> JobSummary:
    return summarize_job([read_task_log(p) for p in paths])
