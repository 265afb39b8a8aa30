"""Real-host mode on this machine, for real: `python -m lab` deploys edge agents over SSH to
stand-in hosts (containers running sshd, `testbed.standin.LabHosts`) whose data interfaces hang
off a plain OVS bridge; a Master on the management network (beyond loopback, so with the shared
secret and mutual TLS, the certificates made by `python -m lab certs`) registers them, and a job
spans the two hosts over the bridge the SDN app controls. Bad inventories and hosts are refused
with one line naming host and problem, leaving nothing."""

from __future__ import annotations

import os
import secrets
import ssl
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_sdn_app import ControllerProcess, wait_for

from master.client import MasterClient
from master.manager import TERMINAL
from protocol.http import ApiError, TlsRefused, Unreachable, call
from protocol.tls import CONTROL, Tls, load_tls
from testbed.standin import LabHosts, new_key
from topologies import load_topology

REPO = Path(__file__).resolve().parents[2]
TOPO = {
    "name": "lab",
    "switches": [{"name": "s1"}],
    "nodes": [
        {"name": "lab1", "cpu": 0.5, "mem_mb": 512},
        {"name": "lab2", "cpu": 0.5, "mem_mb": 512},
    ],
    "links": [{"ends": ["lab1", "s1"], "bw_mbps": 100}, {"ends": ["lab2", "s1"], "bw_mbps": 100}],
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory, worker_image, testbed_host):
    d = tmp_path_factory.mktemp("lab")
    (d / "topo.yaml").write_text(yaml.safe_dump(TOPO))
    topo = load_topology(d / "topo.yaml")
    pub = new_key(d / "id_rsa")
    new_key(d / "other_key")
    token = d / "token"
    token.write_text(secrets.token_urlsafe(24) + "\n")
    token.chmod(0o600)
    sdn = ControllerProcess(d / "topo.yaml", d)
    hosts = LabHosts(
        topo,
        f"lb{secrets.token_hex(2)}",
        ("127.0.0.1", sdn.of_port),
        image=worker_image,
        pubkey=pub,
        spares=("nodocker",),
    )
    with hosts:
        sdn.start()
        try:
            yield {"dir": d, "topo": topo, "hosts": hosts, "token": token, "sdn": sdn}
        finally:
            sdn.stop()


def inventory(lab, path: Path, **host_changes) -> Path:
    """An inventory of the stand-in hosts; `host_changes[node]` overrides that host's fields."""
    doc = lab["hosts"].inventory(lab["dir"] / "id_rsa", lab["dir"] / "known_hosts")
    for h in doc["hosts"]:
        h.update(host_changes.get(h["node"], {}))
    path.write_text(yaml.safe_dump(doc))
    return path


def deploy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lab", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )


def leftovers(prefix: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"name=^{prefix}-", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    ).stdout
    return out.split()


def test_check_refuses_unknown_host_keys_unless_accepted(lab, tmp_path):
    inv = inventory(lab, tmp_path / "inv.yaml")
    topo = str(lab["dir"] / "topo.yaml")
    (lab["dir"] / "known_hosts").unlink(missing_ok=True)
    done = deploy("check", "--hosts", str(inv), "--topo", topo)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 2, done.stderr
    assert all("unknown host key ssh-" in ln and "--accept-new-host-keys" in ln for ln in lines)
    done = deploy("check", "--hosts", str(inv), "--topo", topo, "--accept-new-host-keys")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": ok (docker ") == 2
    assert len((lab["dir"] / "known_hosts").read_text().splitlines()) == 2
    assert deploy("check", "--hosts", str(inv), "--topo", topo).returncode == 0


BAD_HOSTS = {
    "unreachable": ({"address": "127.0.0.1", "port": 1}, "unreachable over SSH"),
    "wrong key": ({"key_file": "{dir}/other_key"}, "is refused for user root"),
    "changed host key": ({}, "host key CHANGED"),
    "missing interface": ({"iface": "eth9"}, "data interface eth9 does not exist"),
    "too little CPU": ({}, "too small for node lab2"),
    "no Docker": ({}, "no Docker engine answers"),
}


