"""Network modes and runtime adjustment on the real stack: the SDN app as a process, the emulated
network on Open vSwitch, the Master, an edge agent per node and DDP workers (run.py's `Stack`).

    a - s1 ---(100)--- s2 - b        the job: one worker on a, one on b
    c -/  \\-(200)- s3 -(200)-/ \\- d    the other tenant: c -> d pinned on s1-s2

- A best-effort job installs no meter, no flow entry and no tc class.
- An enforced job on the direct link is re-routed through s3 when the tenant's traffic starts on
  it (the loaded direction only) and when the link goes down (both); the switches' flow tables
  show the new path within `REACT_S`.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from polling import wait_for
from rich.console import Console

from topologies import load_topology

REPO = Path(__file__).resolve().parents[2]
from experiments.e2e.scenario import BackgroundFlow
from experiments.e2e.stack import Stack

pytestmark = pytest.mark.integration
DETOUR = {
    "name": "detour",
    "switches": [{"name": "s1"}, {"name": "s2"}, {"name": "s3"}],
    "nodes": [
        {"name": "a", "cpu": 1.0, "mem_mb": 1024},
        {"name": "b", "cpu": 1.0, "mem_mb": 1024},
        {"name": "c", "cpu": 0.5, "mem_mb": 256},
        {"name": "d", "cpu": 0.5, "mem_mb": 256},
    ],
    "links": [
        {"ends": ["s1", "s2"], "bw_mbps": 100},
        {"ends": ["s1", "s3"], "bw_mbps": 200},
        {"ends": ["s3", "s2"], "bw_mbps": 200},
        {"ends": ["a", "s1"], "bw_mbps": 200},
        {"ends": ["c", "s1"], "bw_mbps": 200},
        {"ends": ["b", "s2"], "bw_mbps": 200},
        {"ends": ["d", "s2"], "bw_mbps": 200},
    ],
}
# Two 0.6-core workers: one on a, one on b (c and d are too small); mlp-small's ring fills its
# 40 Mbit/s grant, and trains until cancelled.
JOB = {
    "name": "long",
    "collective": "ring",
    "workers": 2,
    "task": {"cpu": 0.6, "mem_mb": 600},
    "model_params": 85000,
    "demand_mbps": 40,
    "target_accuracy": 0.999,
    "workload": {"model": "mlp-small", "eval_every": 50, "max_seconds": 900},
}
TENANT = BackgroundFlow("c", "d", 80.0, ("s1", "s2"), start_s=0.0, cordon=True)
REACT_S = 10.0  # link statistics every 1 s, read every 2 s, then the change is installed
JOB_COOKIE = re.compile(r"cookie=0xce51")


@pytest.fixture
def stack(tmp_path: Path, prefix: str, worker_image: str):
    path = tmp_path / "detour.yaml"
    path.write_text(yaml.safe_dump(DETOUR))
    with Stack(load_topology(path), prefix, tmp_path, Console(quiet=True)) as s:
        s.prepare_background([TENANT])
        yield s


def job_entries(stack: Stack, switch: str, dst: str) -> list[str]:
    """The switch's entries of scheduled flows toward node `dst` (the tenant's c->d aside)."""
    out = subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", stack.net.bridge_name(switch)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ip = stack.topo.node(dst).ip
    return [line for line in out.splitlines() if JOB_COOKIE.search(line) and f"nw_dst={ip}" in line]


def training(stack: Stack, name: str) -> dict:
    def ready():
        v = stack.master.job(name, records=True)
        if v["state"] != "running":
            return None
        rank0 = v["attempts"][-1]["workers"]["w0"]
        return v if any(r["type"] == "iter" for r in v["records"].get(rank0, [])) else None

    return wait_for(ready, 180, f"{name} training")


def test_a_best_effort_job_installs_nothing(stack: Stack):
    stack.master.submit({**JOB, "name": "be"}, algorithm="k8s-spread")
    v = training(stack, "be")
    assert v["attempts"][0]["network"] == "best-effort"
    assert sorted(v["attempts"][0]["placement"].values()) == ["a", "b"]
    for switch in ("s1", "s2", "s3"):
        assert job_entries(stack, switch, "a") == job_entries(stack, switch, "b") == []
        meters = subprocess.run(
            ["ovs-ofctl", "-O", "OpenFlow13", "dump-meters", stack.net.bridge_name(switch)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        # the tenant's pinned flow has the only meter, at its first switch
        assert meters.count("meter=") == (1 if switch == "s1" else 0), meters
    for node in ("a", "b"):
        classes = stack.net.exec(node, "tc class show dev eth0")[1]
        minors = re.findall(r"class htb 1:([0-9a-f]+) ", classes)
        assert sorted(minors) == ["fffe", "ffff"], classes  # the link and its default only
    assert all(lk["granted_mbps"] == 0 for lk in stack.master.links())
    stack.master.cancel("be")


@pytest.mark.parametrize("trouble", ["traffic", "down"])
def test_an_enforced_job_is_re_routed_when_its_link_is_taken(stack: Stack, trouble: str):
    stack.master.submit({**JOB, "name": "en"}, algorithm="network-aware")
    v = training(stack, "en")
    assert v["attempts"][0]["network"] == "enforced"
    wait_for(
        lambda: job_entries(stack, "s1", "b") and not job_entries(stack, "s3", "b"),
        10,
        "the job's entries on the direct path",
    )
    t0 = time.monotonic()
    if trouble == "traffic":
        stack.start_traffic(0, TENANT, wait=False)
    else:
        stack.net.set_link_up("s1", "s2", False)
    # The tenant loads s1->s2 only: the a->b flow moves; a downed link moves both directions.
    moved = ["b"] if trouble == "traffic" else ["a", "b"]
    wait_for(
        lambda: all(job_entries(stack, "s3", dst) for dst in moved),
        REACT_S + 5,
        "the job's entries through s3",
    )
    reacted = time.monotonic() - t0
    print(f"\n{trouble}: the job's entries through s3 after {reacted:.1f} s")  # pytest -s
    assert reacted <= REACT_S, f"re-routed after {reacted:.1f} s"
    v = stack.master.job("en")
    assert v["state"] == "running" and len(v["attempts"]) == 1
    adjusted = v["attempts"][0]["adjustments"]
    assert adjusted and {"s1>s2", "s2>s1"} & set(adjusted[0]["links"])
    paths = {tuple(f["path"]) for f in v["attempts"][0]["flows"]}
    back = ("b", "s2", "s1", "a") if trouble == "traffic" else ("b", "s2", "s3", "s1", "a")
    assert paths == {("a", "s1", "s3", "s2", "b"), back}
    # still training: iterations after the re-route
    rank0 = v["attempts"][0]["workers"]["w0"]

    def lines() -> int:
        return len(stack.master.job("en", records=True)["records"][rank0])

    before = lines()
    wait_for(lambda: lines() > before + 5, 60, "training to go on")
    stack.master.cancel("en")
    if trouble == "traffic":
        stack.stop_traffic(0)
    else:
        stack.net.set_link_up("s1", "s2", True)
