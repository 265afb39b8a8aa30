"""Fuzzing the file parsers (issue 21): topology files (`topologies.load_topology`), job files
(`scheduler.jobs.load_job_documents`, what `master submit` and `run.py --jobs` read) and scenario
files (`experiments.e2e.scenario.load_scenario`). Whatever a file holds — YAML that does not
parse, bytes that are not UTF-8, a date that does not exist, nesting too deep, a field dropped,
an unknown field, a value of the wrong type or out of range, a name with path separators or
control characters — the parser either returns what the file describes or raises the project's
own error naming the file; never another exception. The command-line tools then exit 2."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fuzz_strategies import Mutation, bad_numbers, json_values, mutated
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from experiments.e2e.scenario import ScenarioError, load_scenario
from scheduler.jobs import JobError, load_job_documents
from topologies import TopologyError, load_topology
from topologies.load import topology_document

REPO = Path(__file__).resolve().parents[2]
# Parsing a file takes well under a millisecond; 150 examples per kind keep the file near 10 s.
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

STAR = topology_document(load_topology("star"))
JOB = {
    "name": "small",
    "collective": "ring",
    "workers": 2,
    "task": {"cpu": 0.5, "mem_mb": 256},
    "model_params": 85000,
    "demand_mbps": 20,
    "target_accuracy": 0.8,
    "workload": {"model": "mlp-small"},
}
CUSTOM = {
    "name": "c",
    "collective": "custom",
    "model_bytes": 1000,
    "iterations": 5,
    "tasks": [{"name": "a", "cpu": 1}, {"name": "b", "cpu": 1}],
    "flows": [{"src": "a", "dst": "b", "demand_mbps": 10}],
}
SCENARIO = {
    "name": "s",
    "topology": "campus",
    "schedulers": ["first-fit"],
    "seeds": 1,
    "timeout_s": 60,
    "link_scale": 1.0,
    "jobs": [JOB],
    "background": [{"src": "lab3", "dst": "srv3", "mbps": 20, "start_s": 10}],
}

# Texts no YAML loader may turn into another exception.
YAML_TRAPS = [
    b"nodes: 2020-13-45\n",  # a timestamp that does not exist: ValueError in PyYAML
    b"\xff\xfe\x00n\x00o",  # UTF-16, not UTF-8
    b"[" * 3000 + b"]" * 3000,  # RecursionError in PyYAML's composer
    b"a: &a [1]\nb: &b [*a, *a, *a, *a]\nc: [*b, *b, *b, *b]\nnodes: *c\n",  # aliases
    b"{1: 2, x: 3}\n",
    b"? [1, 2]\n: 3\n",
    b"!!python/object:os.system ls\n",
    b"%YAML 9.9\n---\n",
    b"",
    b"---\n...\n",
    b"- 1\n- 2\n",
    b"nodes: [\n",
    b"\t- x\n",
    b"\x00",
    b"name: !!binary YQ==\n",
]


def dumped(doc) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True).encode()


def files_of(valid: dict, *nested: tuple[str, int]) -> st.SearchStrategy[bytes]:
    """File contents: `valid` with one change at the top or in one of its `nested` list
    elements (key, index), or arbitrary YAML values, or text that may not even be YAML."""
    changes = [mutated(valid)]
    for key, i in nested:
        changes.append(
            mutated(valid[key][i]).map(
                lambda m, key=key, i=i: Mutation(
                    {**valid, key: [m.body if j == i else e for j, e in enumerate(valid[key])]},
                    f"{key}[{i}].{m.field}",
                    m.kind,
                )
            )
        )
    return st.one_of(
        st.one_of(changes).map(lambda m: dumped(m.body)),
        json_values.map(dumped),
        st.sampled_from(YAML_TRAPS),
        st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=200),
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def write(folder: Path, name: str, content: bytes) -> Path:
    path = folder / name
    path.write_bytes(content)
    return path


def refused_clearly(error: Exception, path: Path) -> None:
    """The project's error names the file first (a user can find what to fix)."""
    assert str(error).startswith(str(path)), str(error)


