"""A simulated edge agent: the real Messenger (registration, heartbeats, the command channel over
HTTP) in front of a node that runs no containers and shapes nothing.

For what needs many agents or exact control of what workers do, with a real Master: the Master's
control-loop tests (a worker that exits, an agent that falls silent) and its load benchmark
(hundreds of agents heartbeating). `finish(worker, code)` ends a worker as if its process had
exited; `stop()` silences the agent as a killed one would be.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.http import JsonApp, Server
from protocol.messages import Registration, ShapingRule, Usage, WorkerSpec, WorkerState
from protocol.tls import Tls, control_only

from .messenger import Messenger


@dataclass
class SimulatedCompute:
    """The Compute Manager's interface over workers that only exist as records."""

    workers: dict[str, WorkerState] = field(default_factory=dict)
    specs: dict[str, WorkerSpec] = field(default_factory=dict)  # every worker ever started
    records: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        # Set by the Messenger: wake it up. Not a field: mypy reads a callable field as a
        # method, which the Messenger's `Compute` protocol could not set.
        self.on_change: Callable[[], None] = lambda: None

    def start(self, spec: WorkerSpec) -> WorkerState:
        with self.lock:
            if spec.name not in self.workers:
                self.specs[spec.name] = spec
                self.workers[spec.name] = WorkerState(spec.name, spec.job, spec.task, "running")
            return self.workers[spec.name]

    def stop(self, name: str) -> bool:
        with self.lock:
            return self.workers.pop(name, None) is not None

    def states(self) -> list[WorkerState]:
        with self.lock:
            return list(self.workers.values())

    def take_records(self) -> list[dict]:
        with self.lock:
            out, self.records = self.records, []
        return out

    def log(self, name: str, line: dict) -> None:
        """The worker writes a metric line (sent with the next heartbeat)."""
        with self.lock:
            self.records.append({**line, "worker": name})

    def reconcile(
        self,
        expected: list[str],
        held: dict[str, int] | None = None,
        judged: set[str] | None = None,
    ) -> None:
        with self.lock:
            for name in [n for n in self.workers if n not in expected]:
                if judged is None or name in judged:
                    del self.workers[name]

    def finish(
        self, name: str, exit_code: int = 0, detail: str = "", lines: list[dict] | None = None
    ) -> None:
        """The worker's process ends (with its last metric lines)."""
        with self.lock:
            w = self.workers[name]
            self.records += [{**line, "worker": name} for line in lines or []]
            self.workers[name] = WorkerState(name, w.job, w.task, "exited", exit_code, detail)
        self.on_change()


@dataclass
class SimulatedNetwork:
    """The Network Manager's interface: keeps the rules it was given."""

    rules: list[ShapingRule] = field(default_factory=list)
    updates: int = 0

    def apply(self, rules: list[ShapingRule]) -> dict:
        self.rules, self.updates = list(rules), self.updates + 1
        return {"classes": len(rules)}


class _IdleUsage:
    def sample(self) -> Usage:
        return Usage()


class SimulatedAgent:
    def __init__(
        self,
        node: str,
        master: str,
        ip: str,
        cpu: float = 1.0,
        mem_mb: float = 2048.0,
        heartbeat_s: float = 1.0,
        token: str | None = None,
        tls: Tls | None = None,
    ):
        """`tls`: the agent's identity (its command channel over mutual TLS, the control
        machine's certificate required, as the real agent's)."""
        self.compute, self.network = SimulatedCompute(), SimulatedNetwork()
        app = JsonApp(token=token, peers=control_only)
        self.server = Server(app, tls=tls)
        reg = Registration(node, self.server.url, ip, "eth0", cpu, mem_mb)
        self.messenger = Messenger(
            reg, master, self.compute, self.network, _IdleUsage(), heartbeat_s, token, tls=tls
        )
        self.messenger.routes(app)
        self._thread: threading.Thread | None = None

    @property
    def node(self) -> str:
        return self.messenger.node

    def start(self) -> SimulatedAgent:
        self.server.start()
        self._thread = threading.Thread(
            target=self.messenger.run, name=f"agent-{self.node}", daemon=True
        )
        self._thread.start()
        return self

    def finish(self, worker: str, exit_code: int = 0, detail: str = "") -> None:
        self.compute.finish(worker, exit_code, detail)

    def stop(self) -> None:
        """Silence: no more heartbeats, no command server (as a killed agent)."""
        self.messenger.leave()
        if self._thread:
            self._thread.join(timeout=10)
        self.server.stop()
