"""The Messenger: the agent's side of the Master <-> agent protocol (`protocol.messages`).

It registers with the Master, sends a heartbeat every `heartbeat_s` ± `JITTER` (usage, the state
of every worker, new metric lines) and at once when a worker ends, and serves the Master's commands on
the agent's HTTP server. A Master that answers 409 to a heartbeat has forgotten the agent (it
restarted): the Messenger registers again. Once its node is gone (`gone` says why) it stops
heartbeating and returns when the Master has taken the node offline (then the agent stops the
node's workers: stopped earlier, a peer of theirs would fail first and its job could be placed on
the node again before the Master knew).
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sized
from typing import Protocol

import docker.errors

from protocol.dilation import NONE, Dilation
from protocol.http import ApiError, JsonApp, Unreachable, call
from protocol.messages import (
    Heartbeat,
    Registration,
    ShapingRule,
    Usage,
    WorkerSpec,
    WorkerState,
    from_json,
    to_json,
)
from protocol.tls import Tls

from .network import ShapingError

log = logging.getLogger(__name__)
# A worker's name becomes part of its container's name and of its metric file's name.
WORKER_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


class Compute(Protocol):
    """What the Messenger asks of the Compute Manager: `compute.ComputeManager`, or the simulated
    agent's `simulated.SimulatedCompute`."""

    on_change: Callable[[], None]  # set by the Messenger: a worker ended, heartbeat at once

    @property
    def workers(self) -> Sized: ...  # counted by GET /health

    def start(self, spec: WorkerSpec) -> WorkerState: ...

    def stop(self, name: str) -> bool: ...

    def states(self) -> list[WorkerState]: ...

    def take_records(self) -> list[dict]: ...

    def reconcile(
        self,
        expected: list[str],
        held: dict[str, int] | None = None,
        judged: set[str] | None = None,
    ) -> None: ...


class Network(Protocol):
    """What it asks of the Network Manager: `network.NetworkManager`, or `SimulatedNetwork`."""

    def apply(self, rules: list[ShapingRule]) -> dict: ...


class Meter(Protocol):
    """What it asks of the usage meter: `network.UsageMeter`, or an idle node's."""

    def sample(self) -> Usage: ...


# Each wait between heartbeats is drawn in heartbeat_s × [1 - JITTER, 1 + JITTER]: agents started
# together (a lab's `start`, hosts back from a power cut) would otherwise heartbeat in step, a
# burst at the Master every period. 200 simulated agents (experiments/bench_load.py, seed 0):
# reply p50 17-27 ms in step, 7-17 ms jittered, in runs side by side; p99 under load the same
# within the runs' noise, with few jobs 46 -> 24 ms.
JITTER = 0.1


