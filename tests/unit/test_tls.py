"""TLS for real, on loopback: the lab's certificates (`lab.pki`), the one context builder
(`protocol.tls`), and every API refusing what it must — a client without a certificate, with one
of another CA, an expired one, one whose name may not make the request, plain HTTP — with
nothing changed, while the Master and an agent hold each other to the lab's CA (mutual TLS)."""

from __future__ import annotations

import datetime as dt
import os
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from edge.simulated import SimulatedAgent
from lab import pki
from lab.inventory import load_inventory
from master import Master, MasterConfig
from master.compute import AgentError
from protocol.http import (
    ApiError,
    JsonApp,
    Server,
    TlsRefused,
    Unreachable,
    call,
    listen_tls,
)
from protocol.messages import WorkerSpec
from protocol.tls import CONTROL, Tls, TlsError, agent_identity, load_tls
from sdn_app.rest import rest_api
from topologies import load_topology

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-0123456789abcdef"
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
SPEC = {
    "name": "w-a1",
    "job": "j",
    "task": "w0",
    "image": "x",
    "command": ["true"],
    "cpu": 0.5,
    "mem_mb": 256,
}
FLOWS = {"flows": [{"src": "lab1", "dst": "lab2", "path": ["lab1", "lab2"], "rate_mbps": 1}]}
LOOPBACK = ["127.0.0.1", "localhost"]


