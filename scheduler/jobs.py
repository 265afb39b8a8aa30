"""Jobs: builders for the logical communication graphs, the job YAML format, random jobs, and the
Alibaba GPU-trace (cluster-trace-gpu-v2020) loaders.

The YAML format is documented in docs/scheduler.md ("Job files"). A file holds one job (a
mapping) or several (`jobs: [...]`); a folder is every *.yaml/*.yml in it, in name order. Every
problem raises `JobError` naming the file, the job, the field and what was expected.

Task names: ring/tree/all-to-all/custom-from-builders use w0..w{k-1}; star adds a `ps` task.
Bytes per flow per iteration follow `perfmodel.flow_bytes` for the collective.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import yaml

from .model import Cluster, Job, LogicalFlow, Resources, Task
from .perfmodel import COLLECTIVES, flow_bytes

BYTES_PER_PARAM = 4  # float32 parameters/gradients
WORKLOAD_COLLECTIVE = {"ring": "ring", "star": "ps"}  # job collective -> the worker's --collective


class JobError(ValueError):
    """A job description that cannot be used; the message says where and why."""


# --- builders -------------------------------------------------------------------------------------
def _workers(k: int, demand: Resources) -> list[Task]:
    if k < 1:
        raise ValueError(f"a job needs at least one worker, got {k}")
    return [Task(f"w{i}", demand) for i in range(k)]


def _flows(pairs: Iterable[tuple[str, str]], demand_mbps: float,
           nbytes: float) -> list[LogicalFlow]:
    return [LogicalFlow(a, b, demand_mbps, nbytes) for a, b in pairs]


def ring_pairs(names: list[str]) -> list[tuple[str, str]]:
    """The directed flows of a ring all-reduce over tasks in rank order: task i sends to task
    i-1 (mod k), the direction gloo's ring sends in (rank r → rank r-1; measured per TCP
    connection, docs/workloads.md), so that the grants land on the links the gradients cross."""
    k = len(names)
    if k < 2:
        return []
    if k == 2:
        return [(names[0], names[1]), (names[1], names[0])]
    return [(names[i], names[i - 1]) for i in range(k)]  # names[-1] closes the ring


def ring_job(name: str, workers: int, demand: Resources, model_bytes: float, demand_mbps: float,
             **fields: Any) -> Job:
    """DDP ring all-reduce: w_i -> w_{i-1 mod k} (`ring_pairs`), 2(k-1)/k·M bytes per flow."""
    tasks = _workers(workers, demand)
    pairs = ring_pairs([t.name for t in tasks])
    return Job(name, tasks, _flows(pairs, demand_mbps, flow_bytes("ring", workers, model_bytes)),
               collective="ring", model_bytes=model_bytes, **fields)


def star_job(name: str, workers: int, demand: Resources, model_bytes: float, demand_mbps: float,
             ps_demand: Resources | None = None, **fields: Any) -> Job:
    """Parameter server: task `ps` plus k workers; w_i -> ps (gradients) and ps -> w_i (weights),
    M bytes each."""
    tasks = [Task("ps", ps_demand or demand)] + _workers(workers, demand)
    pairs = [p for i in range(workers) for p in ((f"w{i}", "ps"), ("ps", f"w{i}"))]
    return Job(name, tasks, _flows(pairs, demand_mbps, flow_bytes("star", workers, model_bytes)),
               collective="star", model_bytes=model_bytes, **fields)


def tree_job(name: str, workers: int, demand: Resources, model_bytes: float, demand_mbps: float,
             **fields: Any) -> Job:
    """Binary reduction tree rooted at w0 (parent of w_i is w_{(i-1)//2}); reduce up and broadcast
    down, M bytes per flow and direction."""
    tasks = _workers(workers, demand)
    pairs = [p for i in range(1, workers)
             for p in ((f"w{i}", f"w{(i - 1) // 2}"), (f"w{(i - 1) // 2}", f"w{i}"))]
    return Job(name, tasks, _flows(pairs, demand_mbps, flow_bytes("tree", workers, model_bytes)),
               collective="tree", model_bytes=model_bytes, **fields)


def all_to_all_job(name: str, workers: int, demand: Resources, model_bytes: float,
                   demand_mbps: float, **fields: Any) -> Job:
    """Direct all-reduce: every ordered pair of workers, 2M/k bytes per flow."""
    tasks = _workers(workers, demand)
    pairs = [(f"w{i}", f"w{j}") for i in range(workers) for j in range(workers) if i != j]
    return Job(name, tasks,
               _flows(pairs, demand_mbps, flow_bytes("all-to-all", workers, model_bytes)),
               collective="all-to-all", model_bytes=model_bytes, **fields)


def custom_job(name: str, tasks: list[Task], flows: list[LogicalFlow], model_bytes: float = 0.0,
               **fields: Any) -> Job:
    """Any directed graph between tasks (cycles allowed)."""
    return Job(name, tasks, flows, collective="custom", model_bytes=model_bytes, **fields)


BUILDERS = {"ring": ring_job, "star": star_job, "tree": tree_job, "all-to-all": all_to_all_job}


# --- random jobs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobDistribution:
    """What `random_job` draws from (all independent):
    collective  ring 50 %, star 20 %, tree 10 %, all-to-all 10 %, custom 10 % (a ring plus chords
                w_i -> w_{i+2}: a cyclic graph no DAG model expresses);
    workers     uniform integer in [min_workers, max_workers];
    per task    cpu uniform from `cpu_choices`, memory from `mem_choices` (MB), no GPU;
    model       parameters log-uniform in [min_params, max_params] (float32: 4 bytes each);
    compute     log-uniform seconds of one reference core per iteration in [min_compute_s,
                max_compute_s];
    bandwidth   per-flow demand log-uniform in [min_mbps, max_mbps];
    iterations  uniform integer in [min_iterations, max_iterations]; priority uniform 0..2."""
    min_workers: int = 2
    max_workers: int = 6
    cpu_choices: tuple[float, ...] = (0.25, 0.5, 1.0)
    mem_choices: tuple[float, ...] = (256.0, 512.0, 1024.0)
    min_params: float = 1e5
    max_params: float = 1e7
    min_compute_s: float = 0.01
    max_compute_s: float = 1.0
    min_mbps: float = 10.0
    max_mbps: float = 500.0
    min_iterations: int = 100
    max_iterations: int = 2000


COLLECTIVE_WEIGHTS = {"ring": 0.5, "star": 0.2, "tree": 0.1, "all-to-all": 0.1, "custom": 0.1}


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def random_job(rng: np.random.Generator, name: str = "job",
               dist: JobDistribution = JobDistribution(), collective: str | None = None) -> Job:
    """A job drawn from `dist` (see `JobDistribution`); `collective` forces one collective."""
    collective = collective or str(rng.choice(list(COLLECTIVE_WEIGHTS),
                                              p=list(COLLECTIVE_WEIGHTS.values())))
    k = int(rng.integers(dist.min_workers, dist.max_workers + 1))
    demand = Resources(float(rng.choice(dist.cpu_choices)), float(rng.choice(dist.mem_choices)))
    params = round(_log_uniform(rng, dist.min_params, dist.max_params))
    model_bytes = float(BYTES_PER_PARAM * params)
    mbps = round(_log_uniform(rng, dist.min_mbps, dist.max_mbps), 1)
    fields = dict(compute_s=round(_log_uniform(rng, dist.min_compute_s, dist.max_compute_s), 4),
                  iterations=int(rng.integers(dist.min_iterations, dist.max_iterations + 1)),
                  priority=int(rng.integers(0, 3)))
    if collective == "custom":
        tasks = _workers(k, demand)
        pairs = {(f"w{i}", f"w{(i + 1) % k}") for i in range(k)} | \
                {(f"w{i}", f"w{(i + 2) % k}") for i in range(k)}
        pairs = sorted((a, b) for a, b in pairs if a != b)
        return custom_job(name, tasks, _flows(pairs, mbps, model_bytes), model_bytes, **fields)
    return BUILDERS[collective](name, k, demand, model_bytes, mbps, **fields)


# --- YAML job files -------------------------------------------------------------------------------
JOB_KEYS = {"name", "collective", "workers", "task", "ps", "model_params", "model_bytes",
            "compute_s", "demand_mbps", "iterations", "target_accuracy", "priority",
            "submit_time", "deadline", "image", "command", "workload", "tasks", "flows"}
RES_KEYS = {"cpu", "mem_mb", "gpu"}


class _Where:
    """Where in which file a value came from, for error messages."""

    def __init__(self, file: str, job: str):
        self.file, self.job = file, job

    def error(self, field: str, expected: str, got: Any = ...) -> JobError:
        tail = "" if got is ... else f", got {got!r}"
        where = f"field '{field}': " if field else ""
        return JobError(f"{self.file}: {self.job}: {where}expected {expected}{tail}")


def _num(d: dict, key: str, w: _Where, field: str, *, default: Any = ..., lo: float | None = None,
         strict: bool = False, integer: bool = False) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise w.error(field, "a value (required)")
        return default
    v = d[key]
    kind = "an integer" if integer else "a number"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) \
            or (integer and not isinstance(v, int)):
        raise w.error(field, kind, v)
    if lo is not None and (v <= lo if strict else v < lo):
        raise w.error(field, f"{kind} {'>' if strict else '>='} {lo:g}", v)
    return v


def _str(d: dict, key: str, w: _Where, field: str, default: Any = ...) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise w.error(field, "a string (required)")
        return default
    if not isinstance(d[key], str) or not d[key].strip():
        raise w.error(field, "a non-empty string", d[key])
    return d[key]


def _mapping(v: Any, w: _Where, field: str, allowed: set[str] | None = None) -> dict:
    if not isinstance(v, dict):
        raise w.error(field, "a mapping", v)
    if allowed is not None:
        unknown = sorted(str(k) for k in v if k not in allowed)
        if unknown:
            raise w.error(f"{field}.{unknown[0]}" if field else unknown[0],
                          f"one of the known keys ({', '.join(sorted(allowed))})")
    return v


def _resources(v: Any, w: _Where, field: str) -> Resources:
    d = _mapping(v, w, field, RES_KEYS)
    return Resources(float(_num(d, "cpu", w, f"{field}.cpu", lo=0, strict=True)),
                     float(_num(d, "mem_mb", w, f"{field}.mem_mb", default=0, lo=0)),
                     float(_num(d, "gpu", w, f"{field}.gpu", default=0, lo=0)))


def _workload(v: Any, w: _Where, collective: str) -> dict:
    d = _mapping(v, w, "workload")
    for key, val in d.items():
        if not isinstance(key, str):
            raise w.error("workload", "string keys", key)
        if not (val is None or isinstance(val, (str, int, float, bool, list))):
            raise w.error(f"workload.{key}", "a scalar or a list", val)
    if "collective" in d and collective in WORKLOAD_COLLECTIVE \
            and d["collective"] != WORKLOAD_COLLECTIVE[collective]:
        want = WORKLOAD_COLLECTIVE[collective]
        raise w.error("workload.collective", f"'{want}' for a {collective} job", d["collective"])
    return dict(d)


def parse_job(doc: Any, file: str = "<job>", index: int | None = None) -> Job:
    """One job from its YAML mapping (see docs/scheduler.md)."""
    label = f"jobs[{index}]" if index is not None else "job"
    if isinstance(doc, dict) and isinstance(doc.get("name"), str):
        label = f"{label} '{doc['name']}'" if index is not None else f"job '{doc['name']}'"
    w = _Where(file, label)
    d = _mapping(doc, w, "", JOB_KEYS)
    name = _str(d, "name", w, "name")
    collective = _str(d, "collective", w, "collective")
    if collective not in COLLECTIVES:
        raise w.error("collective", f"one of {', '.join(COLLECTIVES)}", collective)
    if "model_params" in d and "model_bytes" in d:
        raise w.error("model_params", "either model_params or model_bytes, not both")
    if "model_params" in d:
        model_bytes = BYTES_PER_PARAM * float(_num(d, "model_params", w, "model_params", lo=0))
    else:
        model_bytes = float(_num(d, "model_bytes", w, "model_bytes",
                                 default=None if collective == "custom" else ..., lo=0) or 0.0)
    fields: dict[str, Any] = dict(
        compute_s=float(_num(d, "compute_s", w, "compute_s", default=0.0, lo=0)),
        iterations=_num(d, "iterations", w, "iterations", default=None, lo=1, integer=True),
        target_accuracy=_num(d, "target_accuracy", w, "target_accuracy", default=None, lo=0,
                             strict=True),
        priority=_num(d, "priority", w, "priority", default=0, integer=True),
        submit_time=float(_num(d, "submit_time", w, "submit_time", default=0.0, lo=0)),
        deadline=_num(d, "deadline", w, "deadline", default=None, lo=0, strict=True),
        image=_str(d, "image", w, "image", default=""),
        command=_str(d, "command", w, "command", default=""),
        workload=_workload(d.get("workload") or {}, w, collective))
    if fields["target_accuracy"] is not None and fields["target_accuracy"] > 1:
        raise w.error("target_accuracy", "a fraction in (0, 1]", fields["target_accuracy"])
    if fields["iterations"] is None and fields["target_accuracy"] is None:
        raise w.error("iterations", "iterations or target_accuracy (at least one)")
    if collective == "custom":
        for key in ("workers", "task", "ps"):
            if key in d:
                raise w.error(key, "no such field for a custom job (give tasks and flows)")
        return _custom(d, w, name, model_bytes, fields)
    for key in ("tasks", "flows"):
        if key in d:
            raise w.error(key, f"no such field for a {collective} job (only custom jobs list "
                               "tasks and flows)")
    if "ps" in d and collective != "star":
        raise w.error("ps", "no such field for a non-star job")
    workers = _num(d, "workers", w, "workers", lo=1, integer=True)
    demand = _resources(d.get("task"), w, "task")
    mbps = float(_num(d, "demand_mbps", w, "demand_mbps", lo=0, strict=True))
    if collective == "star":
        ps = _resources(d["ps"], w, "ps") if "ps" in d else None
        return star_job(name, workers, demand, model_bytes, mbps, ps_demand=ps, **fields)
    return BUILDERS[collective](name, workers, demand, model_bytes, mbps, **fields)


def _custom(d: dict, w: _Where, name: str, model_bytes: float, fields: dict) -> Job:
    if not isinstance(d.get("tasks"), list) or not d["tasks"]:
        raise w.error("tasks", "a non-empty list of {name, cpu, mem_mb, gpu}", d.get("tasks"))
    tasks: list[Task] = []
    for i, t in enumerate(d["tasks"]):
        f = f"tasks[{i}]"
        t = _mapping(t, w, f, RES_KEYS | {"name"})
        tname = _str(t, "name", w, f"{f}.name")
        if any(x.name == tname for x in tasks):
            raise w.error(f"{f}.name", "a task name not used before", tname)
        tasks.append(Task(tname, _resources({k: v for k, v in t.items() if k != "name"}, w, f)))
    default_mbps = _num(d, "demand_mbps", w, "demand_mbps", default=None, lo=0, strict=True)
    if not isinstance(d.get("flows", []), list):
        raise w.error("flows", "a list of {src, dst, demand_mbps, bytes_per_iter}", d["flows"])
    names = {t.name for t in tasks}
    flows: list[LogicalFlow] = []
    for i, fl in enumerate(d.get("flows", [])):
        f = f"flows[{i}]"
        fl = _mapping(fl, w, f, {"src", "dst", "demand_mbps", "bytes_per_iter"})
        src, dst = _str(fl, "src", w, f"{f}.src"), _str(fl, "dst", w, f"{f}.dst")
        for end, v in (("src", src), ("dst", dst)):
            if v not in names:
                raise w.error(f"{f}.{end}", f"a task name ({', '.join(sorted(names))})", v)
        if src == dst:
            raise w.error(f, "a flow between two different tasks", f"{src}->{dst}")
        if any(x.src == src and x.dst == dst for x in flows):
            raise w.error(f, "each src->dst pair once", f"{src}->{dst}")
        mbps = _num(fl, "demand_mbps", w, f"{f}.demand_mbps",
                    default=... if default_mbps is None else default_mbps, lo=0, strict=True)
        nbytes = _num(fl, "bytes_per_iter", w, f"{f}.bytes_per_iter", default=model_bytes, lo=0)
        flows.append(LogicalFlow(src, dst, float(mbps), float(nbytes)))
    return custom_job(name, tasks, flows, model_bytes, **fields)


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except OSError as e:
        raise JobError(f"{path}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise JobError(f"{path}: not valid YAML: {e}") from None


def load_jobs(path: str | Path) -> list[Job]:
    """Jobs from a YAML file (one job, or `jobs: [...]`) or from every *.yaml/*.yml of a folder.
    Job names must be unique across everything loaded."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        if not files:
            raise JobError(f"{path}: folder has no .yaml/.yml job files")
    elif path.exists():
        files = [path]
    else:
        raise JobError(f"{path}: no such job file or folder")
    jobs: list[Job] = []
    seen: dict[str, Path] = {}
    for file in files:
        doc = _read_yaml(file)
        if isinstance(doc, dict) and "jobs" in doc:
            if set(doc) != {"jobs"} or not isinstance(doc["jobs"], list) or not doc["jobs"]:
                raise JobError(f"{file}: expected `jobs:` with a non-empty list of jobs and "
                               "nothing else at the top level")
            new = [parse_job(d, str(file), i) for i, d in enumerate(doc["jobs"])]
        else:
            new = [parse_job(doc, str(file))]
        for job in new:
            if job.name in seen:
                raise JobError(f"{file}: job '{job.name}': field 'name': expected a unique job "
                               f"name, already used in {seen[job.name]}")
            seen[job.name] = file
        jobs += new
    return jobs


# --- Alibaba GPU trace (cluster-trace-gpu-v2020) --------------------------------------------------
TASK_COLUMNS = ("job_name", "task_name", "inst_num", "status", "start_time", "end_time",
                "plan_cpu", "plan_mem", "plan_gpu", "gpu_type")
MACHINE_COLUMNS = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")


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
                raise JobError(f"{path}:{line}: expected {len(columns)} columns "
                               f"({', '.join(columns)}), got {len(row)}")
            yield line, dict(zip(columns, (c.strip() for c in row)))


def _csv_num(path: Path, line: int, row: dict[str, str], col: str, *, empty: float | None = None,
             lo: float = 0.0) -> float | None:
    v = row[col]
    if v == "" or v.lower() == "nan":
        if empty is None and col not in ("start_time", "end_time"):
            raise JobError(f"{path}:{line}: column '{col}': expected a number >= {lo:g}, "
                           "got an empty value")
        return empty
    try:
        x = float(v)
    except ValueError:
        raise JobError(f"{path}:{line}: column '{col}': expected a number, got {v!r}") from None
    if not math.isfinite(x) or x < lo:
        raise JobError(f"{path}:{line}: column '{col}': expected a number >= {lo:g}, got {v!r}")
    return x


def load_alibaba_tasks(path: str | Path, *, model_bytes: float = 4e6, demand_mbps: float = 100.0,
                       compute_s: float = 1.0, statuses: tuple[str, ...] | None = ("Terminated",),
                       limit: int | None = None) -> list[Job]:
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
                raise JobError(f"{path}:{line}: column 'inst_num': expected an integer >= 1, "
                               f"got {row['inst_num']!r}")
            cpu = _csv_num(path, line, row, "plan_cpu", lo=0) / 100
            if cpu <= 0:
                raise JobError(f"{path}:{line}: column 'plan_cpu': expected a number > 0 "
                               f"(% of a core), got {row['plan_cpu']!r}")
            demand = Resources(cpu, _csv_num(path, line, row, "plan_mem", empty=0.0) * 1024,
                               _csv_num(path, line, row, "plan_gpu", empty=0.0) / 100)
            for i in range(int(inst)):
                tname = f"{row['task_name']}{i}"
                if any(t.name == tname for t in tasks):
                    raise JobError(f"{path}:{line}: job {job_name}: task '{row['task_name']}' "
                                   "appears twice")
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
        fields = dict(compute_s=compute_s, submit_time=start - first,
                      iterations=max(1, round(duration / compute_s)) if duration else None,
                      workload={"source": "alibaba-gpu-v2020", "duration_s": duration,
                                "gpu_type": ",".join(gpu_types)})
        if ps_names and len(ps_names) < len(tasks):
            workers = [t.name for t in tasks if t.name not in ps_names]
            pairs = [p for wk in workers for ps in ps_names for p in ((wk, ps), (ps, wk))]
            job = Job(job_name, tasks, _flows(pairs, demand_mbps, model_bytes),
                      collective="star" if len(ps_names) == 1 else "custom",
                      model_bytes=model_bytes, **fields)
        else:
            pairs = ring_pairs([t.name for t in tasks])
            nbytes = flow_bytes("ring", len(tasks), model_bytes)
            job = Job(job_name, tasks, _flows(pairs, demand_mbps, nbytes), collective="ring",
                      model_bytes=model_bytes, **fields)
        jobs.append(job)
        if limit is not None and len(jobs) >= limit:
            break
    if not jobs:
        raise JobError(f"{path}: no task rows"
                       + (f" with status in {statuses}" if statuses else ""))
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
        machines.append(Machine(row["machine"], row["gpu_type"], cpu, mem,
                                _csv_num(path, line, row, "cap_gpu")))
    if not machines:
        raise JobError(f"{path}: no machine rows")
    return machines


def apply_machine_spec(cluster: Cluster, machines: list[Machine],
                       rng: np.random.Generator) -> Cluster:
    """A copy of the (idle) cluster whose compute nodes get the capacities of machines sampled
    uniformly with replacement from the table. Scaling: cpu and memory are multiplied by
    (the topology's mean capacity / the table's mean capacity) so the cluster keeps its total size
    while taking the table's heterogeneity (a 96-core machine stays 2× a 48-core one); GPUs are
    whole devices and keep the table's count. Speed is the topology's."""
    if cluster.jobs or any(u != Resources() for u in cluster.used.values()):
        raise ValueError("apply_machine_spec needs an idle cluster (no allocations)")
    nodes = cluster.compute_nodes()
    out = cluster.copy()
    cpu_scale = np.mean([cluster.capacity(n).cpu for n in nodes]) / \
        np.mean([m.cpu for m in machines])
    mem_scale = np.mean([cluster.capacity(n).mem_mb for n in nodes]) / \
        np.mean([m.mem_gb for m in machines])
    for n, i in zip(nodes, rng.integers(0, len(machines), size=len(nodes))):
        m = machines[int(i)]
        out.graph.nodes[n].update(cpu=float(m.cpu * cpu_scale), mem_mb=float(m.mem_gb * mem_scale),
                                  gpu=float(m.gpu), machine=m.name)
    return out
