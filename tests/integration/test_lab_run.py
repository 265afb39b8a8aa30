"""`experiments/run.py --hosts` end to end on stand-in real hosts (`testbed.standin`): sshd
containers whose `eth1` hangs off plain OVS bridges (OpenFlow 1.3, fail-mode secure) built for the quick
scenario's topology and connecting to the run's SDN app on the management network. run.py checks
the hosts over SSH, deploys the agents, runs the scenario and leaves nothing on the hosts;
SIGTERM tears everything down; after a kill -9 of run.py, `--cleanup --hosts` removes what the
run left."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from polling import wait_for

from master.client import MasterClient
from protocol.http import Unreachable, free_port
from testbed import leftovers
from testbed.standin import standin_lab
from topologies import load_topology

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(REPO / "experiments" / "run.py")]
QUICK = REPO / "experiments" / "scenarios" / "quick.yaml"
from experiments.e2e.scenario import scaled


@pytest.fixture(scope="module")
def standin(tmp_path_factory, worker_image, testbed_host):
    """The quick scenario's topology as stand-in hosts and switches (links shaped as the
    emulation shapes them); a run on them with `args(prefix, out)`."""
    d = tmp_path_factory.mktemp("labrun")
    scenario = yaml.safe_load(QUICK.read_text())
    topo = scaled(load_topology(scenario["topology"]), scenario["link_scale"])
    with standin_lab(
        d, topo, worker_image, f"lr{secrets.token_hex(2)}", free_port(), free_port()
    ) as (hosts, inventory, token):

        def args(prefix: str, out: Path) -> list[str]:
            return [
                "--hosts",
                str(inventory),
                "--token-file",
                str(token),
                "--prefix",
                prefix,
                "--out",
                str(out),
                "--accept-new-host-keys",
            ]

        yield {
            "hosts": hosts,
            "inventory": inventory,
            "token": token,
            "args": args,
            "scenario": scenario,
        }
    assert not (d / "id_rsa").exists() and not (d / "token").exists()  # secrets go with the hosts


def on_hosts(prefix: str) -> list[str]:
    """The run's containers (the stand-in hosts share this machine's engine)."""
    return subprocess.run(
        ["docker", "ps", "-a", "--filter", f"name=^{prefix}-", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    ).stdout.split()


def test_quick_scenario_on_real_hosts(standin, tmp_path, prefix):
    out = tmp_path / "quick"
    t0 = time.monotonic()
    done = subprocess.run(
        RUN + ["--quick", *standin["args"](prefix, out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.monotonic() - t0
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert on_hosts(prefix) == []
    res = json.loads((out / "results.json").read_text())
    scenario = standin["scenario"]
    assert res["mode"] == "hosts" and res["inventory"] == str(standin["inventory"])
    assert [r["scheduler"] for r in res["runs"]] == scenario["schedulers"]
    targets = {j["name"]: j["target_accuracy"] for j in scenario["jobs"]}
    rows = [row for r in res["runs"] for row in r["jobs"]]
    assert sorted(row["job"] for row in rows) == sorted(list(targets) * len(res["runs"]))
    for row in rows:
        assert row["state"] == "finished", row
        assert row["final_accuracy"] is not None and 0 < row["final_accuracy"] <= 1, row
        assert len(set(row["placement"].values())) > 1 and row["flows"], row
        if row["reached_target"]:
            assert 0 < row["tta_s"] < row["jct_s"]
            assert row["final_accuracy"] >= targets[row["job"]]
    assert any(r["reached_target"] for r in rows)
    bg = scenario["background"][0]
    for r in res["runs"]:  # the other tenant's transfer ran on the hosts, seen on its path
        assert (
            max(x or 0 for x in r["links"]["mbps"][f"{bg['src']}>{bg['path'][0]}"])
            >= 0.5 * bg["mbps"]
        )
    assert standin["token"].read_text().strip() not in (out / "results.json").read_text()
    print(f"run.py --quick --hosts: {wall:.0f} s wall, deploy {res['deploy_s']:.1f} s")


def started(standin, prefix: str, out: Path, log: Path) -> subprocess.Popen:
    """run.py --quick --hosts, once every host's agent container exists."""
    run = subprocess.Popen(
        RUN + ["--quick", *standin["args"](prefix, out)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(
            lambda: (
                len([c for c in on_hosts(prefix) if "-agent-" in c])
                == len(standin["hosts"].topo.nodes)
            ),
            180,
            "the agents to be deployed",
        )
    except BaseException:
        run.kill()
        run.wait()
        raise
    return run


def test_sigterm_tears_everything_down(standin, tmp_path, prefix):
    run = started(standin, prefix, tmp_path / "out", tmp_path / "run.log")
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=120) == 130, (tmp_path / "run.log").read_text()[-2000:]
    assert on_hosts(prefix) == [] and leftovers(prefix)["processes"] == []


def test_cleanup_after_kill_9_removes_the_agents(standin, tmp_path, prefix):
    """kill -9 of run.py once the agents are on the Master: its agents (and its SDN app and
    Master, in sessions of their own) survive it; `--cleanup --hosts --prefix` removes them."""
    run = started(standin, prefix, tmp_path / "killed", tmp_path / "run.log")
    run.kill()
    run.wait()
    assert on_hosts(prefix)  # the agents outlive run.py
    inventory = yaml.safe_load(standin["inventory"].read_text())
    master = MasterClient(f"http://{inventory['master']}:{inventory['master_port']}")
    t0 = time.monotonic()
    done = subprocess.run(
        RUN + ["--cleanup", "--hosts", str(standin["inventory"]), "--prefix", prefix],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert on_hosts(prefix) == [], done.stdout
    assert leftovers(prefix)["processes"] == []  # the SDN app and the Master too
    with pytest.raises(Unreachable):
        master.health()
    print(f"cleanup after kill -9: {time.monotonic() - t0:.1f} s")


def test_bad_input_in_hosts_mode_is_one_line(standin, tmp_path, prefix):
    """No shared secret, and an unreachable host: one line each, exit 2, nothing left."""
    args = standin["args"](prefix, tmp_path / "out")
    i = args.index("--token-file")
    no_token = args[:i] + args[i + 2 :]
    env = {k: v for k, v in os.environ.items() if k != "CES_TOKEN_FILE"}
    done = subprocess.run(
        RUN + ["--quick", *no_token], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "need the shared secret" in done.stderr
    inventory = yaml.safe_load(standin["inventory"].read_text())
    inventory["hosts"][1] |= {"address": "127.0.0.1", "port": 1}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(inventory))
    args[args.index("--hosts") + 1] = str(bad)
    done = subprocess.run(RUN + ["--quick", *args], capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert (
        lines[0].startswith(f"error: {inventory['hosts'][1]['node']} (")
        and "unreachable over SSH" in lines[0]
    )
    assert on_hosts(prefix) == [] and leftovers(prefix)["processes"] == []
