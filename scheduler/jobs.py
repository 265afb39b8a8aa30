"""Jobs: builders for the logical communication graphs and the job YAML format (random jobs are in
`instances`, the Alibaba trace's in `trace`).

The YAML format is documented in docs/scheduler.md ("Job files"). A file holds one job (a
mapping) or several (`jobs: [...]`); a folder is every *.yaml/*.yml in it, in name order. Every
problem raises `JobError` naming the file, the job, the field and what was expected.

Task names: ring/tree/all-to-all/custom-from-builders use w0..w{k-1}; star adds a `ps` task.
Bytes per flow per iteration follow `perfmodel.flow_bytes` for the collective.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.worker import flow_option, tree_parent
from topologies import is_number, read_yaml

from .model import Job, LogicalFlow, Resources, Task
from .perfmodel import COLLECTIVES, flow_bytes

BYTES_PER_PARAM = 4  # float32 parameters/gradients
MAX_TASKS = 256  # per job: an all-to-all job of k workers has k(k-1) flows
# job collective -> the worker's --collective (workloads.collectives)
WORKLOAD_COLLECTIVE = {
    "ring": "ring",
    "star": "ps",
    "tree": "tree",
    "all-to-all": "all-to-all",
    "custom": "custom",
}


class JobError(ValueError):
    """A job description that cannot be used; the message says where and why."""


# --- builders -------------------------------------------------------------------------------------
def worker_tasks(k: int, demand: Resources) -> list[Task]:
    if k < 1:
        raise ValueError(f"a job needs at least one worker, got {k}")
    return [Task(f"w{i}", demand) for i in range(k)]


def flows_between(
    pairs: Iterable[tuple[str, str]], demand_mbps: float, nbytes: float
) -> list[LogicalFlow]:
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


def ring_job(
    name: str,
    workers: int,
    demand: Resources,
    model_bytes: float,
    demand_mbps: float,
    **fields: Any,
) -> Job:
    """DDP ring all-reduce: w_i -> w_{i-1 mod k} (`ring_pairs`), 2(k-1)/k·M bytes per flow."""
    tasks = worker_tasks(workers, demand)
    pairs = ring_pairs([t.name for t in tasks])
    return Job(
        name,
        tasks,
        flows_between(pairs, demand_mbps, flow_bytes("ring", workers, model_bytes)),
        collective="ring",
        model_bytes=model_bytes,
        **fields,
    )


def star_job(
    name: str,
    workers: int,
    demand: Resources,
    model_bytes: float,
    demand_mbps: float,
    ps_demand: Resources | None = None,
    **fields: Any,
) -> Job:
    """Parameter server: task `ps` plus k workers; w_i -> ps (gradients) and ps -> w_i (weights),
    M bytes each."""
    tasks = [Task("ps", ps_demand or demand)] + worker_tasks(workers, demand)
    pairs = [p for i in range(workers) for p in ((f"w{i}", "ps"), ("ps", f"w{i}"))]
    return Job(
        name,
        tasks,
        flows_between(pairs, demand_mbps, flow_bytes("star", workers, model_bytes)),
        collective="star",
        model_bytes=model_bytes,
        **fields,
    )


def tree_job(
    name: str,
    workers: int,
    demand: Resources,
    model_bytes: float,
    demand_mbps: float,
    **fields: Any,
) -> Job:
    """Binary reduction tree rooted at w0 (parent of w_i is w_{(i-1)//2}, `tree_parent`, the
    worker's tree); reduce up and broadcast down, M bytes per flow and direction."""
    tasks = worker_tasks(workers, demand)
    pairs = [
        p
        for i in range(1, workers)
        for p in ((f"w{i}", f"w{tree_parent(i)}"), (f"w{tree_parent(i)}", f"w{i}"))
    ]
    return Job(
        name,
        tasks,
        flows_between(pairs, demand_mbps, flow_bytes("tree", workers, model_bytes)),
        collective="tree",
        model_bytes=model_bytes,
        **fields,
    )


def all_to_all_job(
    name: str,
    workers: int,
    demand: Resources,
    model_bytes: float,
    demand_mbps: float,
    **fields: Any,
) -> Job:
    """Direct all-reduce: every ordered pair of workers, 2M/k bytes per flow."""
    tasks = worker_tasks(workers, demand)
    pairs = [(f"w{i}", f"w{j}") for i in range(workers) for j in range(workers) if i != j]
    return Job(
        name,
        tasks,
        flows_between(pairs, demand_mbps, flow_bytes("all-to-all", workers, model_bytes)),
        collective="all-to-all",
        model_bytes=model_bytes,
        **fields,
    )


def custom_job(
    name: str, tasks: list[Task], flows: list[LogicalFlow], model_bytes: float = 0.0, **fields: Any
) -> Job:
    """Any directed graph between tasks (cycles allowed)."""
    return Job(name, tasks, flows, collective="custom", model_bytes=model_bytes, **fields)


BUILDERS = {"ring": ring_job, "star": star_job, "tree": tree_job, "all-to-all": all_to_all_job}


def worker_flows(job: Job) -> list[str]:
    """A custom job's flows as the worker's `--flows` values: task i is rank i, each flow's
    bytes per iteration (`protocol.worker.flow_option`)."""
    rank_of = {t.name: r for r, t in enumerate(job.tasks)}
    return [flow_option(rank_of[f.src], rank_of[f.dst], round(f.bytes_per_iter)) for f in job.flows]


# --- YAML job files -------------------------------------------------------------------------------
JOB_KEYS = {
    "name",
    "collective",
    "workers",
    "task",
    "ps",
    "model_params",
    "model_bytes",
    "compute_s",
    "gradient_buckets",
    "demand_mbps",
    "iterations",
    "target_accuracy",
    "priority",
    "submit_time",
    "deadline",
    "image",
    "command",
    "workload",
    "tasks",
    "flows",
}
RES_KEYS = {"cpu", "mem_mb", "gpu"}


class _Where:
    """Where in which file a value came from, for error messages."""

    def __init__(self, file: str, job: str):
        self.file, self.job = file, job

    def error(self, field: str, expected: str, got: Any = ...) -> JobError:
        tail = "" if got is ... else f", got {got!r}"
        where = f"field '{field}': " if field else ""
        return JobError(f"{self.file}: {self.job}: {where}expected {expected}{tail}")


def _num(
    d: dict,
    key: str,
    w: _Where,
    field: str,
    *,
    default: Any = ...,
    lo: float | None = None,
    strict: bool = False,
    integer: bool = False,
) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise w.error(field, "a value (required)")
        return default
    v = d[key]
    kind = "an integer" if integer else "a number"
    if not is_number(v) or (integer and not isinstance(v, int)):
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
            raise w.error(
                f"{field}.{unknown[0]}" if field else unknown[0],
                f"one of the known keys ({', '.join(sorted(allowed))})",
            )
    return v


def _resources(v: Any, w: _Where, field: str) -> Resources:
    d = _mapping(v, w, field, RES_KEYS)
    return Resources(
        float(_num(d, "cpu", w, f"{field}.cpu", lo=0, strict=True)),
        float(_num(d, "mem_mb", w, f"{field}.mem_mb", default=0, lo=0)),
        float(_num(d, "gpu", w, f"{field}.gpu", default=0, lo=0)),
    )


def _workload(v: Any, w: _Where, collective: str) -> dict:
    d = _mapping(v, w, "workload")
    for key, val in d.items():
        if not isinstance(key, str):
            raise w.error("workload", "string keys", key)
        if not (val is None or isinstance(val, (str, int, float, bool, list))):
            raise w.error(f"workload.{key}", "a scalar or a list", val)
    if (
        "collective" in d
        and collective in WORKLOAD_COLLECTIVE
        and d["collective"] != WORKLOAD_COLLECTIVE[collective]
    ):
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
        model_bytes = float(
            _num(
                d,
                "model_bytes",
                w,
                "model_bytes",
                default=None if collective == "custom" else ...,
                lo=0,
            )
            or 0.0
        )
    fields: dict[str, Any] = dict(
        compute_s=float(_num(d, "compute_s", w, "compute_s", default=0.0, lo=0)),
        iterations=_num(d, "iterations", w, "iterations", default=None, lo=1, integer=True),
        target_accuracy=_num(
            d, "target_accuracy", w, "target_accuracy", default=None, lo=0, strict=True
        ),
        priority=_num(d, "priority", w, "priority", default=0, integer=True),
        submit_time=float(_num(d, "submit_time", w, "submit_time", default=0.0, lo=0)),
        deadline=_num(d, "deadline", w, "deadline", default=None, lo=0, strict=True),
        image=_str(d, "image", w, "image", default=""),
        command=_str(d, "command", w, "command", default=""),
        workload=_workload(d.get("workload") or {}, w, collective),
    )
    if "gradient_buckets" in d:
        if collective != "ring":
            raise w.error(
                "gradient_buckets", f"no such field for a {collective} job (DDP buckets a ring's)"
            )
        fields["ddp_buckets"] = _buckets(d["gradient_buckets"], w)
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
            raise w.error(
                key, f"no such field for a {collective} job (only custom jobs list tasks and flows)"
            )
    if "ps" in d and collective != "star":
        raise w.error("ps", "no such field for a non-star job")
    workers = _num(d, "workers", w, "workers", lo=1, integer=True)
    if workers > MAX_TASKS:
        raise w.error("workers", f"at most {MAX_TASKS}", workers)
    demand = _resources(d.get("task"), w, "task")
    mbps = float(_num(d, "demand_mbps", w, "demand_mbps", lo=0, strict=True))
    if collective == "star":
        ps = _resources(d["ps"], w, "ps") if "ps" in d else None
        return star_job(name, workers, demand, model_bytes, mbps, ps_demand=ps, **fields)
    return BUILDERS[collective](name, workers, demand, model_bytes, mbps, **fields)


def _buckets(v: Any, w: _Where) -> tuple[float, ...]:
    if not isinstance(v, list) or not v or not all(is_number(b) and b > 0 for b in v):
        raise w.error("gradient_buckets", "a non-empty list of bytes > 0, in DDP's launch order", v)
    return tuple(float(b) for b in v)


def _custom(d: dict, w: _Where, name: str, model_bytes: float, fields: dict) -> Job:
    if not isinstance(d.get("tasks"), list) or not d["tasks"]:
        raise w.error("tasks", "a non-empty list of {name, cpu, mem_mb, gpu}", d.get("tasks"))
    if len(d["tasks"]) > MAX_TASKS:
        raise w.error("tasks", f"at most {MAX_TASKS} tasks", len(d["tasks"]))
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
        mbps = _num(
            fl,
            "demand_mbps",
            w,
            f"{f}.demand_mbps",
            default=... if default_mbps is None else default_mbps,
            lo=0,
            strict=True,
        )
        nbytes = _num(fl, "bytes_per_iter", w, f"{f}.bytes_per_iter", default=model_bytes, lo=0)
        flows.append(LogicalFlow(src, dst, float(mbps), float(nbytes)))
    return custom_job(name, tasks, flows, model_bytes, **fields)


@dataclass(frozen=True)
class JobDocument:
    """One job as a file gives it: where it came from, its mapping (what travels to the Master)
    and the job parsed from it."""

    source: str
    mapping: dict
    job: Job


def load_job_documents(path: str | Path) -> list[JobDocument]:
    """Every job of a YAML file (one job, or `jobs: [...]`) or of every *.yaml/*.yml of a
    folder, each parsed once. Job names must be unique across everything loaded."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
        if not files:
            raise JobError(f"{path}: folder has no .yaml/.yml job files")
    elif path.exists():
        files = [path]
    else:
        raise JobError(f"{path}: no such job file or folder")
    docs: list[JobDocument] = []
    seen: dict[str, Path] = {}
    for file in files:
        doc = read_yaml(file, JobError)
        if isinstance(doc, dict) and "jobs" in doc:
            if set(doc) != {"jobs"} or not isinstance(doc["jobs"], list) or not doc["jobs"]:
                raise JobError(
                    f"{file}: expected `jobs:` with a non-empty list of jobs and "
                    "nothing else at the top level"
                )
            new = [
                JobDocument(str(file), d, parse_job(d, str(file), i))
                for i, d in enumerate(doc["jobs"])
            ]
        else:
            new = [JobDocument(str(file), doc, parse_job(doc, str(file)))]
        for d in new:
            if d.job.name in seen:
                raise JobError(
                    f"{file}: job '{d.job.name}': field 'name': expected a unique "
                    f"job name, already used in {seen[d.job.name]}"
                )
            seen[d.job.name] = file
        docs += new
    return docs


def load_jobs(path: str | Path) -> list[Job]:
    """The jobs of `load_job_documents(path)`."""
    return [d.job for d in load_job_documents(path)]