@FUZZ
@given(content=files_of(STAR, ("nodes", 0), ("switches", 0), ("links", 0)))
@example(content=dumped({**STAR, 1: 2}))  # was TypeError: '<' between str and int (sorting)
@example(content=dumped({**STAR, "nodes": [{**STAR["nodes"][0], "mem_mb": math.inf}]}))
@example(content=dumped({**STAR, "nodes": [{**STAR["nodes"][0], "cpu": 10**400}]}))  # Overflow
@example(content=dumped({**STAR, "nodes": [{**STAR["nodes"][0], "name": "h1\n"}]}))  # accepted
@example(content=YAML_TRAPS[0])  # was ValueError
@example(content=YAML_TRAPS[1])  # was UnicodeDecodeError
@example(content=YAML_TRAPS[2])  # was RecursionError
def test_topology_files(folder, content):
    path = write(folder, "topo.yaml", content)
    try:
        topo = load_topology(path)
    except TopologyError as e:
        refused_clearly(e, path)
        return
    for n in topo.nodes:  # what was accepted is what the README allows
        assert n.name.isascii() and n.name.isidentifier() and n.name.isprintable()
        assert math.isfinite(n.cpu) and n.cpu >= 0.01 and n.mem_mb >= 16
    assert all(math.isfinite(lk.bw_mbps) and math.isfinite(lk.delay_ms) for lk in topo.links)


@FUZZ
@given(
    content=st.one_of(
        files_of(JOB),
        files_of(CUSTOM, ("tasks", 0), ("flows", 0)),
        files_of({"jobs": [JOB, CUSTOM]}, ("jobs", 1)),
    )
)
@example(content=dumped({**JOB, "model_params": 10**400}))  # was OverflowError
@example(content=dumped({**JOB, "workers": 10**9}))  # took minutes and gigabytes
@example(content=dumped({**CUSTOM, "tasks": [{"name": f"t{i}", "cpu": 1} for i in range(300)]}))
@example(content=YAML_TRAPS[0])
@example(content=YAML_TRAPS[2])
def test_job_files(folder, content):
    path = write(folder, "jobs.yaml", content)
    try:
        docs = load_job_documents(path)
    except JobError as e:
        refused_clearly(e, path)
        return
    for d in docs:
        assert 1 <= len(d.job.tasks) <= 257  # 256 workers + a star job's parameter server
        assert all(math.isfinite(t.demand.cpu) and t.demand.cpu > 0 for t in d.job.tasks)


@FUZZ
@given(
    content=st.one_of(files_of(SCENARIO, ("background", 0)), files_of(SCENARIO, ("jobs", 0))),
    timeout=bad_numbers,
)
@example(content=dumped({**SCENARIO, 1: 2}), timeout=60)  # was TypeError (sorting keys)
@example(content=dumped(SCENARIO), timeout=math.nan)  # was accepted: runs with a nan timeout
@example(content=dumped(SCENARIO), timeout=10**400)  # was OverflowError
@example(
    content=dumped({**SCENARIO, "background": [{"src": "a", "dst": "b", "mbps": math.inf}]}),
    timeout=60,
)  # was accepted
@example(content=dumped({**SCENARIO, "jobs": "a\x00b"}), timeout=60)  # a path with a NUL
@example(content=YAML_TRAPS[1], timeout=60)
def test_scenario_files(folder, content, timeout):
    path = write(folder, "scenario.yaml", content)
    try:
        doc = yaml.safe_load(content)
    except (yaml.YAMLError, ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and "timeout_s" in doc:  # the number most runs are bounded by
        path = write(folder, "scenario.yaml", dumped({**doc, "timeout_s": timeout}))
    try:
        scenario = load_scenario(path)
    except ScenarioError as e:
        refused_clearly(e, path)
        return
    assert 0 < scenario.timeout_s < math.inf and scenario.seeds >= 1
    assert all(0 < b.mbps < math.inf for b in scenario.background)


@pytest.mark.parametrize(
    "content",
    [
        YAML_TRAPS[0],
        YAML_TRAPS[1],
        dumped({**STAR, 1: 2}),
        dumped({**STAR, "links": [{"ends": ["h1", "s1"], "bw_mbps": math.nan}]}),
    ],
)
def test_the_topology_check_command_exits_2_with_the_file(tmp_path, content):
    path = write(tmp_path, "bad.yaml", content)
    done = subprocess.run(
        [sys.executable, "-m", "topologies", "check", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"error: {path}")


@pytest.mark.parametrize("content", [YAML_TRAPS[2], dumped({**JOB, "workers": 10**9})])
def test_master_submit_exits_2_with_the_file(tmp_path, content):
    path = write(tmp_path, "bad.yaml", content)
    done = subprocess.run(
        [sys.executable, "-m", "master", "submit", str(path), "--master", "http://127.0.0.1:9"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert str(path) in done.stderr
