"""Typed client of the SDN app's REST API (`protocol.http`), for the Network Controller.

from sdn_app.client import FlowRequest, SdnClient
sdn = SdnClient("http://127.0.0.1:8080")
sdn.wait_ready()
sdn.put_job_flows("job7", [FlowRequest("lab1", "srv1", ["acc1", "agg1", "acc4"], 20)])
sdn.links()            # [LinkUsage(src='acc1', dst='agg1', mbps=19.2, ...), ...]
sdn.delete_job_flows("job7")
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from protocol.http import ApiError, Unreachable, call
from protocol.tls import Tls


class SdnError(RuntimeError):
    """The app refused a request (`status` 4xx/5xx; nothing was changed) or could not be reached
    (`status` 0)."""

    def __init__(self, status: int, message: str, field: str = ""):
        super().__init__(f"{status}: {field + ': ' if field else ''}{message}")
        self.status = status
        self.message = message
        self.field = field


@dataclass(frozen=True)
class FlowRequest:
    """One scheduled flow: src → dst (node names or IPs) along `path` (switch names or dpids,
    from the src's switch to the dst's), policed at `rate_mbps`; optionally only one TCP
    connection's packets (`tcp_src`/`tcp_dst`), and with `symmetric` the packets answering it
    back along the same switches (unmetered)."""

    src: str
    dst: str
    path: Sequence[str | int]
    rate_mbps: float
    tcp_src: int | None = None
    tcp_dst: int | None = None
    name: str = ""
    symmetric: bool = False  # dst → src (its acknowledgements) back along the same switches

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "src": self.src,
            "dst": self.dst,
            "path": list(self.path),
            "rate_mbps": self.rate_mbps,
        }
        for key in ("tcp_src", "tcp_dst", "name", "symmetric"):
            if getattr(self, key):
                doc[key] = getattr(self, key)
        return doc


@dataclass(frozen=True)
class LinkUsage:
    """One direction of a link, as the switches' port counters measured it."""

    src: str
    dst: str
    capacity_mbps: float
    mbps: float | None  # None until two samples have been taken
    utilisation: float | None
    up: bool = True  # False while a port of the link reports no link


class SdnClient:
    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        timeout_s: float = 10.0,
        token: str | None = None,
        tls: Tls | None = None,
    ):
        """`tls`: the caller's identity, for an https URL (the control machine's)."""
        self.url = url.rstrip("/")
        self.timeout_s, self.token, self.tls = timeout_s, token, tls

    def put_job_flows(
        self, job_id: str, flows: Iterable[FlowRequest | dict[str, Any]]
    ) -> dict[str, Any]:
        """Install or replace all flows of a job (atomically); returns the job's flows and
        `install_ms`, measured by the app from the first message to the last barrier reply."""
        body = {"flows": [f.to_json() if isinstance(f, FlowRequest) else f for f in flows]}
        return self._call("PUT", f"/jobs/{_quote(job_id)}/flows", body)

    def delete_job_flows(self, job_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/jobs/{_quote(job_id)}/flows")

    def jobs(self) -> list[dict[str, Any]]:
        return self._call("GET", "/jobs")["jobs"]

    def job_flows(self, job_id: str) -> list[dict[str, Any]]:
        """The job's flows with their meter and per-hop counters."""
        return self._call("GET", f"/jobs/{_quote(job_id)}/flows")["flows"]

    def links(self) -> list[LinkUsage]:
        return [
            LinkUsage(x["src"], x["dst"], x["capacity_mbps"], x["mbps"], x["utilisation"], x["up"])
            for x in self._call("GET", "/links")["links"]
        ]

    def switches(self) -> dict[str, Any]:
        return self._call("GET", "/switches")

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def wait_ready(self, timeout_s: float = 30.0, poll_s: float = 0.1) -> dict[str, Any]:
        """Wait until the app answers and every switch of the topology is connected and
        synchronised; raise `SdnError` (status 0) with the last health seen on timeout."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.health()
                if last["ready"]:
                    return last
            except SdnError as e:
                last = e.message
            time.sleep(poll_s)
        raise SdnError(0, f"not ready after {timeout_s:g} s (last: {last})")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            return call(
                method,
                self.url + path,
                body,
                timeout=self.timeout_s,
                token=self.token,
                tls=self.tls,
            )
        except ApiError as e:
            raise SdnError(e.status, e.message, e.field) from None
        except Unreachable as e:
            raise SdnError(0, f"cannot reach the SDN app at {self.url}: {e}") from None


def _quote(job_id: str) -> str:
    return urllib.parse.quote(job_id, safe="")