class Messenger:
    """Registration, heartbeats and the command channel."""

    def __init__(
        self,
        reg: Registration,
        master: str,
        compute: Compute,
        network: Network,
        usage: Meter,
        heartbeat_s: float = 2.0,
        token: str | None = None,
        gone: Callable[[], str] = lambda: "",
        clock: Dilation = NONE,
        tls: Tls | None = None,
    ):
        self.reg, self.master, self._token = reg, master.rstrip("/"), token
        self._tls = tls  # the agent's identity, shown to the Master (https)
        self.gone = gone
        self.compute, self.network, self.usage = compute, network, usage
        self.heartbeat_s = heartbeat_s  # emulated seconds (`clock`: protocol.dilation)
        self.clock = clock
        self.wake = threading.Event()  # a worker ended: heartbeat at once
        compute.on_change = self.wake.set
        self.stopping = threading.Event()
        self.seq = 0
        self.registered = False
        self._unsent: list[dict] = []
        self.round_trips: deque[float] = deque(maxlen=1000)  # heartbeat replies, seconds

    @property
    def node(self) -> str:
        return self.reg.node

    def routes(self, app: JsonApp) -> None:
        app.route(
            "GET",
            "/health",
            lambda req: {
                "node": self.node,
                "ok": True,
                "registered": self.registered,
                "workers": len(self.compute.workers),
                "heartbeat_ms": {
                    "last": _ms(self.round_trips[-1] if self.round_trips else None),
                    "max": _ms(max(self.round_trips, default=None)),
                },
            },
        )
        app.route("GET", "/workers", lambda req: [to_json(w) for w in self.compute.states()])
        app.route("POST", "/workers", self._start)
        app.route(
            "DELETE",
            "/workers/(?P<name>[^/]+)",
            lambda req, name: {"removed": self.compute.stop(name)},
        )
        app.route("PUT", "/shaping", self._shape)

    def _start(self, req) -> tuple[int, dict]:
        try:
            spec = from_json(WorkerSpec, req.json())
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        if not WORKER_NAME_RE.fullmatch(spec.name):
            raise ApiError(
                400,
                f"WorkerSpec.name: expected 1-128 letters, digits, '_', '.' or "
                f"'-', starting with a letter or digit; got {spec.name!r}",
                "name",
            )
        if not spec.cpu > 0:
            raise ApiError(400, f"WorkerSpec.cpu: expected cores > 0, got {spec.cpu:g}", "cpu")
        if not spec.mem_mb >= 6:  # Docker's least memory limit
            raise ApiError(
                400, f"WorkerSpec.mem_mb: expected at least 6, got {spec.mem_mb:g}", "mem_mb"
            )
        try:
            return 201, to_json(self.compute.start(spec))
        except docker.errors.ImageNotFound as e:
            raise ApiError(
                400, f"image {spec.image!r} not on {self.node}: {e.explanation}"
            ) from None
        except docker.errors.APIError as e:
            status = 409 if e.status_code == 409 else 500
            raise ApiError(status, f"docker refused {spec.name}: {e.explanation or e}") from None

    def _shape(self, req) -> dict:
        body = req.json()
        try:
            if not isinstance(body, dict) or not isinstance(body.get("rules"), list):
                raise ValueError('expected {"rules": [{"dst_ip": ..., "rate_mbps": ...}]}')
            rules = [from_json(ShapingRule, r) for r in body["rules"]]
            return self.network.apply(rules)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        except ShapingError as e:
            raise ApiError(500, f"tc on {self.node}: {e}") from None

    # --- talking to the Master ------------------------------------------------------------------
    def register(self) -> None:
        known = {w.name for w in self.compute.states()}
        reply = call(
            "POST",
            f"{self.master}/agents",
            to_json(self.reg),
            timeout=10,
            token=self._token,
            tls=self._tls,
        )
        # A worker the Master started while its reply was on the way is not in the reply, yet
        # wanted: only those this agent held before it asked are judged by the reply.
        self.compute.reconcile(reply.get("expected_workers", []), reply.get("lines", {}), known)
        self.registered = True
        log.info("registered with %s as %s", self.master, self.node)

    def heartbeat(self) -> None:
        states = self.compute.states()  # before the records: an exit comes with its last lines
        self._unsent += self.compute.take_records()
        self.seq += 1
        hb = Heartbeat(
            self.node, self.seq, self.clock.time(), self.usage.sample(), states, self._unsent
        )
        t0 = time.perf_counter()
        reply = call(
            "POST",
            f"{self.master}/agents/{self.node}/heartbeat",
            to_json(hb),
            timeout=5,
            token=self._token,
            tls=self._tls,
        )
        self.round_trips.append(time.perf_counter() - t0)
        self._unsent = []
        for name in reply.get("stop", []):
            log.info("the Master no longer wants %s: stopping it", name)
            self.compute.stop(name)

    def run(self) -> None:
        silent_since = None
        while not self.stopping.is_set():
            why = self.gone()
            if why:
                log.error("%s: the node is gone; leaving once the Master has taken it offline", why)
                self._wait_offline()
                return
            try:
                if not self.registered:
                    self.register()
                self.heartbeat()
                silent_since = None
            except ApiError as e:
                if e.status == 409:  # the Master restarted and forgot us
                    self.registered = False
                else:
                    log.warning("master answered %s: %s", e.status, e.message)
            except Unreachable as e:
                if silent_since is None:
                    log.warning("master unreachable (%s); retrying", e)
                    silent_since = self.clock.time()
            except Exception:  # e.g. the Docker engine refused a stop: keep heartbeating
                if not self.gone():  # else said once, above
                    log.exception("heartbeat round failed")
            self.wake.wait(timeout=self.clock.host_seconds(self.next_wait_s()))
            self.wake.clear()

    def next_wait_s(self) -> float:
        """The wait before the next heartbeat (unless a worker ends first): `heartbeat_s` ±
        `JITTER`, drawn anew each time."""
        return self.heartbeat_s * random.uniform(1 - JITTER, 1 + JITTER)

    def _wait_offline(self, timeout_s: float = 60.0) -> None:
        """Until the Master no longer counts this node online (or does not answer)."""
        deadline = self.clock.monotonic() + timeout_s
        while not self.stopping.is_set() and self.clock.monotonic() < deadline:
            try:
                nodes = call(
                    "GET", f"{self.master}/nodes", timeout=5, token=self._token, tls=self._tls
                )
            except (ApiError, Unreachable):
                return
            if not any(n.get("node") == self.node and n.get("online") for n in nodes):
                return
            self.stopping.wait(self.clock.host_seconds(self.heartbeat_s / 2))

    def leave(self) -> None:
        """Stop the loop (signal handlers call this): `run` returns at once."""
        self.stopping.set()
        self.wake.set()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)
