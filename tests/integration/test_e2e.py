"""End to end, for real: OVS, Docker worker containers, the SDN app, the Master, the edge agents
and PyTorch DDP.

- `run.py --quick` runs the whole comparison and its results files say what happened;
- the closed loop: a killed worker and an agent that stops heartbeating are noticed within 10 s
  and the job is rescheduled elsewhere, and failed with the reason once its attempts are spent;
- malformed --topo/--jobs/--schedulers exit 2 with a clear message and create nothing.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
import yaml
from polling import wait_for

from edge.compute import ComputeManager
from master import Master, MasterConfig
from master.client import MasterClient
from testbed import Emulation, leftovers
from topologies import load_topology

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(REPO / "experiments" / "run.py")]
from experiments import report
from experiments.e2e import faults, fidelity

RESULT_KEYS = {
    "scheduler",
    "seed",
    "job",
    "tta_s",
    "reached_target",
    "final_accuracy",
    "jct_s",
    "placement",
    "flows",
    "curve",
    "state",
}


def left(prefix: str) -> dict[str, list]:
    return {kind: found for kind, found in leftovers(prefix).items() if found}


def test_quick_run_end_to_end(tmp_path: Path, prefix: str, worker_image: str) -> None:
    out = tmp_path / "quick"
    t0 = time.monotonic()
    done = subprocess.run(
        RUN + ["--quick", "--out", str(out), "--prefix", prefix],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert left(prefix) == {}

    scenario = yaml.safe_load((REPO / "experiments" / "scenarios" / "quick.yaml").read_text())
    res = json.loads((out / "results.json").read_text())
    campus = load_topology("campus")
    nodes = {n.name for n in campus.nodes}
    cordoned = {
        v for b in scenario["background"] if b.get("cordon", True) for v in (b["src"], b["dst"])
    }
    assert res["topology"] == "campus" and res["schedulers"] == scenario["schedulers"]
    assert res["mode"] == "emulation"
    assert res["machine"]["cores"] == os.cpu_count() and res["machine"]["datapath"]
    # the run was budgeted and dilated as the budget says (--dilation auto), every run judged
    dil = res["dilation"]
    assert dil["chosen"] == "auto" and dil["factor"] >= 1
    assert dil["budget"]["need"] <= dil["budget"]["usable"]
    for r in res["runs"]:
        v = r["fidelity"]
        assert v["faithful"] == (not v["reasons"]) and r["switch_wait_share"] is not None
        assert r["host_busy"]["max"] <= 1.0 + 1e-6 and r["emulated_s"] > 0
        assert r["wall_s"] == pytest.approx(dil["factor"] * r["emulated_s"], rel=0.1)
        assert len(r["host_before"]["busy"]) >= 3  # it waited for a quiet host, and says so
    # an unfaithful run is run again, at most --reruns times; the last attempt of each stands
    assert [r["scheduler"] for r in res["runs"] if r["attempt"] == 1] == scenario["schedulers"]
    last = {r["scheduler"]: r for r in res["runs"]}
    res = {**res, "runs": list(last.values())}
    # the emulated topology, its links scaled as the scenario says, handed to the SDN app
    emulated = load_topology(out / "topology.yaml")
    assert [lk.bw_mbps for lk in emulated.links] == [
        lk.bw_mbps * scenario["link_scale"] for lk in campus.links
    ]
    rows = [row for r in res["runs"] for row in r["jobs"]]
    assert len(rows) == len(scenario["schedulers"]) * len(scenario["jobs"])
    jobs = {j["name"]: j for j in scenario["jobs"]}
    network = {"network-aware": "enforced", "k8s-spread": "best-effort"}
    flows = []
    for row in rows:
        assert set(row) >= RESULT_KEYS, row
        assert row["job"] in jobs and row["seed"] == 0
        assert row["network"] == network[row["scheduler"]]
        # every task placed once, on a schedulable compute node of campus; no node holds a job
        assert sorted(row["placement"]) == [f"w{i}" for i in range(jobs[row["job"]]["workers"])]
        assert set(row["placement"].values()) <= nodes - cordoned
        assert len(set(row["placement"].values())) > 1 and row["flows"]
        assert row["state"] == "finished", row
        if row["reached_target"]:
            assert 0 < row["tta_s"] < row["jct_s"]
            assert row["final_accuracy"] >= jobs[row["job"]]["target_accuracy"]
        assert row["curve"] and all(0 <= acc <= 1 for _, acc in row["curve"])
        for f in row["flows"]:
            assert f["path"][0] == row["placement"][f["src"]]
            assert f["path"][-1] == row["placement"][f["dst"]]
            # a grant only where the network enforces one
            assert (
                (f["rate_mbps"] > 0) if row["network"] == "enforced" else (f["rate_mbps"] is None)
            )
            flows.append((row, f))
    assert any(r["reached_target"] for r in rows)
    # real flows whose goodput was measured, and where a grant holds, within it (+ meter burst)
    assert all(f["measured_mbps"] is not None for _, f in flows)
    assert all(
        0 < f["measured_mbps"] <= 1.1 * f["rate_max_mbps"]
        for r, f in flows
        if r["network"] == "enforced"
    ), flows
    # the kernel's view of the same flows: the sender's connection to the receiver was found,
    # and where the grant holds the flow back it went no faster than it was let on the wire
    assert all(f["tcp_mbps"] and f["wire_mbps"] for _, f in flows), flows
    binding = [f for r in rows for f in fidelity.binding_flows(r)]
    assert binding and all(f["wire_mbps"] <= 1.1 * f["rate_max_mbps"] for f in binding), binding
    # the background flow started mid-run and was seen on its pinned path, in every run
    bg = scenario["background"][0]
    first_link = f"{bg['src']}>{bg['path'][0]}"
    for r in res["runs"]:
        assert list(r["background_started_at"]) == [f"{bg['src']}->{bg['dst']}"]
        assert (
            r["background_started_at"][f"{bg['src']}->{bg['dst']}"]
            >= r["started_at"] + bg["start_s"]
        )
        assert max(x or 0 for x in r["links"]["mbps"][first_link]) >= 0.5 * bg["mbps"]

    summary = (out / "summary.md").read_text()
    assert all(s in summary for s in scenario["schedulers"]) and "cores" in summary
    assert "Time dilation" in summary and "## Fidelity" in summary
    faithful = json.loads((out / "results.json").read_text())
    if report.rows(faithful):  # the figures are made of the faithful runs
        table = list(csv.DictReader((out / "results.csv").open()))
        assert len(table) == len(report.rows(faithful))
        for name in ("tta", "curves", "links", "rates"):
            assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    print(f"run.py --quick: {wall:.0f} s wall (results say {res['wall_s']:.0f} s)")


def test_malformed_inputs_exit_2_and_create_nothing(tmp_path: Path, prefix: str) -> None:
    bad_topo = tmp_path / "bad-topo.yaml"
    bad_topo.write_text(
        "name: x\nnodes: [{name: a, cpu: -1, mem_mb: 1}]\nswitches: []\nlinks: []\n"
    )
    bad_jobs = tmp_path / "bad-jobs.yaml"
    bad_jobs.write_text(
        "name: j\ncollective: ring\nworkers: 2\nmodel_params: 10\n"
        "task: {cpu: 0.5}\ndemand_mbps: fast\niterations: 3\n"
    )
    cases = [
        (["--topo", str(bad_topo)], "bad-topo.yaml"),
        (["--topo", str(tmp_path / "missing.yaml")], "missing.yaml"),
        (["--jobs", str(bad_jobs)], "demand_mbps"),
        (["--schedulers", "nope"], "nope"),
        (["--seeds", "0"], "--seeds"),
    ]
    for args, needle in cases:
        done = subprocess.run(
            RUN + args + ["--prefix", prefix, "--out", str(tmp_path / "o")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, (args, done.stderr)
        assert needle in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert left(prefix) == {}
    assert not (tmp_path / "o").exists()


# --- the closed loop -------------------------------------------------------------------------
TINY = faults.TOPOLOGY  # two switches, four 1-core nodes
LONG_JOB = faults.job("long", seconds=900)  # a 2-worker ring that trains until stopped
DETECT_S = 10.0


def event_time(view: dict, needle: str) -> float | None:
    """Epoch time of the job's first event containing `needle`."""
    return next(
        (view["submitted_at"] + e["t"] for e in view["events"] if needle in e["event"]), None
    )


