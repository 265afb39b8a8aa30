"""Shared fixtures of the integration tests (real Open vSwitch, Docker engine, containers).

- `testbed_host` (session): root, ovs-vswitchd and dockerd are up. Where they are not, tests are
  skipped — except in CI (`CI` set), where that is a failure: integration tests are never
  skipped there.
- `prefix`: a fresh run prefix per test (`ces` + 4 hex digits) for everything the test creates;
  whatever still carries it after the test is removed (only that prefix, never other runs').
- `worker_image` (session): the worker image tag, built if its inputs changed.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from testbed.names import new_prefix


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True).returncode != 0:
        return "Open vSwitch (ovs-vswitchd) is not running"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "the Docker engine is not running"
    return None


@pytest.fixture(scope="session")
def testbed_host() -> None:
    reason = _unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"integration tests must run in CI: {reason}")
        pytest.skip(reason)


@pytest.fixture
def prefix(testbed_host: None):
    from testbed.cleanup import cleanup

    p = new_prefix()
    yield p
    cleanup(p)


@pytest.fixture(scope="session")
def worker_image(testbed_host: None) -> str:
    from testbed.image import ensure

    return ensure()
