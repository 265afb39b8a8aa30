"""The Master's HTTP API and CLI on bad and good input (a real Master on localhost, no agents:
nothing can be placed, so jobs wait with a reason), and the protocol messages."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from master import Master, MasterConfig
from master.client import MasterClient
from protocol.http import ApiError, Unreachable, call
from protocol.messages import Heartbeat, Registration, Usage, WorkerState, from_json, to_json
from topologies import load_topology

REPO = Path(__file__).resolve().parents[2]
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


@pytest.fixture
def master():
    m = Master(load_topology("campus"), MasterConfig(algorithm="first-fit", tick_s=0.05)).start()
    yield m
    m.stop()


def wait_for(predicate, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
    return value


def test_protocol_round_trip_and_errors():
    hb = Heartbeat(
        "lab1",
        3,
        1.5,
        Usage(0.2, 300, 1, 2),
        [WorkerState("j-w0-a1", "j", "w0", "exited", 0)],
        [{"type": "eval"}],
    )
    assert from_json(Heartbeat, to_json(hb)) == hb
    with pytest.raises(ValueError, match="unknown field"):
        from_json(Registration, {**to_json(Registration("a", "u", "ip", "eth0", 1, 1)), "x": 1})
    with pytest.raises(ValueError, match="expected a JSON object"):
        from_json(Usage, [1, 2])
    with pytest.raises(ValueError, match="missing"):
        from_json(Registration, {"node": "a"})


def test_a_job_waits_with_a_reason_when_no_agent_is_online(master):
    client = MasterClient(master.url)
    view = client.submit(JOB)
    assert view["state"] == "queued" and view["algorithm"] == "first-fit"
    waiting = wait_for(lambda: client.job("small")["reason"])
    assert waiting  # e.g. "no node fits task w0"
    assert client.health()["nodes_online"] == 0
    nodes = {n["node"]: n for n in client.nodes()}
    assert set(nodes) == {n.name for n in load_topology("campus").nodes}
    assert not nodes["lab1"]["registered"]
    assert client.cancel("small")["state"] == "cancelled"
    with pytest.raises(ApiError) as e:
        client.cancel("small")
    assert e.value.status == 409


def test_bad_requests_are_4xx_with_a_message(master):
    client = MasterClient(master.url)
    with pytest.raises(ApiError) as e:  # would wait forever: campus's largest node has 1.5 cores
        client.submit({**JOB, "task": {"cpu": 2.0, "mem_mb": 256}})
    assert (
        e.value.status == 422
        and "task w0 (cpu 2, mem 256 MB, gpu 0) fits on no node of topology 'campus'"
        in e.value.message
    )
    assert client.jobs() == []
    with pytest.raises(ApiError) as e:
        client.submit({**JOB, "workers": 0})
    assert e.value.status == 400 and "workers" in e.value.message
    with pytest.raises(ApiError) as e:
        client.submit(JOB, algorithm="nope")
    assert e.value.status == 400 and "unknown scheduler" in e.value.message
    with pytest.raises(ApiError) as e:
        client.job("nope")
    assert e.value.status == 404
    with pytest.raises(ApiError) as e:
        client.set_scheduler("nope")
    assert e.value.status == 400
    assert client.health()["scheduler"] == "first-fit"  # unchanged
    with pytest.raises(ApiError) as e:
        client.set_schedulable("nope", False)
    assert e.value.status == 404
    with pytest.raises(ApiError) as e:
        call("POST", master.url + "/agents", {"node": "lab1"})
    assert e.value.status == 400 and "missing" in e.value.message
    reg = Registration("core1", "http://127.0.0.1:9", "10.0.0.99", "eth0", 1, 1)
    with pytest.raises(ApiError) as e:
        call("POST", master.url + "/agents", to_json(reg))
    assert e.value.status == 400 and "not a compute node" in e.value.message
    beat = Heartbeat("lab1", 1, 0.0, Usage(), [])
    with pytest.raises(ApiError) as e:
        call("POST", master.url + "/agents/lab1/heartbeat", to_json(beat))
    assert e.value.status == 409  # not registered
    with pytest.raises(ApiError) as e:
        call("POST", master.url + "/agents/lab2/heartbeat", to_json(beat))
    assert e.value.status == 400  # the URL and the message disagree
    with pytest.raises(ApiError) as e:
        call("DELETE", master.url + "/health")
    assert e.value.status == 405


def test_registration_heartbeat_and_cordon(master):
    client = MasterClient(master.url)
    reg = Registration("lab1", "http://127.0.0.1:9", "10.0.0.1", "eth0", 1.0, 2048)
    assert call("POST", master.url + "/agents", to_json(reg)) == {
        "expected_workers": [],
        "lines": {},
    }
    beat = Heartbeat(
        "lab1",
        1,
        0.0,
        Usage(0.3, 120, 1.5, 0.5),
        [WorkerState("old-w0-a1", "old", "w0", "running")],
    )
    assert call("POST", master.url + "/agents/lab1/heartbeat", to_json(beat)) == {
        "stop": ["old-w0-a1"]
    }  # a worker the Master does not know is stopped
    lab1 = next(n for n in client.nodes() if n["node"] == "lab1")
    assert lab1["online"] and lab1["usage"]["cpu_cores"] == 0.3
    assert client.set_schedulable("lab1", False) == {"node": "lab1", "schedulable": False}
    assert next(n for n in client.nodes() if n["node"] == "lab1")["cordoned"]
    assert client.set_scheduler("k8s-spread", 4) == {
        "algorithm": "k8s-spread",
        "seed": 4,
        "queue": "fifo-backfill",
    }
    assert client.set_scheduler("first-fit", 1, "ces-multi")["queue"] == "ces-multi"
    with pytest.raises(ApiError) as e:
        client.set_scheduler("first-fit", 1, "las")  # preempts: not on the testbed
    assert e.value.status == 400


def test_unreachable_master():
    with pytest.raises(Unreachable):
        MasterClient("http://127.0.0.1:9", timeout_s=2).health()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "master", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_bad_input_exits_2(tmp_path: Path, master):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncollective: ring\nworkers: two\nmodel_params: 10\niterations: 5\n")
    done = run_cli("submit", str(bad), "--master", master.url)
    assert done.returncode == 2 and "workers" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("serve", "--topo", str(tmp_path / "none.yaml"))
    assert done.returncode == 2 and "none.yaml" in done.stderr
    done = run_cli("serve", "--algorithm", "nope", "--port", "0")
    assert done.returncode == 2 and "unknown scheduler" in done.stderr
    good = tmp_path / "good.yaml"
    good.write_text(
        "jobs:\n  - "
        + "\n    ".join(
            f"{k}: {v}"
            for k, v in {
                **JOB,
                "task": "{cpu: 0.5, mem_mb: 256}",
                "workload": "{model: mlp-small}",
            }.items()
        )
    )
    done = run_cli("submit", str(good), "--master", master.url)
    assert done.returncode == 0, done.stderr
    assert "small: queued" in done.stdout
    done = run_cli("status", "--master", master.url)
    assert done.returncode == 0 and "small" in done.stdout
