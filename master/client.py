"""A typed client of the Master's API (used by the CLI and experiments/run.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from protocol.http import call
from protocol.tls import Tls
from scheduler.jobs import load_job_documents

DEFAULT_URL = os.environ.get("CES_MASTER", "http://127.0.0.1:7070")


class MasterClient:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        timeout_s: float = 30.0,
        token: str | None = None,
        tls: Tls | None = None,
    ):
        """`tls`: the caller's identity, for an https URL (the control machine's)."""
        self.url, self.timeout_s, self.token, self.tls = url.rstrip("/"), timeout_s, token, tls

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        return call(
            method, self.url + path, body, timeout=self.timeout_s, token=self.token, tls=self.tls
        )

    def health(self) -> dict:
        return self._call("GET", "/health")

    def wait_ready(self, nodes: int, timeout_s: float = 60.0) -> dict:
        """Poll until at least `nodes` agents are online; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                h = self.health()
                if h["nodes_online"] >= nodes:
                    return h
            except (ConnectionError, OSError):
                h = None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the Master at {self.url} has "
                    f"{h['nodes_online'] if h else 'no answer and no'} online "
                    f"agents after {timeout_s:.0f} s (wanted {nodes})"
                )
            time.sleep(0.2)

    def submit(self, job: dict, algorithm: str | None = None, source: str = "") -> dict:
        body: dict[str, Any] = {"job": job, "source": source}
        if algorithm:
            body["algorithm"] = algorithm
        return self._call("POST", "/jobs", body)

    def submit_file(self, path: str | Path, algorithm: str | None = None) -> list[dict]:
        """Every job of a file or folder (checked before any is sent: `JobError`)."""
        return [self.submit(d.mapping, algorithm, d.source) for d in load_job_documents(path)]

    def jobs(self) -> list[dict]:
        return self._call("GET", "/jobs")

    def job(self, name: str, records: bool = False) -> dict:
        return self._call("GET", f"/jobs/{name}" + ("?records=1" if records else ""))

    def cancel(self, name: str) -> dict:
        return self._call("DELETE", f"/jobs/{name}")

    def nodes(self) -> list[dict]:
        return self._call("GET", "/nodes")

    def set_schedulable(self, node: str, schedulable: bool) -> dict:
        return self._call("PUT", f"/nodes/{node}", {"schedulable": schedulable})

    def links(self) -> list[dict]:
        return self._call("GET", "/links")

    def set_link_capacity(self, u: str, v: str, bw_mbps: float) -> dict:
        return self._call("PUT", f"/links/{u}/{v}", {"bw_mbps": bw_mbps})

    def set_scheduler(self, algorithm: str, seed: int = 0, queue: str = "fifo-backfill") -> dict:
        return self._call(
            "PUT", "/scheduler", {"algorithm": algorithm, "seed": seed, "queue": queue}
        )