def training(client: MasterClient, attempt: int) -> dict:
    """The job once attempt `attempt` runs and its rank 0 has iterated."""

    def ready():
        v = client.job("long", records=True)
        if v["state"] != "running" or len(v["attempts"]) != attempt:
            return None
        rank0 = v["attempts"][-1]["workers"]["w0"]
        return v if any(r["type"] == "iter" for r in v["records"].get(rank0, [])) else None

    return wait_for(ready, 180, f"attempt {attempt} to train")


def test_worker_death_and_heartbeat_loss_are_handled(
    tmp_path: Path, prefix: str, worker_image: str
) -> None:
    topo_file = tmp_path / "tiny.yaml"
    topo_file.write_text(yaml.safe_dump(TINY))
    topo = load_topology(topo_file)
    client_docker = docker.from_env()
    agents: dict[str, subprocess.Popen] = {}
    with Emulation(topo, prefix=prefix, image=worker_image) as net:
        master = Master(
            topo,
            MasterConfig(
                algorithm="k8s-spread", image=worker_image, max_attempts=3, heartbeat_timeout_s=6.0
            ),
        ).start()
        try:
            for n in topo.nodes:
                agents[n.name] = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "edge",
                        "--node",
                        n.name,
                        "--master",
                        master.url,
                        "--node-container",
                        net.node_container_name(n.name),
                        "--workdir",
                        str(tmp_path / n.name),
                        "--heartbeat",
                        "2",
                    ],
                    cwd=REPO,
                    stdout=(tmp_path / f"agent-{n.name}.log").open("w"),
                    stderr=subprocess.STDOUT,
                )
            client = MasterClient(master.url)
            client.wait_ready(len(topo.nodes), timeout_s=60)
            client.submit(LONG_JOB)

            v = training(client, 1)
            # 0. another run's agent for a node of the same name leaves our workers alone
            ours = [
                net.names.worker(v["attempts"][0]["placement"][t], w)
                for t, w in v["attempts"][0]["workers"].items()
            ]
            for node in topo.nodes:
                ComputeManager(
                    client_docker, node.name, f"{prefix}-other-{node.name}-", tmp_path
                ).reconcile([])
            assert all(client_docker.containers.get(c).status == "running" for c in ours)

            # 1. a worker dies: noticed within 10 s, the job gets a second attempt
            victim = v["attempts"][0]["workers"]["w1"]
            node1 = v["attempts"][0]["placement"]["w1"]
            t_kill = time.time()
            client_docker.containers.get(net.names.worker(node1, victim)).kill()
            v = wait_for(
                lambda: (x := client.job("long")) and event_time(x, "attempt 1 ended") and x,
                DETECT_S + 5,
                "the worker's death to be noticed",
            )
            assert event_time(v, "attempt 1 ended") - t_kill <= DETECT_S
            # the killed worker, or its peer that lost the connection a moment later
            assert "exited with code" in v["attempts"][0]["outcome"]

            # 2. an agent stops heartbeating (SIGSTOP): its node goes offline within 10 s and
            #    the job is placed again without it
            v = training(client, 2)
            lost = v["attempts"][1]["placement"]["w0"]
            t_stop = time.time()
            agents[lost].send_signal(signal.SIGSTOP)
            v = wait_for(
                lambda: (
                    (x := client.job("long"))
                    and event_time(x, f"node {lost} stopped heartbeating")
                    and x
                ),
                DETECT_S + 5,
                "the silent node to be noticed",
            )
            assert event_time(v, f"node {lost} stopped heartbeating") - t_stop <= DETECT_S
            assert not next(n for n in client.nodes() if n["node"] == lost)["online"]
            v = training(client, 3)
            assert lost not in v["attempts"][2]["placement"].values()

            # 3. the agent resumes: its node is back, and its stale worker is stopped
            agents[lost].send_signal(signal.SIGCONT)
            stale = net.names.worker(lost, v["attempts"][1]["workers"]["w0"])
            wait_for(
                lambda: next(n for n in client.nodes() if n["node"] == lost)["online"],
                15,
                "the node to come back",
            )
            wait_for(
                lambda: not client_docker.containers.list(all=True, filters={"name": f"^{stale}$"}),
                30,
                "the stale worker to be removed",
            )

            # 4. the last attempt's worker dies: the job fails, with the reason
            third = v["attempts"][2]
            client_docker.containers.get(
                net.names.worker(third["placement"]["w0"], third["workers"]["w0"])
            ).kill()
            v = wait_for(
                lambda: (x := client.job("long"))["state"] == "failed" and x,
                DETECT_S + 5,
                "the job to fail",
            )
            assert "exited with code" in v["reason"] and "3 attempts" in v["reason"]
            wait_for(
                lambda: not any(n["workers"] for n in client.nodes()),
                30,
                "every worker to be removed",
            )
        finally:
            for p in agents.values():
                p.send_signal(signal.SIGCONT)
                p.terminate()
            for p in agents.values():
                p.wait(timeout=30)
            master.stop()
    assert left(prefix) == {}
