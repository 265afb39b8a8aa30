"""The Master <-> edge agent protocol: the messages, as dataclasses that travel as JSON.

Agent -> Master (the Messenger):
  POST /agents                      Registration        -> {"expected_workers": [names]}
  POST /agents/{node}/heartbeat     Heartbeat           -> {"stop": [names]}
Master -> agent (the command channel, the agent's own HTTP server):
  POST   /workers                   WorkerSpec          -> WorkerState
  DELETE /workers/{name}                                -> {"removed": bool}
  GET    /workers                                       -> [WorkerState]
  PUT    /shaping                   {"rules": [ShapingRule]}  (the complete desired set)
  GET    /health

Nothing here is emulation-specific: an agent drives its local Docker engine and its local `tc`,
whether its node is an emulated container or a real host.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Registration:
    node: str  # the topology's compute node name
    url: str  # where the agent's command server listens
    ip: str  # the node's data-network address (workers' rendezvous address)
    iface: str  # the data interface the workers bind to (GLOO_SOCKET_IFNAME)
    cpu: float  # the node's capacity as the agent sees it
    mem_mb: float


@dataclass
class Usage:
    cpu_cores: float = 0.0  # cores busy, averaged since the previous heartbeat
    mem_mb: float = 0.0
    tx_mbps: float = 0.0  # the data interface, since the previous heartbeat
    rx_mbps: float = 0.0


@dataclass
class WorkerSpec:
    name: str  # unique within the run, chosen by the Master: <job>-<task>-a<attempt>
    job: str
    task: str
    image: str
    command: list[str]
    cpu: float
    mem_mb: float
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class WorkerState:
    name: str
    job: str
    task: str
    state: str  # running | exited | missing
    exit_code: int | None = None
    detail: str = ""  # why it stopped, when known (OOM killed, error text)


@dataclass
class Heartbeat:
    node: str
    seq: int
    sent_at: float  # agent's clock (informational: the Master uses its own arrival time)
    usage: Usage
    workers: list[WorkerState]
    records: list[dict] = field(default_factory=list)  # new metric lines, each with "worker"


@dataclass
class ShapingRule:
    dst_ip: str
    rate_mbps: float


_NESTED: dict[type, dict[str, type]] = {Heartbeat: {"usage": Usage, "workers": WorkerState}}


def to_json(obj: Any) -> Any:
    return asdict(obj)


def from_json(cls: type[T], data: Any) -> T:
    """Build dataclass `cls` from a JSON mapping; a clear ValueError on a malformed message."""
    if not isinstance(data, dict):
        raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {f.name for f in fields(cls)})  # type: ignore[arg-type]
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {', '.join(unknown)}")
    kwargs = dict(data)
    for name, sub in _NESTED.get(cls, {}).items():
        if name in kwargs:
            value = kwargs[name]
            kwargs[name] = ([from_json(sub, v) for v in value] if isinstance(value, list)
                            else from_json(sub, value))
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{cls.__name__}: {e}") from None
