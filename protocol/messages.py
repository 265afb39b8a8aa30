"""The Master <-> edge agent messages: dataclasses that travel as JSON.

Agent -> Master (the Messenger):
  POST /agents                      Registration        -> {"expected_workers": [names],
                                                            "lines": {name: metric lines held}}
  POST /agents/{node}/heartbeat     Heartbeat           -> {"stop": [names]}
Master -> agent (the command channel, the agent's own HTTP server):
  POST   /workers                   WorkerSpec          -> WorkerState
  DELETE /workers/{name}                                -> {"removed": bool}
  GET    /workers                                       -> [WorkerState]
  PUT    /shaping                   {"rules": [ShapingRule]}  (the complete desired set)
  GET    /health

Nothing here is emulation-specific: an agent drives its local Docker engine and its local `tc`,
whether its node is an emulated container or a real host. `from_json` checks every field's type
against the dataclass, so a malformed message is one clear `ValueError` naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
import typing
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")
_FLOAT_MAX = sys.float_info.max  # a JSON integer beyond it cannot become a float


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


def to_json(obj: Any) -> Any:
    return asdict(obj)


def from_json(cls: type[T], data: Any) -> T:
    """Build dataclass `cls` from a JSON mapping, every field checked against its type; a
    `ValueError` naming the message and the field otherwise."""
    return _build(cls, data, cls.__name__)


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {_kind(data)}")
    hints, known = _fields(cls)
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
    missing = [
        n
        for n, f in known.items()
        if n not in data
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    return cls(**{k: _check(v, hints[k], f"{where}.{k}") for k, v in data.items()})


@functools.cache
def _fields(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """A message class's field types and fields (resolving the types is what costs: once)."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def _check(value: Any, tp: Any, where: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a message class, not an instance
        return _build(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check(value, inner[0], where) if len(inner) == 1 else value
    if origin is list or tp is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {_kind(value)}")
        return [_check(v, args[0], f"{where}[{i}]") for i, v in enumerate(value)] if args else value
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {_kind(value)}")
        if args:
            return {
                _check(k, args[0], f"{where} key"): _check(v, args[1], f"{where}.{k}")
                for k, v in value.items()
            }
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {_kind(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {_kind(value)}")
        return value
    if tp is float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not -_FLOAT_MAX < value < _FLOAT_MAX
        ):  # also refuses nan and ±inf
            raise ValueError(f"{where}: expected a finite number, got {_kind(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {_kind(value)}")
        return value
    raise TypeError(f"{where}: no check for type {tp!r}")  # a message class this cannot read


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:37] + '...' if len(text) > 40 else text}"
