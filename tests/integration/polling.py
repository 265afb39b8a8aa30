"""Waiting for the real stack: poll a condition with a timeout instead of sleeping."""

from __future__ import annotations

import time


def wait_for(predicate, timeout_s: float, what: str):
    """The predicate's first true value, polled every 0.2 s; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.2)
