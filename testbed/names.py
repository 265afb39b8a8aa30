"""Run prefixes and the short names the testbed gives to what it creates.

Everything a run creates (containers, OVS bridges, veths, cgroups, Mininet shells) is named
`<prefix>...`, where the prefix is `ces` + 4 hex digits: a fixed length, so an anchored match on
one prefix never catches another run's names, and `ces[0-9a-f]{4}` matches every run of the project
(and not the images `ces-worker`/`ces-base`). Linux interface names have at most 15 characters, so
topology names are mapped to short names and the mapping is kept.

`Lifecycle`: what `start()` builds under a prefix and `stop()` removes by it, also after a start
that failed part-way.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Self

PREFIX_RE = re.compile(r"^ces[0-9a-f]{4}$")
FAMILY_RE = re.compile(r"^ces[0-9a-f]{4}")  # any run's resource
IFNAMSIZ = 15


def new_prefix() -> str:
    return "ces" + secrets.token_hex(2)


def check_prefix(prefix: str) -> str:
    if not PREFIX_RE.match(prefix):
        raise ValueError(
            f"run prefix {prefix!r}: expected 'ces' followed by 4 hex digits, e.g. 'ces1a2b'"
        )
    return prefix


@dataclass
class Names:
    """Short, prefixed names for one run; the mappings are kept for lookups in both directions."""

    prefix: str
    bridges: dict[str, str] = field(default_factory=dict)  # switch → bridge
    interfaces: dict[tuple[str, int], str] = field(default_factory=dict)  # (switch, port) → ifname

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    def bridge(self, switch: str) -> str:
        if switch not in self.bridges:
            self.bridges[switch] = f"{self.prefix}s{len(self.bridges)}"
        return self.bridges[switch]

    def interface(self, switch: str, port: int) -> str:
        """The switch-side interface of OpenFlow port `port` of `switch`."""
        key = (switch, port)
        if key not in self.interfaces:
            name = f"{self.bridge(switch)}p{port}"
            if len(name) > IFNAMSIZ:  # huge topologies: fall back to a counter
                name = f"{self.prefix}x{len(self.interfaces):x}"
            self.interfaces[key] = name
        return self.interfaces[key]

    def container(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def worker(self, node: str, worker: str) -> str:
        return f"{self.prefix}-{node}-{worker}"

    def cgroup_parent(self, node: str) -> str:
        return f"{self.prefix}-{node}"


class Lifecycle:
    """A context manager of what `start()` builds and `stop()` removes: `stop()` also when
    `start()` fails part-way (an exception, Ctrl-C), so it must be safe at any point of a
    start: it removes what is named, made or not."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
