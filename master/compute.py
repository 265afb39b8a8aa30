"""The Compute Controller: the edge agents, their heartbeats, and the workers they run.

It keeps per-node usage fresh from heartbeats, notices nodes that stop heartbeating and workers
that end, and starts/stops workers through each agent's command channel. A worker that cannot be
stopped now (its agent does not answer) is stopped when the agent answers again: every heartbeat
reply names the agent's workers the Master no longer wants.
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from protocol.http import ApiError, Unreachable, call
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
from protocol.worker import METRICS_OUT, option_flags
from scheduler.jobs import WORKLOAD_COLLECTIVE, worker_flows
from scheduler.model import Job


class AgentError(RuntimeError):
    """An agent refused or did not answer a command."""


class NotRegistered(LookupError):
    """A heartbeat from a node the Master does not know (it restarted): register again."""


class AgentClient:
    """The Master's side of one agent's command channel."""

    def __init__(
        self, url: str, timeout_s: float = 60.0, token: str | None = None, tls: Tls | None = None
    ):
        self.url, self.timeout_s, self.token, self.tls = url.rstrip("/"), timeout_s, token, tls

    def _call(self, method: str, path: str, body: object = None, timeout_s: float | None = None):
        try:
            return call(
                method,
                self.url + path,
                body,
                timeout=timeout_s or self.timeout_s,
                token=self.token,
                tls=self.tls,
            )
        except (ApiError, Unreachable) as e:
            raise AgentError(f"agent {self.url}: {e}") from None

    def start(self, spec: WorkerSpec) -> WorkerState:
        return from_json(WorkerState, self._call("POST", "/workers", to_json(spec)))

    def stop(self, name: str) -> None:
        self._call("DELETE", f"/workers/{name}", timeout_s=30)

    def shape(self, rules: list[ShapingRule]) -> None:
        self._call("PUT", "/shaping", {"rules": [to_json(r) for r in rules]}, timeout_s=15)


@dataclass
class Agent:
    reg: Registration
    last_seen: float
    seq: int = -1
    usage: Usage = field(default_factory=Usage)
    workers: dict[str, WorkerState] = field(default_factory=dict)
    online: bool = True


class ComputeController:
    def __init__(
        self,
        heartbeat_timeout_s: float = 6.0,
        missing_grace_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        token: str | None = None,
        tls: Tls | None = None,
    ):
        self._token = token  # the agents' command channels require it
        self._tls = tls  # and, over https, the control machine's certificate
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.missing_grace_s = missing_grace_s  # a just-started worker may miss one heartbeat
        self.clock = clock
        self.agents: dict[str, Agent] = {}
        self.started: dict[str, float] = {}  # worker -> when its start was acknowledged

    def client(self, node: str) -> AgentClient:
        return AgentClient(self.agents[node].reg.url, token=self._token, tls=self._tls)

    # --- the Messenger's side ------------------------------------------------------------------
    def register(self, reg: Registration) -> bool:
        """Record an agent (new, restarted or back). True when the node was not online before."""
        old = self.agents.get(reg.node)
        self.agents[reg.node] = Agent(reg, self.clock(), workers=old.workers if old else {})
        return old is None or not old.online

    def heartbeat(self, hb: Heartbeat, expected: set[str]) -> tuple[bool, list[WorkerState]]:
        """Take a heartbeat. Returns (the node came back, workers of `expected` that ended:
        exited, or unknown to the agent past the start grace)."""
        agent = self.agents[hb.node]
        came_back = not agent.online
        agent.last_seen, agent.online, agent.seq = self.clock(), True, hb.seq
        agent.usage = hb.usage
        before = agent.workers
        agent.workers = {w.name: w for w in hb.workers}
        ended = [
            w
            for w in hb.workers
            if w.name in expected
            and w.state != "running"
            and (before.get(w.name) is None or before[w.name].state == "running")
        ]
        now = self.clock()
        for name in sorted(expected - set(agent.workers)):
            if now - self.started.get(name, now) > self.missing_grace_s:
                ended.append(
                    WorkerState(
                        name, "", "", "missing", None, f"the agent on {hb.node} no longer runs it"
                    )
                )
                self.started.pop(name, None)
        return came_back, ended

    def stale(self) -> list[tuple[str, float]]:
        """Online nodes whose last heartbeat is older than the timeout: (node, seconds silent)."""
        now = self.clock()
        return [
            (n, now - a.last_seen)
            for n, a in sorted(self.agents.items())
            if a.online and now - a.last_seen > self.heartbeat_timeout_s
        ]

    def mark_offline(self, node: str) -> None:
        self.agents[node].online = False

    def online(self) -> set[str]:
        return {n for n, a in self.agents.items() if a.online}

    def unwanted(self, node: str, expected: set[str]) -> list[str]:
        """Workers the node reports that the Master no longer wants (stop them now)."""
        agent = self.agents.get(node)
        return sorted(set(agent.workers) - expected) if agent else []

    # --- commands -------------------------------------------------------------------------------
    def start_worker(self, node: str, spec: WorkerSpec) -> WorkerState:
        self.started[spec.name] = math.inf  # being started: never "missing" meanwhile
        state = self.client(node).start(spec)
        self.started[spec.name] = self.clock()
        return state

    def stop_worker(self, node: str, name: str) -> bool:
        """Best effort: True when stopped now, False when it waits for the agent to answer
        (its next heartbeat reply names the worker)."""
        self.started.pop(name, None)
        agent = self.agents.get(node)
        if agent is None or not agent.online:  # a silent agent would only time out
            return False
        try:
            self.client(node).stop(name)
            return True
        except AgentError:
            return False

    def node_view(self, node: str) -> dict:
        a = self.agents.get(node)
        if a is None:
            return {"registered": False, "online": False}
        return {
            "registered": True,
            "online": a.online,
            "url": a.reg.url,
            "ip": a.reg.ip,
            "last_seen_s": round(self.clock() - a.last_seen, 2),
            "usage": to_json(a.usage),
            "workers": sorted(a.workers),
        }


def worker_command(
    job: Job, rank: int, master_addr: str, master_port: int, iface: str, seed: int
) -> list[str]:
    """The command of one task's worker.

    A job's `command` with placeholders ({rank} {world_size} {master_addr} {master_port} {iface}
    {seed} {out}) is a complete template. Otherwise `command` is the program (default
    `python3 -m workloads.train`) and gets the rendezvous options plus the job's `workload:`
    mapping as options (key `max_iters` -> `--max-iters VALUE`, a true boolean as a bare flag, a
    list as several values), completed from the job's `target_accuracy`, `iterations` and
    collective, and for a custom job its flows (`scheduler.jobs.worker_flows`).
    """
    fill = dict(
        rank=rank,
        world_size=len(job.tasks),
        master_addr=master_addr,
        master_port=master_port,
        iface=iface,
        seed=seed,
        out=METRICS_OUT,
    )
    if "{" in job.command:
        try:
            return shlex.split(job.command.format(**fill))
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(
                f"job '{job.name}': field 'command': bad template ({e}); "
                f"placeholders: {', '.join('{' + k + '}' for k in fill)}"
            ) from None
    options: dict[str, object] = {"collective": WORKLOAD_COLLECTIVE[job.collective]}
    if job.collective == "custom":
        options["flows"] = worker_flows(job)
    if job.target_accuracy is not None:
        options["target_acc"] = job.target_accuracy
    if job.iterations is not None:
        options["max_iters"] = job.iterations
    options.update(job.workload)
    program = shlex.split(job.command) if job.command else ["python3", "-m", "workloads.train"]
    return [
        *program,
        *option_flags(
            {
                "rank": rank,
                "world_size": len(job.tasks),
                "master_addr": master_addr,
                "master_port": master_port,
                "iface": iface,
                "seed": seed,
                "out": METRICS_OUT,
            }
        ),
        *option_flags(options),
    ]


def worker_image(job_image: str, default: str) -> str:
    """The image a job's workers run: the Master's worker image when the job names none or names
    its repository without a tag (job files say `ces-worker`; the built tag is a content hash),
    else exactly what the job names."""
    if not job_image or (
        ":" not in job_image.rsplit("/", 1)[-1] and default.rsplit(":", 1)[0] == job_image
    ):
        return default
    return job_image
