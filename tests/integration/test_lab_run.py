"""`experiments/run.py --hosts` end to end on stand-in real hosts (`testbed.standin`): sshd
containers whose `eth1` hangs off plain OVS bridges (OpenFlow 1.3, fail-mode secure) built for the quick
scenario's topology and connecting to the run's SDN app on the management network over TLS.
run.py checks the hosts over SSH, deploys the agents with their certificates (`lab certs`), runs
the scenario over mutual TLS — a capture of the management network holds neither the token nor
a job in clear — and leaves nothing on the hosts; SIGTERM tears everything down; after a kill -9
of run.py, `--cleanup --hosts` removes what the run left."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
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
from protocol.tls import CONTROL, load_tls
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
    ) as (hosts, inventory, token, pki):

        def args(prefix: str, out: Path) -> list[str]:
            return [
                "--hosts",
                str(inventory),
                "--token-file",
                str(token),
                "--pki",
                str(pki),
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
            "pki": pki,
            "args": args,
            "scenario": scenario,
        }
    assert not (d / "id_rsa").exists() and not (d / "token").exists()  # secrets go with the hosts
    assert not (d / "pki").exists()


def on_hosts(prefix: str) -> list[str]:
    """The run's containers (the stand-in hosts share this machine's engine)."""
    return subprocess.run(
        ["docker", "ps", "-a", "--filter", f"name=^{prefix}-", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    ).stdout.split()


def management_subnet(hosts) -> str:
    net = hosts.client.networks.get(f"{hosts.prefix}-mgmt")
    return net.attrs["IPAM"]["Config"][0]["Subnet"]


def test_quick_scenario_on_real_hosts(standin, tmp_path, prefix):
    """The whole run over TLS, captured on the management network (every interface, the
    loopback one too: run.py reaches the Master at this machine's address on that network)."""
    assert shutil.which("tcpdump"), "tcpdump is needed (scripts/setup.sh installs it)"
    out, pcap = tmp_path / "quick", tmp_path / "run.pcap"
    subnet = management_subnet(standin["hosts"])
    capture = subprocess.Popen(
        ["tcpdump", "-i", "any", "-U", "-s", "0", "-w", str(pcap), "net", subnet],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: pcap.exists(), 10, "tcpdump to start")
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            RUN + ["--quick", *standin["args"](prefix, out)],
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        capture.terminate()
        capture.wait(20)
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
    token = standin["token"].read_text().strip()
    assert token not in (out / "results.json").read_text()
    # Nothing of the run in clear on the network: not the token, not a job's fields, not
    # a line of HTTP; while the Master's and the switches' ports carried the run.
    captured = pcap.read_bytes()
    inv = yaml.safe_load(standin["inventory"].read_text())
    ports = {
        port: subprocess.run(
            ["tcpdump", "-nn", "-r", str(pcap), f"tcp port {port}"],
            capture_output=True,
            text=True,
        ).stdout.count("\n")
        for port in (inv["master_port"], inv["openflow_port"], inv.get("agent_port", 7071))
    }
    clear = [
        s
        for s in (token.encode(), b"Bearer", b"HTTP/1.", b'"collective"', b'"model_params"')
        + tuple(f'"{j["name"]}"'.encode() for j in standin["scenario"]["jobs"])
        if s in captured
    ]
    print(
        f"capture of {subnet}: {len(captured) / 2**20:.1f} MiB, packets on the Master's, "
        f"OpenFlow and agents' ports: {ports}; in clear: {clear or 'nothing'}"
    )
    assert min(ports.values()) > 100 and not clear
    assert ipaddress.ip_address(inv["master"]) in ipaddress.ip_network(subnet)
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
    master = MasterClient(
        f"https://{inventory['master']}:{inventory['master_port']}",
        tls=load_tls(standin["pki"] / CONTROL),
    )
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
    """No shared secret, no certificates (and no --insecure), a certificate that does not name
    its host's address, and an unreachable host: one line each, exit 2, nothing left."""
    args = standin["args"](prefix, tmp_path / "out")
    i = args.index("--pki")
    done = subprocess.run(
        RUN + ["--quick", *args[:i], *args[i + 2 :]],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "CES_PKI_DIR"},
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "give --pki DIR" in done.stderr and "--insecure" in done.stderr
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
    node = inventory["hosts"][1]["node"]
    # its certificate names the host's old address: refused before anything is made
    done = subprocess.run(RUN + ["--quick", *args], capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    cert = standin["pki"] / f"agent-{node}" / "cert.pem"
    assert lines[0].startswith(f"error: {cert}: names ") and "not 127.0.0.1" in lines[0], lines
    # without certificates (--insecure), the host itself is refused
    i = args.index("--pki")
    done = subprocess.run(
        RUN + ["--quick", *args[:i], *args[i + 2 :], "--insecure"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {node} (") and "unreachable over SSH" in lines[0]
    assert on_hosts(prefix) == [] and leftovers(prefix)["processes"] == []
