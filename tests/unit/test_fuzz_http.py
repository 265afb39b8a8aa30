"""Fuzzing every HTTP endpoint of the Master, the edge agent and the SDN app (issue 21): whatever
an outsider sends — malformed JSON, wrong types, missing and unknown fields, huge or endless
bodies, names with path separators or control characters, out-of-range numbers, wrong methods,
unknown paths — the answer is a 4xx with a JSON message naming the problem (never a 5xx, a
dropped connection or a traceback), and a refused request changes nothing.

The real servers and handlers run in-process on loopback: a Master with no agents (nothing can be
placed, so an accepted job just waits), the agent's Messenger in front of the simulated worker
backend (`edge.simulated`, no Docker) and the real Network Manager with its `tc` calls kept in a
dict (as tests/unit/test_edge.py does: no qdisc of this host is touched), and the SDN app with no
switch connected — where a valid flow change is the documented 503 "nothing was changed".
"""

from __future__ import annotations

import http.client
import json
import math
import re
import socket
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from fuzz_strategies import Mutation, bad_names, mutated, raw_bodies
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from edge import network as edge_network
from edge.messenger import Messenger
from edge.simulated import SimulatedCompute
from master import Master, MasterConfig
from protocol import http as protocol_http
from protocol.http import MAX_BODY, Server
from protocol.messages import Heartbeat, Registration, Usage, WorkerState, to_json
from sdn_app.app import CesSdnApp
from sdn_app.flows import parse_flows
from sdn_app.monitor import NetworkMonitor
from sdn_app.rest import rest_api
from topologies import load_topology

# Each example is one loopback request (~1-3 ms); 60 per endpoint keeps the file near 20 s.
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE", "BREW"]

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
REGISTRATION = to_json(Registration("lab1", "http://127.0.0.1:9", "10.0.0.1", "eth0", 1.0, 2048))
HEARTBEAT = to_json(
    Heartbeat(
        "lab1",
        1,
        0.0,
        Usage(0.1, 100, 1.0, 1.0),
        [WorkerState("j-w0-a1", "j", "w0", "running")],
        [{"worker": "j-w0-a1", "type": "eval"}],
    )
)
WORKER = {
    "name": "j-w0-a1",
    "job": "j",
    "task": "w0",
    "image": "ces-worker",
    "command": ["python3", "-m", "workloads.train"],
    "cpu": 0.5,
    "mem_mb": 256,
}
RULE = {"dst_ip": "10.0.0.2", "rate_mbps": 20}
FLOW = {"src": "lab1", "dst": "srv1", "path": ["acc1", "agg1", "acc4"], "rate_mbps": 20}


# --- talking to a server ------------------------------------------------------------------------
@dataclass
class Answer:
    status: int
    doc: Any
    raw: bytes

    @property
    def text(self) -> str:
        """The error message and its field, as a user reads them."""
        return (
            f"{self.doc.get('field', '')}: {self.doc.get('error', '')}"
            if isinstance(self.doc, dict)
            else ""
        )


