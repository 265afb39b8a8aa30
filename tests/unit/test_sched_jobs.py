"""Job builders, the job YAML format (and its errors), random jobs, the Alibaba trace loaders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import yaml

from scheduler.instances import JobDistribution, random_job
from scheduler.jobs import (
    JobError,
    all_to_all_job,
    load_jobs,
    parse_job,
    ring_job,
    star_job,
    tree_job,
)
from scheduler.model import Cluster, Resources
from scheduler.trace import (
    MACHINE_TABLE,
    apply_machine_spec,
    load_alibaba_tasks,
    load_machine_spec,
)
from topologies import load_topology

ROOT = Path(__file__).resolve().parents[2]
R = Resources(0.5, 256)


def pairs(job) -> set[tuple[str, str]]:
    return {(f.src, f.dst) for f in job.flows}


def test_builders_make_the_collectives_graphs():
    ring = ring_job("r", 4, R, 1e6, 50)
    assert pairs(ring) == {
        ("w0", "w3"),
        ("w1", "w0"),
        ("w2", "w1"),
        ("w3", "w2"),
    }  # gloo's direction
    assert {f.bytes_per_iter for f in ring.flows} == {1.5e6}  # 2(k-1)/k·M
    assert pairs(ring_job("r", 2, R, 1e6, 50)) == {("w0", "w1"), ("w1", "w0")}
    assert ring_job("r", 1, R, 1e6, 50).flows == []
    star = star_job("s", 3, R, 1e6, 50, ps_demand=Resources(1, 512))
    assert star.task("ps").demand == Resources(1, 512) and len(star.tasks) == 4
    assert pairs(star) == {p for i in range(3) for p in ((f"w{i}", "ps"), ("ps", f"w{i}"))}
    tree = tree_job("t", 5, R, 1e6, 50)
    assert pairs(tree) == {
        p
        for c, par in ((1, 0), (2, 0), (3, 1), (4, 1))
        for p in ((f"w{c}", f"w{par}"), (f"w{par}", f"w{c}"))
    }
    a2a = all_to_all_job("a", 4, R, 1e6, 50)
    assert len(a2a.flows) == 12 and {f.bytes_per_iter for f in a2a.flows} == {0.5e6}
    for job in (ring, star, tree, a2a):
        assert nx.is_strongly_connected(job.logical_graph())
        assert all(f.demand_mbps == 50 for f in job.flows)
    with pytest.raises(ValueError, match="at least one worker"):
        ring_job("r", 0, R, 1e6, 50)


def test_example_jobs_load():
    jobs = {j.name: j for j in load_jobs(ROOT / "workloads" / "jobs")}
    assert set(jobs) >= {"ring-cnn", "ring-mlp-large", "ps-star", "all-to-all", "custom-cycle"}
    assert jobs["ring-mlp-large"].model_bytes >= 4 * 2e6  # several million parameters
    assert jobs["ps-star"].collective == "star" and jobs["ps-star"].workload["collective"] == "ps"
    assert jobs["ring-cnn"].workload["model"] == "cnn"
    custom = jobs["custom-cycle"]
    assert not nx.is_directed_acyclic_graph(custom.logical_graph())
    ca = next(f for f in custom.flows if (f.src, f.dst) == ("c", "a"))
    ab = next(f for f in custom.flows if (f.src, f.dst) == ("a", "b"))
    assert (ca.demand_mbps, ca.bytes_per_iter) == (120, 4e6)
    assert (ab.demand_mbps, ab.bytes_per_iter) == (60, 2e6)  # the job's defaults


GOOD = {
    "name": "j",
    "collective": "ring",
    "workers": 3,
    "task": {"cpu": 0.5, "mem_mb": 256},
    "model_params": 1000,
    "compute_s": 0.01,
    "demand_mbps": 10,
    "iterations": 10,
}
CUSTOM = {
    "name": "c",
    "collective": "custom",
    "model_bytes": 100,
    "iterations": 5,
    "tasks": [{"name": "a", "cpu": 1}, {"name": "b", "cpu": 1}],
    "flows": [{"src": "a", "dst": "b", "demand_mbps": 5}],
}


def edit(base: dict, **changes) -> dict:
    doc = dict(base)
    for key, value in changes.items():
        if value is DROP:
            doc.pop(key)
        else:
            doc[key] = value
    return doc


DROP = object()


@pytest.mark.parametrize(
    "doc, message",
    [
        (edit(GOOD, name=DROP), "field 'name': expected a string (required)"),
        (edit(GOOD, collective="mesh"), "field 'collective': expected one of ring, star"),
        (edit(GOOD, workers=0), "field 'workers': expected an integer >= 1, got 0"),
        (edit(GOOD, workers=2.5), "field 'workers': expected an integer, got 2.5"),
        (edit(GOOD, task={"cpu": -1}), "field 'task.cpu': expected a number > 0, got -1"),
        (edit(GOOD, task={"cpu": "lots"}), "field 'task.cpu': expected a number, got 'lots'"),
        (
            edit(GOOD, task={"cpu": 1, "disk": 3}),
            "field 'task.disk': expected one of the known keys",
        ),
        (edit(GOOD, gpus=1), "field 'gpus': expected one of the known keys"),
        (edit(GOOD, model_bytes=5), "expected either model_params or model_bytes, not both"),
        (edit(GOOD, demand_mbps=0), "field 'demand_mbps': expected a number > 0, got 0"),
        (edit(GOOD, iterations=DROP), "field 'iterations': expected iterations or target_accuracy"),
        (edit(GOOD, target_accuracy=95), "field 'target_accuracy': expected a fraction in (0, 1]"),
        (edit(GOOD, tasks=[]), "field 'tasks': expected no such field for a ring job"),
        (edit(GOOD, ps={"cpu": 1}), "field 'ps': expected no such field for a non-star job"),
        (edit(GOOD, workload="cnn"), "field 'workload': expected a mapping, got 'cnn'"),
        (
            edit(GOOD, workload={"collective": "ps"}),
            "field 'workload.collective': expected 'ring' for a ring job, got 'ps'",
        ),
        (edit(GOOD, deadline=-5), "field 'deadline': expected a number > 0, got -5"),
        (
            edit(GOOD, gradient_buckets=[1e6, 0]),
            "field 'gradient_buckets': expected a non-empty list of bytes > 0",
        ),
        (
            edit(GOOD, collective="star", gradient_buckets=[1e6]),
            "field 'gradient_buckets': expected no such field for a star job",
        ),
        (edit(CUSTOM, workers=3), "field 'workers': expected no such field for a custom job"),
        (
            edit(CUSTOM, tasks=[{"name": "a", "cpu": 1}, {"name": "a", "cpu": 1}]),
            "field 'tasks[1].name': expected a task name not used before, got 'a'",
        ),
        (
            edit(CUSTOM, flows=[{"src": "a", "dst": "z", "demand_mbps": 1}]),
            "field 'flows[0].dst': expected a task name (a, b), got 'z'",
        ),
        (
            edit(CUSTOM, flows=[{"src": "a", "dst": "a", "demand_mbps": 1}]),
            "field 'flows[0]': expected a flow between two different tasks",
        ),
        (
            edit(CUSTOM, flows=[{"src": "a", "dst": "b", "demand_mbps": 1}] * 2),
            "field 'flows[1]': expected each src->dst pair once",
        ),
        (
            edit(CUSTOM, flows=[{"src": "a", "dst": "b"}]),
            "field 'flows[0].demand_mbps': expected a value (required)",
        ),
    ],
)
def test_malformed_job_files_say_where_and_what(tmp_path, doc, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(JobError) as err:
        load_jobs(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_file_level_errors(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(GOOD))
    (tmp_path / "b.yml").write_text(yaml.safe_dump({"jobs": [edit(GOOD, name="k"), GOOD]}))
    with pytest.raises(JobError, match=r"b\.yml: job 'j': field 'name': expected a unique job"):
        load_jobs(tmp_path)
    (tmp_path / "b.yml").write_text("jobs: [{name: x\n")
    with pytest.raises(JobError, match=r"b\.yml: not valid YAML"):
        load_jobs(tmp_path)
    (tmp_path / "b.yml").write_text(yaml.safe_dump({"jobs": [], "x": 1}))
    with pytest.raises(JobError, match="expected `jobs:` with a non-empty list"):
        load_jobs(tmp_path / "b.yml")
    (tmp_path / "b.yml").write_text(yaml.safe_dump({"jobs": [edit(GOOD, name="k"), 5]}))
    with pytest.raises(JobError, match=r"jobs\[1\]: expected a mapping, got 5"):
        load_jobs(tmp_path / "b.yml")
    with pytest.raises(JobError, match="no such job file or folder"):
        load_jobs(tmp_path / "missing.yaml")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(JobError, match=r"folder has no .yaml/.yml job files"):
        load_jobs(empty)


def test_a_ring_job_gives_its_gradient_buckets(tmp_path):
    path = tmp_path / "ring.yaml"
    path.write_text(yaml.safe_dump(edit(GOOD, gradient_buckets=[9.46e6, 26.49e6, 8.74e6])))
    (job,) = load_jobs(path)
    assert job.ddp_buckets == (9.46e6, 26.49e6, 8.74e6)
    path.write_text(yaml.safe_dump(GOOD))
    assert load_jobs(path)[0].ddp_buckets == ()


def test_a_file_with_several_jobs(tmp_path):
    path = tmp_path / "many.yaml"
    path.write_text(
        yaml.safe_dump({"jobs": [GOOD, edit(GOOD, name="s", collective="star", ps={"cpu": 2})]})
    )
    a, b = load_jobs(path)
    assert a.model_bytes == 4000 and b.task("ps").demand == Resources(2, 0)
    assert parse_job(CUSTOM).flows[0].bytes_per_iter == 100


def test_random_jobs_follow_the_distribution():
    dist = JobDistribution()
    rng = np.random.default_rng(7)
    jobs = [random_job(rng, f"j{i}", dist) for i in range(300)]
    seen = {j.collective for j in jobs}
    assert seen == {"ring", "star", "tree", "all-to-all", "custom"}
    for j in jobs:
        workers = len(j.tasks) - (j.collective == "star")
        assert dist.min_workers <= workers <= dist.max_workers
        assert 4 * dist.min_params <= j.model_bytes <= 4 * dist.max_params
        assert dist.min_compute_s * 0.99 <= j.compute_s <= dist.max_compute_s * 1.01
        assert dist.min_iterations <= j.iterations <= dist.max_iterations
        assert all(dist.min_mbps * 0.99 <= f.demand_mbps <= dist.max_mbps * 1.01 for f in j.flows)
        assert all(t.demand.cpu in dist.cpu_choices for t in j.tasks)
    customs = [j for j in jobs if j.collective == "custom" and len(j.tasks) > 2]
    assert customs and all(not nx.is_directed_acyclic_graph(j.logical_graph()) for j in customs)
    again = random_job(np.random.default_rng(7), "j0", dist)
    assert again == jobs[0]


TASKS_CSV = """\
jobA,worker,2,Terminated,100,400,600,29.296875,50,V100
jobA,ps,1,Terminated,100,380,300,10,,
jobB,tensorflow,3,Terminated,50,350,1200,60,100,T4
jobC,worker,1,Failed,10,20,100,1,0,CPU
jobD,worker,1,Running,500,,100,1,0,CPU
"""


@pytest.mark.parametrize("header", [False, True])
def test_alibaba_task_table(tmp_path, header):
    path = tmp_path / "pai_task_table.csv"
    head = (
        "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,"
        "gpu_type\n"
    )
    path.write_text((head if header else "") + TASKS_CSV)
    jobs = load_alibaba_tasks(path, compute_s=2.0)
    assert [j.name for j in jobs] == ["jobB", "jobA"]  # by start time; jobC failed, D running
    b, a = jobs
    assert b.collective == "ring" and [t.name for t in b.tasks] == [
        "tensorflow0",
        "tensorflow1",
        "tensorflow2",
    ]
    assert b.tasks[0].demand == Resources(12.0, 60 * 1024, 1.0)
    assert b.submit_time == 0 and b.iterations == 150 and b.workload["duration_s"] == 300
    assert a.collective == "star" and a.submit_time == 50
    assert a.task("ps0").demand == Resources(3.0, 10 * 1024, 0.0)
    assert pairs(a) == {
        ("worker0", "ps0"),
        ("ps0", "worker0"),
        ("worker1", "ps0"),
        ("ps0", "worker1"),
    }
    assert a.iterations == 150 and a.workload["gpu_type"] == "V100"
    everything = load_alibaba_tasks(path, statuses=None)
    running = next(j for j in everything if j.name == "jobD")
    assert running.iterations is None and running.workload["duration_s"] is None
    assert len(load_alibaba_tasks(path, limit=1)) == 1


@pytest.mark.parametrize(
    "row, message",
    [
        ("jobA,worker,2,Terminated,100,400", "pai.csv:1: expected 10 columns"),
        ("jobA,worker,2,Terminated,100,400,lots,1,0,CPU", "column 'plan_cpu': expected a number"),
        (
            "jobA,worker,0,Terminated,100,400,100,1,0,CPU",
            "column 'inst_num': expected a number >= 1",
        ),
        (
            "jobA,worker,1.5,Terminated,100,400,100,1,0,CPU",
            "column 'inst_num': expected an integer",
        ),
        ("jobA,worker,1,Terminated,100,400,0,1,0,CPU", "column 'plan_cpu': expected a number > 0"),
        (
            "jobA,worker,1,Terminated,100,400,100,-1,0,CPU",
            "column 'plan_mem': expected a number >= 0",
        ),
        ("jobA,worker,1,Running,100,400,100,1,0,CPU", "no task rows with status in"),
    ],
)
def test_alibaba_malformed(tmp_path, row, message):
    path = tmp_path / "pai.csv"
    path.write_text(row + "\n")
    with pytest.raises(JobError, match=message.replace("(", r"\(")):
        load_alibaba_tasks(path)


def test_machine_spec_sampling_keeps_the_topology_size(tmp_path):
    path = tmp_path / "machines.csv"
    path.write_text("machine,gpu_type,cap_cpu,cap_mem,cap_gpu\nm1,CPU,96,512,0\nm2,V100,48,256,8\n")
    machines = load_machine_spec(path)
    assert [(m.cpu, m.mem_gb, m.gpu) for m in machines] == [(96, 512, 0), (48, 256, 8)]
    base = Cluster.from_topology(load_topology("campus"))
    nodes = base.compute_nodes()
    mean_cpu = np.mean([base.capacity(n).cpu for n in nodes])
    c = apply_machine_spec(base, machines, np.random.default_rng(1))
    caps = [c.capacity(n) for n in nodes]
    scale = mean_cpu / 72  # the table's mean cpu
    assert {round(x.cpu / scale, 6) for x in caps} <= {96.0, 48.0}
    assert all((x.gpu == 8) == (round(x.cpu / scale) == 48) for x in caps)
    assert base.capacity(nodes[0]).gpu == 0  # the original is untouched
    with pytest.raises(JobError, match=r"machines.csv:1: columns 'cap_cpu' and 'cap_mem'"):
        path.write_text("m1,CPU,0,512,0\n")
        load_machine_spec(path)


def test_the_vendored_alibaba_machine_table_loads():
    machines = load_machine_spec(MACHINE_TABLE)
    assert len(machines) > 1000 and {m.gpu_type for m in machines} >= {"CPU", "V100", "T4"}


def test_evaluate_cli_rejects_bad_job_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(edit(GOOD, workers=-1)))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler.evaluate",
            "--topo",
            "campus",
            "--jobs",
            str(bad),
            "--algos",
            "first-fit",
            "--seeds",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert "bad.yaml: job 'j': field 'workers'" in run.stderr and "Traceback" not in run.stderr
