"""The Alibaba GPU trace (cluster-trace-gpu-v2020): its task table as jobs, its machine table as
node capacities. Every problem raises `JobError` naming the file, the line and the column."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .jobs import JobError, flows_between, ring_pairs
from .model import Cluster, Job, Resources, Task
from .perfmodel import flow_bytes

TASK_COLUMNS = (
    "job_name",
    "task_name",
    "inst_num",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "gpu_type",
)


MACHINE_COLUMNS = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")
# Alibaba's PAI machine table (scheduler/data/README.md)
MACHINE_TABLE = Path(__file__).resolve().parent / "data" / "pai_machine_spec.csv"


def _csv_rows(path: Path, columns: tuple[str, ...]) -> Iterable[tuple[int, dict[str, str]]]:
    """(line number, row) for a trace CSV, with or without its header row."""
    try:
        fh = path.open(newline="")
    except OSError as e:
        raise JobError(f"{path}: cannot read: {e.strerror}") from None
    with fh:
        for line, row in enumerate(csv.reader(fh), start=1):
            if not row or (line == 1 and row[0].strip() == columns[0]):
                continue
            if len(row) != len(columns):
                raise JobError(
                    f"{path}:{line}: expected {len(columns)} columns "
                    f"({', '.join(columns)}), got {len(row)}"
                )
            yield line, dict(zip(columns, (c.strip() for c in row)))


def _csv_num(
    path: Path,
    line: int,
    row: dict[str, str],
    col: str,
    *,
    empty: float | None = None,
    lo: float = 0.0,
) -> float | None:
    v = row[col]
    if v == "" or v.lower() == "nan":
        if empty is None and col not in ("start_time", "end_time"):
            raise JobError(
                f"{path}:{line}: column '{col}': expected a number >= {lo:g}, got an empty value"
            )
        return empty
    try:
        x = float(v)
    except ValueError:
        raise JobError(f"{path}:{line}: column '{col}': expected a number, got {v!r}") from None
    if not math.isfinite(x) or x < lo:
        raise JobError(f"{path}:{line}: column '{col}': expected a number >= {lo:g}, got {v!r}")
    return x


def load_alibaba_tasks(
    path: str | Path,
    *,
    model_bytes: float = 4e6,
    demand_mbps: float = 100.0,
    compute_s: float = 1.0,
    statuses: tuple[str, ...] | None = ("Terminated",),
    limit: int | None = None,
) -> list[Job]:
    """Jobs from a `pai_task_table` CSV (columns `TASK_COLUMNS`; plan_cpu in % of a core,
    plan_mem in GB, plan_gpu in % of a GPU).

    Each row is a task type with `inst_num` instances; the instances of one job_name form one job.
    The trace has no communication graph, so it is inferred: a job with a task type named `ps`
    (case-insensitive) is a parameter-server job (every other instance exchanges M bytes with every
    ps instance both ways; collective `star` for one ps, `custom` for several); any other job is a
    ring over its instances. Instances are named `<task_name><i>`. `submit_time` is the job's
    first start time relative to the earliest job in the file; `iterations` is the job's trace
    duration / `compute_s` (so at speed 1 with no communication it runs as long as in the trace;
    None, and no target accuracy either, when an end time is missing). Rows whose status is not
    in `statuses` are skipped (None keeps all). The trace's own figures go into `workload`
    (source, duration_s, gpu_type)."""
    path = Path(path)
    groups: dict[str, list[tuple[int, dict[str, str]]]] = {}
    for line, row in _csv_rows(path, TASK_COLUMNS):
        if statuses is not None and row["status"] not in statuses:
            continue
        if not row["job_name"] or not row["task_name"]:
            raise JobError(f"{path}:{line}: columns 'job_name' and 'task_name' must not be empty")
        groups.setdefault(row["job_name"], []).append((line, row))
    parsed = []
    for job_name, rows in groups.items():
        tasks, starts, ends, gpu_types, ps_names = [], [], [], set(), []
        for line, row in rows:
            inst = _csv_num(path, line, row, "inst_num", lo=1)
            if inst != int(inst):
                raise JobError(
                    f"{path}:{line}: column 'inst_num': expected an integer >= 1, "
                    f"got {row['inst_num']!r}"
                )
            cpu = _csv_num(path, line, row, "plan_cpu", lo=0) / 100
            if cpu <= 0:
                raise JobError(
                    f"{path}:{line}: column 'plan_cpu': expected a number > 0 "
                    f"(% of a core), got {row['plan_cpu']!r}"
                )
            demand = Resources(
                cpu,
                _csv_num(path, line, row, "plan_mem", empty=0.0) * 1024,
                _csv_num(path, line, row, "plan_gpu", empty=0.0) / 100,
            )
            for i in range(int(inst)):
                tname = f"{row['task_name']}{i}"
                if any(t.name == tname for t in tasks):
                    raise JobError(
                        f"{path}:{line}: job {job_name}: task '{row['task_name']}' appears twice"
                    )
                tasks.append(Task(tname, demand))
                if row["task_name"].lower() == "ps":
                    ps_names.append(tname)
            starts.append(_csv_num(path, line, row, "start_time"))
            ends.append(_csv_num(path, line, row, "end_time"))
            if row["gpu_type"]:
                gpu_types.add(row["gpu_type"])
        parsed.append((job_name, tasks, ps_names, starts, ends, sorted(gpu_types)))
    first = min((s for _, _, _, st, _, _ in parsed for s in st if s is not None), default=0.0)
    jobs = []

    def first_start(p: tuple) -> tuple[float, str]:
        return min((s for s in p[3] if s is not None), default=math.inf), p[0]

    for job_name, tasks, ps_names, starts, ends, gpu_types in sorted(parsed, key=first_start):
        known_starts = [s for s in starts if s is not None]
        start = min(known_starts, default=first)
        duration = (max(ends) - start) if None not in ends and known_starts else None
        fields = dict(
            compute_s=compute_s,
            submit_time=start - first,
            iterations=max(1, round(duration / compute_s)) if duration else None,
            workload={
                "source": "alibaba-gpu-v2020",
                "duration_s": duration,
                "gpu_type": ",".join(gpu_types),
            },
        )
        if ps_names and len(ps_names) < len(tasks):
            workers = [t.name for t in tasks if t.name not in ps_names]
            pairs = [p for wk in workers for ps in ps_names for p in ((wk, ps), (ps, wk))]
            job = Job(
                job_name,
                tasks,
                flows_between(pairs, demand_mbps, model_bytes),
                collective="star" if len(ps_names) == 1 else "custom",
                model_bytes=model_bytes,
                **fields,
            )
        else:
            pairs = ring_pairs([t.name for t in tasks])
            nbytes = flow_bytes("ring", len(tasks), model_bytes)
            job = Job(
                job_name,
                tasks,
                flows_between(pairs, demand_mbps, nbytes),
                collective="ring",
                model_bytes=model_bytes,
                **fields,
            )
        jobs.append(job)
        if limit is not None and len(jobs) >= limit:
            break
    if not jobs:
        raise JobError(
            f"{path}: no task rows" + (f" with status in {statuses}" if statuses else "")
        )
    return jobs


@dataclass(frozen=True)
class Machine:
    name: str
    gpu_type: str
    cpu: float  # cores
    mem_gb: float
    gpu: float


def load_machine_spec(path: str | Path) -> list[Machine]:
    """The trace's machine table (`MACHINE_COLUMNS`: machine, gpu_type, cap_cpu, cap_mem [GB],
    cap_gpu), header row optional."""
    path = Path(path)
    machines = []
    for line, row in _csv_rows(path, MACHINE_COLUMNS):
        cpu = _csv_num(path, line, row, "cap_cpu")
        mem = _csv_num(path, line, row, "cap_mem")
        if cpu <= 0 or mem <= 0:
            raise JobError(f"{path}:{line}: columns 'cap_cpu' and 'cap_mem': expected numbers > 0")
        machines.append(
            Machine(row["machine"], row["gpu_type"], cpu, mem, _csv_num(path, line, row, "cap_gpu"))
        )
    if not machines:
        raise JobError(f"{path}: no machine rows")
    return machines


def apply_machine_spec(
    cluster: Cluster, machines: list[Machine], rng: np.random.Generator
) -> Cluster:
    """A copy of the (idle) cluster whose compute nodes get the capacities of machines sampled
    uniformly with replacement from the table. Scaling: cpu and memory are multiplied by
    (the topology's mean capacity / the table's mean capacity) so the cluster keeps its total size
    while taking the table's heterogeneity (a 96-core machine stays 2× a 48-core one); GPUs are
    whole devices and keep the table's count. Speed is the topology's."""
    if cluster.jobs or any(u != Resources() for u in cluster.used.values()):
        raise ValueError("apply_machine_spec needs an idle cluster (no allocations)")
    nodes = cluster.compute_nodes()
    out = cluster.copy()
    cpu_scale = np.mean([cluster.capacity(n).cpu for n in nodes]) / np.mean(
        [m.cpu for m in machines]
    )
    mem_scale = np.mean([cluster.capacity(n).mem_mb for n in nodes]) / np.mean(
        [m.mem_gb for m in machines]
    )
    for n, i in zip(nodes, rng.integers(0, len(machines), size=len(nodes))):
        m = machines[int(i)]
        out.graph.nodes[n].update(
            cpu=float(m.cpu * cpu_scale),
            mem_mb=float(m.mem_gb * mem_scale),
            gpu=float(m.gpu),
            machine=m.name,
        )
    return out