def send(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One raw request (http.client: any method, any bytes). A dropped connection raises."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=20)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        ctype = resp.getheader("Content-Type", "")
    finally:
        conn.close()
    assert b"Traceback" not in raw and b'File "' not in raw, raw[:500]
    if method == "HEAD":  # no body comes back
        return Answer(resp.status, None, raw)
    assert ctype.startswith("application/json"), (resp.status, ctype, raw[:200])
    return Answer(resp.status, json.loads(raw), raw)


def send_json(url: str, method: str, path: str, doc: Any) -> Answer:
    # allow_nan: JSON has no NaN/Infinity, but Python's encoder (and many clients) send them
    return send(url, method, path, json.dumps(doc).encode(), {"Content-Type": "application/json"})


def quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def check(
    answer: Answer, state: Callable[[], Any], before: Any, allowed_5xx: str | None = None
) -> None:
    """The property: below 500 (or the one documented 5xx, by its words); a refusal carries an
    error message and leaves `state()` as it was."""
    if answer.status >= 500:
        assert allowed_5xx and answer.status == 503 and allowed_5xx in answer.doc["error"], (
            answer.status,
            answer.raw[:300],
        )
    if answer.status >= 400:
        if answer.doc is not None:  # HEAD
            assert isinstance(answer.doc, dict) and isinstance(answer.doc.get("error"), str)
            assert answer.doc["error"].strip()
        assert state() == before, answer.text


def names_the_field(answer: Answer, m: Mutation) -> None:
    """An added unknown field is refused by its name (a typo is never silently ignored); a wrong
    value that is refused as bad input is named too."""
    if m.kind == "unknown":
        assert answer.status == 400 and m.field in answer.text, (m, answer.text)
    elif answer.status == 400 and m.kind == "value" and m.field.isidentifier():
        assert m.field in answer.text, (m, answer.text)


# --- the servers --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def master():
    """Jobs, scheduler, nodes and links: no agent ever registers here, so jobs only wait."""
    m = Master(load_topology("campus"), MasterConfig(algorithm="first-fit", tick_s=0.05)).start()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def agents_master():
    """Registrations and heartbeats, on a Master that never gets a job (nothing is placed)."""
    m = Master(load_topology("campus"), MasterConfig(algorithm="first-fit", tick_s=0.05)).start()
    answer = send_json(m.url, "POST", "/agents", REGISTRATION)
    assert answer.status == 200, answer.raw
    yield m
    m.stop()


def master_state(m: Master) -> tuple:
    with m.lock:
        s = m.scheduler
        return (
            {n: r.state.value for n, r in m.manager.jobs.items()},
            (s.default, s.seed, s.queue),
            frozenset(m.cordoned),
            {n: a.reg for n, a in m.compute.agents.items()},
            {(u, v): d["bw_mbps"] for u, v, d in m.cluster.graph.edges(data=True)},
        )


@dataclass
class AgentUnderTest:
    url: str
    compute: SimulatedCompute
    kernel: dict[int, float]  # tc class minor -> Mbit/s: what the Network Manager set

    def state(self) -> tuple:
        return sorted(self.compute.workers), sorted(self.compute.specs), dict(self.kernel)


@pytest.fixture(scope="module")
def agent():
    kernel: dict[int, float] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(edge_network.tc, "link_rate", lambda dev, pid, dilation: 1000.0)
        mp.setattr(edge_network.tc, "destinations", lambda dev, pid, dilation: dict(kernel))
        mp.setattr(
            edge_network.tc,
            "set_destination",
            lambda dev, ip, rate, pid, dilation: kernel.__setitem__(
                edge_network.tc.class_minor(ip), rate
            ),
        )
        mp.setattr(edge_network.tc, "remove_class", lambda dev, minor, pid: kernel.pop(minor))
        compute = SimulatedCompute()
        app = protocol_http.JsonApp()
        reg = Registration("n1", "http://127.0.0.1:9", "10.0.0.1", "eth0", 1.0, 2048)
        # usage=None: the Messenger's loop (heartbeats, the only user) is never started
        Messenger(
            reg,
            "http://127.0.0.1:9",
            compute,
            edge_network.NetworkManager("eth0", None),
            None,
            30.0,
        ).routes(app)
        server = Server(app).start()
        yield AgentUnderTest(server.url, compute, kernel)
        server.stop()


@pytest.fixture(scope="module")
def sdn():
    """The SDN app with no switch connected, holding one job ("keep", lab1 -> srv1)."""
    app = CesSdnApp(monitor=NetworkMonitor())
    keep = parse_flows({"flows": [FLOW]}, app.topo)
    app.table.commit(app.table.propose("keep", keep))
    server = Server(rest_api(app)).start()
    server.app = app
    yield server
    server.stop()


def sdn_state(server) -> tuple:
    table = server.app.table
    return dict(table.jobs), table.next_seq


NOT_SYNCED = "nothing was changed"  # the SDN app's 503 when a needed switch is not connected


# --- any method, any path, any body -------------------------------------------------------------
MASTER_PATHS = [
    "/health",
    "/agents",
    "/agents/lab1/heartbeat",
    "/nodes",
    "/nodes/lab1",
    "/links",
    "/links/acc1/agg1",
    "/scheduler",
    "/jobs",
    "/jobs/small",
    "/nosuch",
    "/",
    "//",
    "/jobs/small/extra",
    "/health?x=1&x=2",
]
AGENT_PATHS = ["/health", "/workers", "/workers/j-w0-a1", "/shaping", "/nosuch", "/"]
SDN_PATHS = [
    "/health",
    "/jobs",
    "/jobs/x/flows",
    "/links",
    "/switches",
    "/nosuch",
    "/jobs/keep",
    "/",
]  # not /jobs/keep/flows: DELETE would rightly remove the job other tests use


@FUZZ
@given(method=st.sampled_from(METHODS), path=st.sampled_from(MASTER_PATHS), body=raw_bodies)
@example(method="POST", path="/jobs", body=b"[" * 5000)  # was a 500 (RecursionError)
@example(method="PUT", path="/scheduler", body=b"1e999999")  # json gives inf
def test_master_any_method_path_and_body(master, method, path, body):
    before = master_state(master)
    check(send(master.url, method, path, body), lambda: master_state(master), before)


@FUZZ
@given(method=st.sampled_from(METHODS), path=st.sampled_from(AGENT_PATHS), body=raw_bodies)
@example(method="POST", path="/workers", body=b'{"a":' * 5000)
def test_agent_any_method_path_and_body(agent, method, path, body):
    before = agent.state()
    check(send(agent.url, method, path, body), agent.state, before)


@FUZZ
@given(method=st.sampled_from(METHODS), path=st.sampled_from(SDN_PATHS), body=raw_bodies)
@example(method="PUT", path="/jobs/x/flows", body=b"[" * 5000)
def test_sdn_any_method_path_and_body(sdn, method, path, body):
    before = sdn_state(sdn)
    check(send(sdn.url, method, path, body), lambda: sdn_state(sdn), before)


# --- names in the URL ---------------------------------------------------------------------------
url_names = bad_names.filter(bool)  # an empty name is another resource: /jobs/ is the list


@FUZZ
@given(
    name=url_names,
    route=st.sampled_from(
        [
            ("GET", "/jobs/{}"),
            ("DELETE", "/jobs/{}"),
            ("PUT", "/nodes/{}"),
            ("PUT", "/links/{}/agg1"),
            ("PUT", "/links/acc1/{}"),
            ("POST", "/agents/{}/heartbeat"),
        ]
    ),
)
@example(name="small\n", route=("GET", "/jobs/{}"))
def test_master_names_in_the_url(agents_master, name, route):
    method, pattern = route
    body = (
        {"schedulable": False, "bw_mbps": 1}
        if "heartbeat" not in pattern
        else {**HEARTBEAT, "node": name}
    )
    before = master_state(agents_master)
    answer = send_json(agents_master.url, method, pattern.format(quoted(name)), body)
    check(answer, lambda: master_state(agents_master), before)
    assert answer.status >= 400  # none of these names is a job, node or link


@FUZZ
@given(name=url_names, method=st.sampled_from(["GET", "PUT", "DELETE"]))
@example(name="keep\n", method="DELETE")  # was taken as job "keep\n" (`$` matches before \n)
@example(name="a" * 65, method="PUT")
def test_sdn_job_ids_in_the_url(sdn, name, method):
    before = sdn_state(sdn)
    answer = send_json(sdn.url, method, f"/jobs/{quoted(name)}/flows", {"flows": [FLOW]})
    check(answer, lambda: sdn_state(sdn), before, allowed_5xx=NOT_SYNCED)
    assert answer.status >= 400
    # sdn_app.flows.JOB_ID_RE, stated again ("/" makes another path: 404 no such resource)
    if "/" not in name and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        assert answer.status == 400 and answer.doc.get("field") == "job", answer.text


@FUZZ
@given(name=url_names)
def test_agent_worker_names_in_the_url(agent, name):
    before = agent.state()
    answer = send(agent.url, "DELETE", f"/workers/{quoted(name)}")
    check(answer, agent.state, before)
    assert agent.state() == before  # nothing by that name runs: nothing is removed


# --- bodies: one field wrong at a time ----------------------------------------------------------
@FUZZ
@given(
    m=st.one_of(
        mutated({"job": JOB}),
        mutated(JOB).map(lambda j: Mutation({"job": j.body}, j.field, j.kind)),
    )
)
@example(m=Mutation({"job": {**JOB, "name": "late\n"}}, "name", "value"))  # was accepted
@example(m=Mutation({"job": {**JOB, "model_params": 10**400}}, "model_params", "value"))  # 500
@example(m=Mutation({"job": {**JOB, "workers": 10**9}}, "workers", "value"))  # hung the Master
@example(m=Mutation({"job": {**JOB, "demand_mbps": math.inf}}, "demand_mbps", "value"))
@example(m=Mutation({"job": JOB, "algoritm": "k8s-spread"}, "algoritm", "unknown"))  # ignored
def test_master_post_job(master, m):
    before = master_state(master)
    answer = send_json(master.url, "POST", "/jobs", m.body)
    check(answer, lambda: master_state(master), before)
    if isinstance(m.body, dict) and isinstance(m.body.get("job"), dict):
        names_the_field(answer, m)
    if answer.status < 400:  # a job name is a URL segment and a container-name fragment
        name = answer.doc["name"]
        assert name.isascii() and name.isprintable() and "/" not in name and " " not in name


@FUZZ
@given(m=mutated({"algorithm": "first-fit", "seed": 1, "queue": "fifo-backfill"}))
@example(m=Mutation({"algorithm": "first-fit", "seed": -1}, "seed", "value"))
@example(m=Mutation({"algorithm": "k8s-spread", "sede": 4}, "sede", "unknown"))  # was ignored
@example(m=Mutation({"algorithm": "1", "seed": 1}, "algorithm", "value"))  # field unnamed
def test_master_put_scheduler(master, m):
    before = master_state(master)
    answer = send_json(master.url, "PUT", "/scheduler", m.body)
    check(answer, lambda: master_state(master), before)
    names_the_field(answer, m)


@FUZZ
@given(m=mutated({"schedulable": True}), node=st.sampled_from(["lab2", "nosuch", "acc1"]))
def test_master_put_node(master, m, node):
    before = master_state(master)
    answer = send_json(master.url, "PUT", f"/nodes/{node}", m.body)
    check(answer, lambda: master_state(master), before)
    if node == "lab2":
        names_the_field(answer, m)


@FUZZ
@given(m=mutated({"bw_mbps": 1000}))
@example(m=Mutation({"bw_mbps": 10**400}, "bw_mbps", "value"))
def test_master_put_link(master, m):
    before = master_state(master)
    answer = send_json(master.url, "PUT", "/links/agg1/core1", m.body)
    check(answer, lambda: master_state(master), before)
    names_the_field(answer, m)


@FUZZ
@given(m=mutated(REGISTRATION))
@example(m=Mutation({**REGISTRATION, "cpu": 10**400}, "cpu", "value"))  # was a 500 (Overflow)
@example(m=Mutation({**REGISTRATION, "url": "u"}, "url", "value"))  # broke the control loop
def test_master_post_agent(agents_master, m):
    before = master_state(agents_master)
    answer = send_json(agents_master.url, "POST", "/agents", m.body)
    check(answer, lambda: master_state(agents_master), before)
    names_the_field(answer, m)


@FUZZ
@given(
    m=st.one_of(
        mutated(HEARTBEAT),
        mutated(HEARTBEAT["records"][0]).map(
            lambda r: Mutation({**HEARTBEAT, "records": [r.body]}, "records", "record")
        ),
    )
)  # free-form
@example(m=Mutation({**HEARTBEAT, "records": [{"worker": [1]}]}, "records", "value"))  # 500
@example(m=Mutation({**HEARTBEAT, "sent_at": 10**400}, "sent_at", "value"))
def test_master_post_heartbeat(agents_master, m):
    before = master_state(agents_master)
    answer = send_json(agents_master.url, "POST", "/agents/lab1/heartbeat", m.body)
    check(answer, lambda: master_state(agents_master), before)
    names_the_field(answer, m)


@FUZZ
@given(m=mutated(WORKER), name=st.one_of(st.just(None), bad_names))
@example(m=Mutation(WORKER, "", "body"), name="../../etc/cron.d/x")  # a path in the workdir
@example(m=Mutation({**WORKER, "mem_mb": -1}, "mem_mb", "value"), name=None)
def test_agent_post_worker(agent, m, name):
    body = {**m.body, "name": name} if name is not None and isinstance(m.body, dict) else m.body
    before = agent.state()
    answer = send_json(agent.url, "POST", "/workers", body)
    check(answer, agent.state, before)
    if name is not None and answer.status < 400:  # only a container-name fragment is taken
        assert name[:1].isalnum() and name.isascii() and "/" not in name and name.isprintable()
    if body is m.body:
        names_the_field(answer, m)


@FUZZ
@given(
    m=st.one_of(
        mutated({"rules": [RULE]}),
        mutated(RULE).map(lambda r: Mutation({"rules": [r.body]}, "rules", r.kind)),
    )
)
@example(m=Mutation({"rules": [RULE, RULE]}, "rules", "value"))  # one class per destination
@example(m=Mutation({"rules": [{**RULE, "rate_mbps": 10**400}]}, "rules", "value"))
def test_agent_put_shaping(agent, m):
    before = agent.state()
    check(send_json(agent.url, "PUT", "/shaping", m.body), agent.state, before)


@FUZZ
@given(
    m=st.one_of(
        mutated({"flows": [FLOW]}),
        mutated(FLOW).map(lambda f: Mutation({"flows": [f.body]}, f.field, f.kind)),
    ),
    job=st.sampled_from(["keep", "other"]),
)
@example(
    m=Mutation({"flows": [{**FLOW, "rate_mbps": 10**400}]}, "rate_mbps", "value"), job="other"
)  # was a 500 (OverflowError)
@example(
    m=Mutation({"flows": [{**FLOW, "path": ["acc1", [1], "acc4"]}]}, "path", "value"), job="other"
)  # was a 500 (unhashable list)
@example(
    m=Mutation({"flows": [{**FLOW, "src": "lab2"}, FLOW]}, "flows", "value"), job="other"
)  # FLOW belongs to job "keep": 409
def test_sdn_put_flows(sdn, m, job):
    before = sdn_state(sdn)
    answer = send_json(sdn.url, "PUT", f"/jobs/{job}/flows", m.body)
    check(answer, lambda: sdn_state(sdn), before, allowed_5xx=NOT_SYNCED)
    names_the_field(answer, m)


# --- size and time limits of the shared server --------------------------------------------------
# A route of each server that reads a body.
BODY_ROUTES = {"master": "PUT /scheduler", "agent": "PUT /shaping", "sdn": "PUT /jobs/x/flows"}


def raw_exchange(request, which: str, head: str, body: bytes) -> bytes:
    """Send a hand-made request head and (part of) a body; what the server answers."""
    url = urllib.parse.urlsplit(request.getfixturevalue(which).url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(f"{BODY_ROUTES[which]} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body)
        return b"".join(iter(lambda: s.recv(65536), b""))  # the server closes


@pytest.mark.parametrize("which", sorted(BODY_ROUTES))
def test_a_body_over_the_limit_is_413_before_it_is_read(request, which):
    answer = raw_exchange(request, which, f"Content-Length: {MAX_BODY + 1}\r\n", b"{")
    assert answer.split(b"\r\n")[0].endswith(b"413 Payload Too Large"), answer[:200]
    assert b"larger than the limit" in answer


@pytest.mark.parametrize("which", sorted(BODY_ROUTES))
def test_a_body_that_stops_arriving_is_408(request, which, monkeypatch):
    """A client that announces a body and then falls silent is answered and dropped after the
    server's read timeout (30 s; 0.5 s here) rather than holding a thread forever."""
    monkeypatch.setattr(protocol_http._QuietHandler, "timeout", 0.5)
    t0 = time.monotonic()
    answer = raw_exchange(request, which, "Content-Length: 100\r\n", b'{"a"')
    assert answer.split(b"\r\n")[0].endswith(b"408 Request Timeout"), answer[:200]
    assert b"did not arrive in time" in answer and time.monotonic() - t0 < 5


def test_silent_connections_do_not_hold_up_other_callers(monkeypatch):
    """Connections are served by a bounded pool of threads: clients that connect and say
    nothing occupy some of them until the read timeout, the others are still answered at once;
    beyond the bound, callers wait their turn instead of getting a thread each."""
    monkeypatch.setattr(protocol_http._QuietHandler, "timeout", 3.0)
    monkeypatch.setattr(protocol_http._PooledServer, "max_threads", 4)
    app = protocol_http.JsonApp()
    app.route("GET", "/ping", lambda req: {"pong": True})
    server = Server(app).start()
    try:
        port = urllib.parse.urlsplit(server.url).port
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        t0 = time.monotonic()
        assert protocol_http.call("GET", server.url + "/ping") == {"pong": True}
        assert time.monotonic() - t0 < 1.0  # the fourth thread answers
        silent.append(socket.create_connection(("127.0.0.1", port)))  # all four threads taken
        t0 = time.monotonic()
        assert protocol_http.call("GET", server.url + "/ping", timeout=10) == {"pong": True}
        assert time.monotonic() - t0 > 1.0  # answered once a silent one timed out
        assert server.httpd._threads == 4
        for s in silent:
            s.close()
    finally:
        server.stop()
