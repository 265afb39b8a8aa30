"""The global state every test starts from, put back after it: whatever ran before (in any order:
pytest-randomly shuffles the tests, pyproject.toml) and whatever the test changes, the next test
computes the same. random's and numpy's global generators are pytest-randomly's: it seeds them
before each test from its seed and the test's id; torch's, which it leaves alone, is seeded here.

Only the standard library and pytest are needed: the edge agent's tests also run where torch is
absent, as on an edge host (test_edge.py::test_the_agent_stands_alone)."""

from __future__ import annotations

import os

import pytest

from protocol.http import TOKEN_FILE_ENV
from protocol.worker import START_ENV

try:
    import torch
except ModuleNotFoundError:
    torch = None

# Variables the code reads when called: set in a developer's shell, they would change what a test
# sees. A test that needs one sets it (monkeypatch.setenv).
CODE_READS = (TOKEN_FILE_ENV, START_ENV)


@pytest.fixture(autouse=True)
def _environment():
    """The process's environment without `CODE_READS`, and as it was after the test (code under
    test writes it: workloads.train sets GLOO_SOCKET_IFNAME). Restored variable by variable, not
    cleared and refilled: threads of module-scoped servers may read it meanwhile."""
    saved = dict(os.environ)
    for name in CODE_READS:
        os.environ.pop(name, None)
    yield
    for name in os.environ.keys() - saved.keys():
        del os.environ[name]
    os.environ.update({k: v for k, v in saved.items() if os.environ.get(k) != v})


if torch is not None:

    @pytest.fixture(autouse=True)
    def _torch():
        """One intra-op thread: on more, torch splits sums and adds the parts in another order, so
        a test's numbers depended on the core count and on what ran before (test_tapfinger set 1
        at import; scheduler code that tests call sets its own). And the global generator from
        seed 0: a module a test builds without a seed of its own gets the same weights in any
        order."""
        threads, rng = torch.get_num_threads(), torch.get_rng_state()
        torch.set_num_threads(1)
        torch.manual_seed(0)
        yield
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
