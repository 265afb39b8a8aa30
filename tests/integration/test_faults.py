"""The fault suite on the real stack (`experiments/e2e/faults.py` injects each fault and says
what must happen; experiments/bench_faults.py writes the table): a job is never lost or run
twice when the Master, an agent or ovs-vswitchd is killed and started again; a worker killed by
its memory limit is reported with the limit; a stopped node goes offline within 10 s and its job
moves; run.py refuses a results folder it cannot write, and a run.py killed -9 leaves nothing
after `--cleanup`.

The first five share one bring-up (node_stop, which kills a node, runs last); each can be run
alone with `-k NAME`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import cleanup
from testbed.names import new_prefix

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
from experiments.e2e import faults


@pytest.fixture(scope="module")
def stack(testbed_host: None, worker_image: str, tmp_path_factory):
    prefix = new_prefix()
    try:
        with faults.bring_up(prefix, tmp_path_factory.mktemp("faults"), seed=0) as s:
            yield s
    finally:
        cleanup(prefix)
    assert faults.leftovers_of(prefix) == {}


def check(row: faults.Row) -> None:
    assert row.recovered and row.lost in (0, None) and row.duplicated in (0, None), row


def test_master_kill(stack) -> None:
    check(faults.run(faults.master_kill, stack))


def test_agent_kill(stack) -> None:
    check(faults.run(faults.agent_kill, stack))


def test_ovs_restart(stack) -> None:
    check(faults.run(faults.ovs_restart, stack))


def test_oom_kill(stack) -> None:
    row = faults.run(faults.oom_kill, stack)
    check(row)
    assert row.detect_s is not None and row.detect_s <= faults.DETECT_S, row


def test_node_stop(stack) -> None:
    row = faults.run(faults.node_stop, stack)
    check(row)
    assert row.detect_s <= faults.DETECT_S, row


def test_out_unwritable(tmp_path: Path, prefix: str) -> None:
    check(faults.out_unwritable(tmp_path, prefix))


def test_orchestrator_kill(tmp_path: Path, prefix: str, worker_image: str) -> None:
    check(faults.run(faults.orchestrator_kill, tmp_path, prefix))
