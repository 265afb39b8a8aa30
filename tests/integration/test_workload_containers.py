"""The training program in worker containers on the emulated network (real OVS, Docker, gloo).

Three nodes on one switch, every access link shaped to 20 Mbit/s: the job's traffic must leave
through each node's `eth0`, cross the switch, and obey the shaper.
"""

from __future__ import annotations

import re
import statistics
import subprocess
from pathlib import Path

import docker
import pytest

from master.compute import worker_command
from protocol.worker import flow_option
from scheduler.jobs import load_job_documents
from scheduler.perfmodel import flow_bytes, ring_lower_bound_s
from testbed import Emulation, cleanup, new_prefix
from topologies import parse_topology
from workloads.job import run_job
from workloads.results import read_task_log, summarize_job

pytestmark = pytest.mark.integration
RATE_MBPS = 20.0
NODES = ("n1", "n2", "n3")
TOPO = {
    "name": "three",
    "switches": [{"name": "s1"}],
    "nodes": [{"name": n, "cpu": 0.6, "mem_mb": 1024} for n in NODES],
    "links": [{"ends": [n, "s1"], "bw_mbps": RATE_MBPS} for n in NODES],
}
JOB = {
    "dataset": "digits",
    "eval_every": 10,
    "max_iters": 400,
    "max_seconds": 240,
    "timeout_s": 120,
    "threads": 1,
}


@pytest.fixture(scope="module")
def net(testbed_host, worker_image):
    prefix = new_prefix()
    try:
        with Emulation(parse_topology(TOPO, "test"), prefix=prefix, image=worker_image) as em:
            yield em
    finally:
        cleanup(prefix)


def switch_rx_bytes(net: Emulation, node: str) -> int:
    """Bytes the switch received on the port of `node`'s access link, live from the datapath
    (OVSDB's `statistics` column is refreshed only every few seconds)."""
    lk = net.topo.access_link(node)
    switch = lk.other(node)
    out = subprocess.run(
        [
            "ovs-ofctl",
            "-O",
            "OpenFlow13",
            "dump-ports",
            net.bridge_name(switch),
            str(lk.port_of(switch)),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(re.search(r"rx pkts=\d+, bytes=(\d+)", out)[1])


def test_ring_job_trains_over_the_shaped_links(net, tmp_path):
    before = {n: switch_rx_bytes(net, n) for n in NODES}
    paths = run_job(
        net,
        NODES,
        tmp_path,
        job="ring",
        deadline_s=400,
        model="mlp-small",
        collective="ring",
        target_acc=0.9,
        **JOB,
    )
    logs = [read_task_log(p) for p in paths]
    summary = summarize_job(logs)
    assert summary.reached_target and summary.tta_s > 0
    assert len({t.end["param_sum"] for t in logs}) == 1
    grad = summary.gradient_bytes
    share = 2 * 2 * grad // 3
    for node, t in zip(NODES, logs):
        assert t.start["host"] == node and t.start["cpu_quota"] == pytest.approx(0.6)
        assert t.end["container_startup_s"] >= t.end["startup_s"] > 0
        steady = t.iters[3:]
        # gloo used eth0: this task's ring share left through it (plus TCP/IP headers), ...
        tx = statistics.median(r["tx_bytes"] for r in steady)
        assert share <= tx <= 1.15 * share
        # ... and the shaper held it to the link rate: never faster than the bandwidth bound
        comm = statistics.median(r["comm_s"] for r in steady)
        assert comm >= 0.9 * ring_lower_bound_s(3, grad, RATE_MBPS)
        # the switch saw it: every iteration's share arrived at the node's switch port
        assert switch_rx_bytes(net, node) - before[node] >= share * len(t.iters)


def test_parameter_server_job_is_a_star(net, tmp_path):
    paths = run_job(
        net,
        NODES,
        tmp_path,
        job="ps",
        deadline_s=400,
        model="cnn",
        collective="ps",
        target_acc=0.85,
        **JOB,
    )
    logs = sorted((read_task_log(p) for p in paths), key=lambda t: t.rank)
    assert all(t.end["reached_target"] for t in logs)
    grad = logs[0].start["gradient_bytes"]
    tx = [statistics.median(r["tx_bytes"] for r in t.iters[3:]) for t in logs]
    # the server sends the average to both workers; each worker only sends to the server.
    # Headers, ACKs and retransmissions (a loaded CI machine) add up to ~30%; the ratio of the
    # server's to a worker's traffic is the star's signature (a ring would give 1).
    assert 2 * grad <= tx[0] <= 1.3 * 2 * grad
    assert all(grad <= w <= 1.3 * grad for w in tx[1:])
    assert 1.6 <= tx[0] / statistics.mean(tx[1:]) <= 2.4


def test_the_bundled_job_files_run_in_the_worker_image(worker_image):
    """Each job file of workloads/jobs/ as the Master would start its first task: the program
    exists in the image and takes the options it is given (`--help` after them parses them all,
    then exits 0)."""
    client = docker.from_env()
    for doc in load_job_documents(Path(__file__).resolve().parents[2] / "workloads" / "jobs"):
        command = worker_command(doc.job, 0, "127.0.0.1", 29500, "lo", 0)
        out = client.containers.run(
            worker_image, [*command, "--help"], remove=True, network_mode="none"
        )
        assert b"usage:" in out, (doc.source, command)


@pytest.mark.parametrize(
    ("collective", "flows"),
    [
        ("tree", None),
        ("all-to-all", None),
        # a cycle 0 -> 1 -> 2 -> 0 plus a side flow 0 -> 2, each with its own bytes
        ("custom", {(0, 1): 300_000, (1, 2): 500_000, (2, 0): 200_000, (0, 2): 100_000}),
    ],
)
def test_every_collective_sends_the_models_bytes_per_flow(net, tmp_path, collective, flows):
    """Tree, all-to-all and custom graphs between three containers over the shaped links: each
    flow carries, per iteration, what `scheduler.perfmodel.flow_bytes` (or the custom graph's
    own bytes) says, as its source counted it, and every replica ends with the same model where
    the collective averages it (a custom graph's gossip does not)."""
    options = dict(JOB, max_iters=12, eval_every=50)
    if flows:
        options["flows"] = [flow_option(s, d, b) for (s, d), b in flows.items()]
    paths = run_job(
        net,
        NODES,
        tmp_path,
        job=collective,
        deadline_s=400,
        model="mlp-small",
        collective=collective,
        target_acc=0.999,
        **options,
    )
    summary = summarize_job([read_task_log(p) for p in paths])
    assert summary.iters == 12 and summary.collective == collective
    model = summary.gradient_bytes
    if collective == "tree":  # a binary tree over 3 ranks: 0 is the parent of 1 and 2
        expected = {(c, 0): model for c in (1, 2)} | {(0, c): model for c in (1, 2)}
    elif collective == "all-to-all":
        expected = {(a, b): flow_bytes("all-to-all", 3, model) for a in range(3) for b in range(3)}
        expected = {k: v for k, v in expected.items() if k[0] != k[1]}
    else:
        expected = flows
    measured = {tuple(map(int, k.split(">"))): v for k, v in summary.flow_bytes.items() if v > 0}
    assert set(measured) == set(expected), measured
    for pair, nbytes in expected.items():
        assert measured[pair] == pytest.approx(nbytes, rel=0.01), pair
    if collective != "custom":
        assert len({read_task_log(p).end["param_sum"] for p in paths}) == 1
