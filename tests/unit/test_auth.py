"""The shared secret: who must hold it, where it is read from, and that a caller without it is
refused (401) and changes nothing — on the Master's API, an agent's command channel and the SDN
app's REST routes; the Master sends it to the agents and the agents to the Master."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge.simulated import SimulatedAgent
from master import Master, MasterConfig
from protocol.http import ApiError, JsonApp, Server, TokenError, call, listen_token, read_token
from protocol.messages import WorkerSpec
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


@pytest.fixture
def token_file(tmp_path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def wait_for(predicate, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def requests_of(app: JsonApp, values: dict[str, str], bodies: dict[tuple[str, str], object]):
    """One request per route of `app`: the route's groups filled from `values`."""
    for method, rx, _ in app.routes:
        path = re.sub(
            r"\(\?P<(\w+)>[^)]*\)", lambda m: values[m.group(1)], rx.pattern[1:].replace("/?$", "")
        )
        yield method, path, bodies.get((method, path))


def test_the_token_file_is_read_and_checked(tmp_path, token_file):
    assert read_token(token_file) == TOKEN
    with pytest.raises(TokenError, match="cannot read it"):
        read_token(tmp_path / "absent")
    token_file.chmod(0o644)
    with pytest.raises(TokenError, match=r"readable by others.*chmod 600"):
        read_token(token_file)
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    with pytest.raises(TokenError, match="at least 16 characters"):
        read_token(short)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_token(host):
    assert listen_token(host) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.254", "::", "lab-master"])
def test_beyond_loopback_a_token_is_required(host, token_file):
    with pytest.raises(TokenError, match="beyond loopback"):
        listen_token(host)
    assert listen_token(host, str(token_file)) == TOKEN


def test_the_master_refuses_callers_without_the_token_and_changes_nothing():
    topo = load_topology("campus")
    link = topo.links[0]
    master = Master(topo, MasterConfig(algorithm="first-fit", tick_s=0.05), token=TOKEN).start()
    try:
        app = master.server.httpd.get_app()
        bodies = {
            ("POST", "/jobs"): {"job": JOB},
            ("POST", "/agents"): {
                "node": "lab1",
                "url": "http://127.0.0.1:9",
                "ip": "10.0.0.1",
                "iface": "eth0",
                "cpu": 1,
                "mem_mb": 1024,
            },
            ("PUT", "/nodes/lab1"): {"schedulable": False},
            ("PUT", f"/links/{link.a}/{link.b}"): {"bw_mbps": 1.0},
            ("PUT", "/scheduler"): {"algorithm": "random", "seed": 3},
        }
        before = (
            master.scheduler.default,
            set(master.cordoned),
            dict(master.compute.agents),
            list(master.manager.jobs),
            master.cluster.link_capacity(link.a, link.b),
        )
        tried = 0
        for method, path, body in requests_of(
            app, {"node": "lab1", "name": "small", "u": link.a, "v": link.b}, bodies
        ):
            for token in (None, "wrong-token-0123456789"):
                with pytest.raises(ApiError) as e:
                    call(method, master.url + path, body, token=token)
                assert e.value.status == 401, (method, path)
                tried += 1
        assert tried == 2 * len(app.routes) >= 26
        assert (
            master.scheduler.default,
            set(master.cordoned),
            dict(master.compute.agents),
            list(master.manager.jobs),
            master.cluster.link_capacity(link.a, link.b),
        ) == before
        # The same requests with the token are valid: the refusal was the token's alone.
        assert call("POST", master.url + "/jobs", {"job": JOB}, token=TOKEN)
        assert list(master.manager.jobs) == ["small"]
    finally:
        master.stop()


def test_the_master_and_an_agent_hold_each_other_to_the_token():
    master = Master(load_topology("campus"), MasterConfig(tick_s=0.05), token=TOKEN).start()
    agent = SimulatedAgent("lab1", master.url, "10.0.0.1", heartbeat_s=0.1, token=TOKEN).start()
    try:
        wait_for(lambda: "lab1" in master.compute.online())  # the agent sent the token
        spec = WorkerSpec("w-a1", "j", "w0", "ces-worker", ["true"], 0.5, 256)
        # The Master's own (authenticated) shaping: a node that comes up gets its rule set on the
        # control loop's next tick (`NetworkManager.resync`); counted before it, it raced the
        # refused requests below.
        wait_for(lambda: agent.network.updates >= 1)
        shaped = agent.network.updates
        for path, body in (
            (
                "/workers",
                {
                    "name": "w-a1",
                    "job": "j",
                    "task": "w0",
                    "image": "x",
                    "command": ["true"],
                    "cpu": 0.5,
                    "mem_mb": 256,
                },
            ),
            ("/shaping", {"rules": []}),
        ):
            with pytest.raises(ApiError) as e:
                call("PUT" if path == "/shaping" else "POST", agent.server.url + path, body)
            assert e.value.status == 401
        assert not agent.compute.workers and agent.network.updates == shaped
        master.compute.start_worker("lab1", spec)  # the Master sends the token
        assert "w-a1" in agent.compute.workers
    finally:
        agent.stop()
        master.stop()


def test_an_agent_without_the_token_is_not_registered():
    master = Master(load_topology("campus"), MasterConfig(tick_s=0.05), token=TOKEN).start()
    agent = SimulatedAgent("lab1", master.url, "10.0.0.1", heartbeat_s=0.05).start()
    try:
        time.sleep(0.5)  # several registration attempts
        assert not master.compute.agents
    finally:
        agent.stop()
        master.stop()


class _SdnStub:
    """What rest_api calls on the SDN app; records changes."""

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


def test_the_sdn_apps_rest_api_refuses_callers_without_the_token():
    sdn = _SdnStub()
    app = rest_api(sdn, TOKEN)
    server = Server(app).start()
    try:
        body = {"flows": [{"src": "lab1", "dst": "lab2", "path": ["lab1", "lab2"], "rate_mbps": 1}]}
        for method, path, payload in requests_of(
            app, {"job": "j"}, {("PUT", "/jobs/j/flows"): body}
        ):
            with pytest.raises(ApiError) as e:
                call(method, server.url + path, payload)
            assert e.value.status == 401, (method, path)
        assert sdn.changes == []
        call("PUT", server.url + "/jobs/j/flows", body, token=TOKEN)
        assert sdn.changes == [("put", "j")]
    finally:
        server.stop()


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
def test_no_server_listens_beyond_loopback_without_a_token(command, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in command]
    env = {k: v for k, v in os.environ.items() if k != "CES_TOKEN_FILE"}
    done = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "beyond loopback" in lines[0] and "--token-file" in lines[0]
    assert not (tmp_path / "agent").exists()  # nothing made before the refusal


def test_the_token_never_reaches_a_log_line(token_file, tmp_path):
    """A Master serving with a token, driven by the CLI, with debug logging of its requests."""
    env = {**os.environ, "CES_TOKEN_FILE": str(token_file)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "master", "serve", "--port", "0", "--host", "127.0.0.1"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        first = ""
        while "listening on " not in first:
            line = proc.stdout.readline()
            assert line, first
            first += line
        url = first.split("listening on ")[-1].strip()
        status = subprocess.run(
            [sys.executable, "-m", "master", "status", "--master", url],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        refused = subprocess.run(
            [sys.executable, "-m", "master", "status", "--master", url],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in env.items() if k != "CES_TOKEN_FILE"},
        )
        assert refused.returncode == 2 and "bearer token" in refused.stderr
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert TOKEN not in first + out + status.stdout + status.stderr + refused.stderr