def wait_for(predicate, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def ids(tmp_path_factory) -> dict[str, Tls]:
    """The lab's identities on loopback, and the bad clients: `other-ca` (a certificate named
    `control` from another CA; it trusts the lab's CA, as an attacker who copied ca.pem would),
    `expired` (the lab's, named `control`, expired yesterday), `switch` (the lab's, valid, but a
    switch's) and `no-cert` (trusts the lab's CA, shows nothing)."""
    d = tmp_path_factory.mktemp("pki")
    ca_key, ca = pki.make_ca()
    for name, names in {
        CONTROL: LOOPBACK,
        agent_identity("lab1"): ["lab1", "127.0.0.1"],
        agent_identity("lab2"): ["lab2", "127.0.0.1"],
        "switch-s1": ["s1"],
        "misnamed": ["srv1", "10.9.9.9"],  # agent-srv1's, but not for 127.0.0.1
    }.items():
        cn = agent_identity("srv1") if name == "misnamed" else name
        key, cert = pki.issue(ca_key, ca, cn, names)
        pki.write_identity(d / name, key, cert, ca)
    other_key, other = pki.make_ca("another CA")
    key, cert = pki.issue(other_key, other, CONTROL, LOOPBACK)
    pki.write_identity(d / "other-ca", key, cert, ca)
    key, cert = pki.issue(
        ca_key, ca, CONTROL, LOOPBACK, days=1, not_before=pki._now() - dt.timedelta(days=2)
    )
    pki.write_identity(d / "expired", key, cert, ca)
    out = {p.name: load_tls(p) for p in d.iterdir() if p.is_dir()}
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.load_verify_locations(cafile=d / CONTROL / "ca.pem")
    out["no-cert"] = Tls(d, out[CONTROL].server, bare)
    return out


# --- certificates -------------------------------------------------------------------------------


def lab_inventory(tmp_path: Path, address2: str = "192.168.50.12"):
    topo = load_topology("campus")
    key = tmp_path / "id"
    key.write_text("k")
    doc = {
        "master": "192.168.50.1",
        "defaults": {"user": "ces", "key_file": str(key), "iface": "eth1"},
        "hosts": [
            {"node": n.name, "address": f"192.168.50.{11 + i}" if i != 1 else address2}
            for i, n in enumerate(topo.nodes)
        ],
    }
    path = tmp_path / "lab.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_inventory(path, topo), topo


def test_certs_are_made_once_with_every_name_and_private_keys_0600(tmp_path):
    inv, topo = lab_inventory(tmp_path)
    out = tmp_path / "pki"
    done = pki.make_lab(out, inv, topo)
    assert set(done.values()) == {"made"}
    assert len(done) == 1 + len(inv.hosts) + len(topo.switches)
    assert (out / "ca.key").stat().st_mode & 0o777 == 0o600
    for identity in done:
        assert (out / identity / "key.pem").stat().st_mode & 0o777 == 0o600
        assert (out / identity).stat().st_mode & 0o777 == 0o700
        load_tls(out / identity)  # each one a usable identity
    h = inv.hosts[0]
    facts = pki.read_cert(out / agent_identity(h.node))
    assert facts.identity == agent_identity(h.node)
    assert set(facts.names) == {h.node, h.address}
    assert set(pki.read_cert(out / CONTROL).names) == {
        "192.168.50.1",
        "127.0.0.1",
        "::1",
        "localhost",
    }
    assert 364 < facts.days_left() <= 365
    # again: all kept; a host whose address changed gets a new certificate, the rest kept
    assert set(pki.make_lab(out, inv, topo).values()) == {"kept"}
    inv2, _ = lab_inventory(tmp_path, address2="192.168.50.99")
    again = pki.make_lab(out, inv2, topo)
    moved = agent_identity(inv.hosts[1].node)
    assert again[moved].startswith("renewed: ") and "192.168.50.99" in again[moved]
    assert {k: v for k, v in again.items() if k != moved} == dict.fromkeys(
        set(again) - {moved}, "kept"
    )


def test_check_reports_expiry_and_mismatched_names(tmp_path):
    inv, topo = lab_inventory(tmp_path)
    out = tmp_path / "pki"
    pki.make_lab(out, inv, topo)
    h = inv.hosts[0]
    identity = agent_identity(h.node)
    assert pki.check_identity(out, identity, [h.node, h.address])[1] == ""
    _, problem = pki.check_identity(out, identity, [h.node, "192.168.50.200"])
    assert f"{out / identity / 'cert.pem'}: names " in problem and "not 192.168.50.200" in problem
    ca_key, ca = pki.load_ca(out)
    old = pki._now() - dt.timedelta(days=400)
    pki.write_identity(
        out / identity, *pki.issue(ca_key, ca, identity, [h.node, h.address], 365, old), ca
    )
    assert "expired on" in pki.check_identity(out, identity, [h.node, h.address])[1]
    soon = pki._now() - dt.timedelta(days=350)
    pki.write_identity(
        out / identity, *pki.issue(ca_key, ca, identity, [h.node, h.address], 365, soon), ca
    )
    assert "expires on" in pki.check_identity(out, identity, [h.node, h.address])[1]
    pki.write_identity(out / identity, *pki.issue(ca_key, ca, CONTROL, [h.node, h.address]), ca)
    assert "it is 'control''s certificate" in pki.check_identity(out, identity, [h.node])[1]
    other_key, other = pki.make_ca("x")
    pki.write_identity(out / identity, *pki.issue(other_key, other, identity, [h.node]), other)
    assert "not signed by the lab's CA" in pki.check_identity(out, identity, [h.node])[1]


def test_an_unusable_identity_is_one_line_naming_it(tmp_path, ids):
    folder = tmp_path / "id"
    folder.mkdir()
    with pytest.raises(TlsError, match=r"cert\.pem is missing"):
        load_tls(folder)
    src = Path(ids[CONTROL].folder)
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (folder / name).write_bytes((src / name).read_bytes())
    (folder / "key.pem").chmod(0o644)
    with pytest.raises(TlsError, match=r"key.pem is readable by others.*chmod 600"):
        load_tls(folder)
    (folder / "key.pem").write_bytes((Path(ids["switch-s1"].folder) / "key.pem").read_bytes())
    (folder / "key.pem").chmod(0o600)
    with pytest.raises(TlsError, match="not the certificate's"):
        load_tls(folder)


# --- plain HTTP stays on loopback ---------------------------------------------------------------


def test_plain_http_beyond_loopback_needs_insecure_and_is_warned_about(caplog):
    assert listen_tls("127.0.0.1") is None
    with pytest.raises(TlsError, match=r"beyond loopback\) in plain HTTP.*--tls DIR.*--insecure"):
        listen_tls("0.0.0.0", what="the Master")
    with caplog.at_level("WARNING"):
        assert listen_tls("0.0.0.0", insecure=True, what="the Master") is None
    assert "PLAIN HTTP (--insecure)" in caplog.text


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "master", "serve", "--host", "0.0.0.0", "--port", "0"],
        ["-m", "sdn_app", "--rest", "0.0.0.0:0", "--of-port", "0"],
        [
            "-m",
            "edge",
            "--node",
            "lab1",
            "--master",
            "http://127.0.0.1:9",
            "--listen",
            "0.0.0.0:0",
            "--workdir",
            "{tmp}/agent",
        ],
    ],
)
def test_no_server_serves_plain_http_beyond_loopback_without_insecure(command, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command]
    env = {k: v for k, v in os.environ.items() if k != "CES_TLS_DIR"}
    done = subprocess.run(
        [sys.executable, *argv, "--token-file", str(token)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "in plain HTTP" in lines[0] and "--insecure" in lines[0], lines
    assert not (tmp_path / "agent").exists()  # nothing made before the refusal


def test_insecure_serves_with_a_warning_at_start(tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "master", "serve", "--host", "0.0.0.0", "--port", "0"]
        + ["--token-file", str(token), "--insecure"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening on http://0.0.0.0:" in proc.stdout.readline()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "the Master listens on 0.0.0.0 in PLAIN HTTP (--insecure)" in err


# --- the refusal matrix -------------------------------------------------------------------------

BAD_CLIENTS = ["no-cert", "other-ca", "expired", "switch-s1", "plain"]


def attempt(ids, who: str, method: str, url: str, body) -> str:
    """What `who` got: 'ok', 'TLS refused', 'connection closed' or the HTTP status."""
    try:
        if who == "plain":
            call(method, url.replace("https://", "http://"), body, token=TOKEN)
        else:
            call(method, url, body, token=TOKEN, tls=ids[who])
        return "ok"
    except TlsRefused:
        return "TLS refused"
    except Unreachable:
        return "connection closed"
    except ApiError as e:
        return str(e.status)


EXPECTED = {
    "no-cert": "TLS refused",
    "other-ca": "TLS refused",
    "expired": "TLS refused",
    "switch-s1": "403",
    "plain": "connection closed",
}


class _SdnStub:
    def __init__(self):
        self.changes = []

    def put_job(self, job, body):
        self.changes.append(("put", job))
        return {}

    def delete_job(self, job):
        self.changes.append(("delete", job))
        return {}

    def job_view(self, job):
        return {}

    jobs_view = links_view = switches_view = health_view = lambda self: {}


def test_the_refusal_matrix(ids, capsys):
    """Every bad client against the Master's API, an agent's command channel and the SDN app's
    REST API: refused, and nothing changed; the control machine's certificate then succeeds."""
    master = Master(
        load_topology("campus"), MasterConfig(tick_s=0.05), token=TOKEN, tls=ids[CONTROL]
    ).start()
    agent = SimulatedAgent(
        "lab1", master.url, "10.0.0.1", heartbeat_s=0.1, token=TOKEN, tls=ids["agent-lab1"]
    ).start()
    sdn = _SdnStub()
    rest = Server(rest_api(sdn, TOKEN), tls=ids[CONTROL]).start()
    targets = {
        "Master POST /jobs": ("POST", master.url + "/jobs", {"job": JOB}),
        "agent POST /workers": ("POST", agent.server.url + "/workers", SPEC),
        "SDN app PUT /jobs/j/flows": ("PUT", rest.url + "/jobs/j/flows", FLOWS),
    }
    try:
        wait_for(lambda: "lab1" in master.compute.online())
        rows = {
            t: {who: attempt(ids, who, *req) for who in BAD_CLIENTS} for t, req in targets.items()
        }
        assert not master.manager.jobs and not agent.compute.specs and sdn.changes == []
        good = {t: attempt(ids, CONTROL, *req) for t, req in targets.items()}
        assert good == dict.fromkeys(targets, "ok")
        assert list(master.manager.jobs) == ["small"] and "w-a1" in agent.compute.specs
        assert sdn.changes == [("put", "j")]
    finally:
        agent.stop()
        rest.stop()
        master.stop()
    with capsys.disabled():
        print("\n| target | " + " | ".join(BAD_CLIENTS) + " | control |")
        for t, row in rows.items():
            print(f"| {t} | " + " | ".join(row.values()) + f" | {good[t]} |")
    assert rows == dict.fromkeys(targets, EXPECTED)


def test_the_master_and_the_agents_hold_each_other_to_the_labs_ca(ids):
    """Registration and heartbeats with the agent's certificate, commands with the control
    machine's; an agent's certificate may not speak for another node, nor command an agent; a
    Master calling an agent whose certificate does not name its address refuses it."""
    master = Master(
        load_topology("campus"), MasterConfig(tick_s=0.05), token=TOKEN, tls=ids[CONTROL]
    ).start()
    lab1 = SimulatedAgent(
        "lab1", master.url, "10.0.0.1", heartbeat_s=0.1, token=TOKEN, tls=ids["agent-lab1"]
    ).start()
    impostor = SimulatedAgent(  # lab2's certificate, registering as lab3
        "lab3", master.url, "10.0.0.3", heartbeat_s=0.1, token=TOKEN, tls=ids["agent-lab2"]
    ).start()
    misnamed = SimulatedAgent(  # its certificate names 10.9.9.9, it serves on 127.0.0.1
        "srv1", master.url, "10.0.0.4", heartbeat_s=0.1, token=TOKEN, tls=ids["misnamed"]
    ).start()
    try:
        wait_for(lambda: "lab1" in master.compute.online())
        spec = WorkerSpec("w-a1", "j", "w0", "ces-worker", ["true"], 0.5, 256)
        master.compute.start_worker("lab1", spec)
        assert "w-a1" in lab1.compute.specs
        with pytest.raises(ApiError) as e:  # lab1's agent commanding lab1's agent
            call(
                "POST",
                lab1.server.url + "/workers",
                SPEC | {"name": "w2"},
                token=TOKEN,
                tls=ids["agent-lab1"],
            )
        assert e.value.status == 403 and "agent-lab1" in e.value.message
        with pytest.raises(ApiError) as e:  # lab2's heartbeat path with lab1's certificate
            call(
                "POST",
                master.url + "/agents/lab2/heartbeat",
                {},
                token=TOKEN,
                tls=ids["agent-lab1"],
            )
        assert e.value.status == 403
        time.sleep(0.5)  # the impostor's registrations, every 0.1 s
        assert "lab3" not in master.compute.agents
        wait_for(lambda: "srv1" in master.compute.online())  # its client side is fine
        with pytest.raises(AgentError, match=r"TLS refused.*not valid for '127\.0\.0\.1'"):
            master.compute.start_worker(
                "srv1", WorkerSpec("w-m", "j", "w0", "x", ["true"], 0.5, 256)
            )
        assert not misnamed.compute.specs
    finally:
        for a in (lab1, impostor, misnamed):
            a.stop()
        master.stop()


def test_kept_connections_yield_their_threads_to_a_waiting_one(ids):
    """Two client threads keep their HTTPS connections to a server of two serving threads; a
    third client is served at once (an idle kept connection gives its thread up), and the two
    are served again (on new connections)."""
    app = JsonApp(token=TOKEN)
    app.route("GET", "/x", lambda req: {"ok": True})
    server = Server(app, tls=ids[CONTROL]).start()
    server.httpd.max_threads = 2
    again, done = threading.Event(), threading.Event()
    answers = []

    def keeper() -> None:  # a thread's connection lives as long as the thread
        answers.append(call("GET", server.url + "/x", token=TOKEN, tls=ids[CONTROL]))
        again.wait(10)
        answers.append(call("GET", server.url + "/x", token=TOKEN, tls=ids[CONTROL]))
        done.wait(10)

    keepers = [threading.Thread(target=keeper) for _ in range(2)]
    try:
        for t in keepers:
            t.start()
        wait_for(lambda: len(answers) == 2)
        assert server.httpd._threads == 2 and server.httpd._idle == 0  # both held
        t0 = time.monotonic()
        assert call("GET", server.url + "/x", token=TOKEN, tls=ids[CONTROL]) == {"ok": True}
        assert time.monotonic() - t0 < 2.0  # not after the idle timeout (15 s)
        again.set()
        wait_for(lambda: len(answers) == 4)
        assert answers == [{"ok": True}] * 4
    finally:
        again.set()
        done.set()
        for t in keepers:
            t.join()
        server.stop()