@pytest.mark.parametrize("case", list(BAD_HOSTS))
def test_a_bad_host_is_one_line_and_nothing_is_left(lab, tmp_path, prefix, case):
    """`start` on an inventory with one bad host: exit 2, one line naming the host and its
    problem, and no container of the run on any host."""
    changes, expected = BAD_HOSTS[case]
    changes = {
        k: v.replace("{dir}", str(lab["dir"])) if isinstance(v, str) else v
        for k, v in changes.items()
    }
    topo_file = lab["dir"] / "topo.yaml"
    known = lab["dir"] / "known_hosts"
    deploy(
        "check",
        "--hosts",
        str(inventory(lab, tmp_path / "ok.yaml")),
        "--topo",
        str(topo_file),
        "--accept-new-host-keys",
    )  # the good hosts' keys are known
    if case == "changed host key":
        known = tmp_path / "known_hosts"
        lines = (lab["dir"] / "known_hosts").read_text().splitlines()
        address = lab["hosts"].mgmt["lab2"]
        fake = new_key(tmp_path / "fake")
        known.write_text(
            "\n".join(
                ln if not ln.startswith(address + " ") else f"{address} {fake}" for ln in lines
            )
            + "\n"
        )
    if case == "too little CPU":
        topo = {**TOPO, "nodes": [TOPO["nodes"][0], {"name": "lab2", "cpu": 4, "mem_mb": 512}]}
        topo_file = tmp_path / "big.yaml"
        topo_file.write_text(yaml.safe_dump(topo))
    if case == "no Docker":  # a host with sshd but no Docker (its key accepted below)
        changes = {"address": lab["hosts"].mgmt["nodocker"]}
    inv = inventory(lab, tmp_path / "inv.yaml", lab2=changes)
    doc = yaml.safe_load(inv.read_text())
    doc["known_hosts"] = str(known)
    inv.write_text(yaml.safe_dump(doc))
    done = deploy(
        "start",
        "--hosts",
        str(inv),
        "--topo",
        str(topo_file),
        "--master",
        f"http://{lab['hosts'].gateway}:1",
        "--token-file",
        str(lab["token"]),
        "--insecure",  # the hosts' refusals come first; certificates are another test's
        "--prefix",
        prefix,
        *(["--accept-new-host-keys"] if case == "no Docker" else []),
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: lab2 (") and expected in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    assert leftovers(prefix) == []


def test_bad_inventories_are_one_line(lab, tmp_path):
    topo = str(lab["dir"] / "topo.yaml")
    good = yaml.safe_load(inventory(lab, tmp_path / "inv.yaml").read_text())
    cases = {
        "duplicate node": (
            {"hosts": [good["hosts"][0], good["hosts"][0]]},
            "hosts[1].node: 'lab1' is given twice",
        ),
        "unknown node": (
            {"hosts": [good["hosts"][0], {**good["hosts"][1], "node": "x"}]},
            "hosts[1].node: 'x' is not a compute node",
        ),
        "a node without a host": ({"hosts": good["hosts"][:1]}, "no host for compute node(s) lab2"),
        "no master": ({"master": None}, "master: expected an IP address"),
    }
    for name, (change, expected) in cases.items():
        path = tmp_path / f"{name.replace(' ', '-')}.yaml"
        path.write_text(yaml.safe_dump({**good, **change}))
        done = deploy("check", "--hosts", str(path), "--topo", topo)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (name, done.stderr)
        assert str(path) in lines[0] and expected in lines[0], (name, lines[0])


def test_agents_deployed_over_ssh_run_a_job_across_the_hosts(lab, tmp_path, prefix):
    """Certificates made, deploy with them, register with a Master beyond loopback over mutual
    TLS, refuse callers without a certificate, in plain HTTP or without the secret, run a
    2-worker job whose ranks are on the two hosts, stop, clean up."""
    hosts, token_file = lab["hosts"], lab["token"]
    topo = str(lab["dir"] / "topo.yaml")
    inv = inventory(lab, tmp_path / "inv.yaml")
    pki = tmp_path / "pki"
    made = deploy("certs", "--hosts", str(inv), "--topo", topo, "--pki", str(pki))
    assert made.returncode == 0 and made.stdout.count(": made") == 4, made.stderr  # control,
    # two agents, one switch
    checked = deploy(
        "check", "--hosts", str(inv), "--topo", topo, "--pki", str(pki), "--accept-new-host-keys"
    )
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.count(", certificate until ") == 2 and "control (" in checked.stdout
    env = {**os.environ, "CES_TOKEN_FILE": str(token_file), "PYTHONUNBUFFERED": "1"}
    port = 7000 + secrets.randbelow(1000)
    log = (tmp_path / "master.log").open("w")
    master = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "master",
            "serve",
            "--topo",
            topo,
            "--host",
            hosts.gateway,
            "--port",
            str(port),
            "--sdn",
            lab["sdn"].client.url,
            "--sdn-job-id",
            f"{prefix}-jobs",
            "--image",
            lab["hosts"].image,
            "--algorithm",
            "first-fit",
            "--tls",
            str(pki / CONTROL),
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"https://{hosts.gateway}:{port}"
    token = token_file.read_text().strip()
    control = load_tls(pki / CONTROL)
    client = MasterClient(url, token=token, tls=control)
    try:
        t0 = time.monotonic()
        done = deploy(
            "start",
            "--hosts",
            str(inv),
            "--topo",
            topo,
            "--master",
            url,
            "--token-file",
            str(token_file),
            "--pki",
            str(pki),
            "--prefix",
            prefix,
        )
        assert done.returncode == 0, done.stderr + (tmp_path / "master.log").read_text()
        try:
            client.wait_ready(2, timeout_s=60)
        except TimeoutError:
            logs = [
                subprocess.run(
                    ["docker", "logs", "--tail", "15", f"{prefix}-agent-{n}"],
                    capture_output=True,
                    text=True,
                )
                for n in ("lab1", "lab2")
            ]
            raise AssertionError(
                "agents not online:\n"
                + "\n".join(p.stdout + p.stderr for p in logs)
                + (tmp_path / "master.log").read_text()
            ) from None
        deploy_s = time.monotonic() - t0
        bare = ssl.create_default_context(cafile=pki / "ca.pem")  # trusts the CA, shows nothing
        for node in ("lab1", "lab2"):  # the deployed agents: TLS, a certificate, the secret
            agent = f"https://{hosts.mgmt[node]}:7071/workers"
            with pytest.raises(Unreachable) as plain:
                call("POST", agent.replace("https:", "http:"), {"name": "x"}, token=token)
            assert not isinstance(plain.value, TlsRefused)  # the server hung up
            with pytest.raises(TlsRefused):
                call("POST", agent, {"name": "x"}, token=token, tls=Tls(pki, bare, bare))
            with pytest.raises(ApiError) as e:  # another agent's certificate
                call("POST", agent, {"name": "x"}, token=token, tls=load_tls(pki / "agent-lab1"))
            assert e.value.status == 403
            with pytest.raises(ApiError) as e:
                call("POST", agent, {"name": "x"}, tls=control)
            assert e.value.status == 401
        with pytest.raises(ApiError) as e:
            MasterClient(url, tls=control).jobs()
        assert e.value.status == 401
        with pytest.raises(TlsRefused):
            MasterClient(url, token=token, tls=Tls(pki, bare, bare)).jobs()
        job = {
            "name": "span",
            "collective": "ring",
            "workers": 2,
            "task": {"cpu": 0.4, "mem_mb": 400},
            "model_params": 85000,
            "demand_mbps": 20,
            "iterations": 100,
            "workload": {"model": "mlp-small", "dataset": "mnist5k"},
        }
        client.submit(job)
        view = wait_for(
            lambda: (v := client.job("span"))["state"] in TERMINAL and v,
            300,
            "the job to end",
        )
        assert view["state"] == "finished", view
        placement = view["attempts"][-1]["placement"]
        assert sorted(placement.values()) == ["lab1", "lab2"], placement
        print(f"deploy (warm) + registration: {deploy_s:.1f} s")
    finally:
        stop = deploy("stop", "--hosts", str(inv), "--topo", topo, "--prefix", prefix)
        clean = deploy("cleanup", "--hosts", str(inv), "--topo", topo, "--prefix", prefix)
        master.terminate()
        master.wait(20)
    assert stop.returncode == 0 and clean.returncode == 0, stop.stderr + clean.stderr
    assert leftovers(prefix) == []
    assert token not in (tmp_path / "master.log").read_text()
