"""The global state every test starts from, put back after it: whatever ran before (in any order:
pytest-randomly shuffles the tests, pyproject.toml) and whatever the test changes, the next test
computes the same."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

from protocol.http import TOKEN_FILE_ENV
from protocol.worker import START_ENV

# Variables the code reads when called: set in a developer's shell, they would change what a test
# sees. A test that needs one sets it (monkeypatch.setenv).
CODE_READS = (TOKEN_FILE_ENV, START_ENV)


@pytest.fixture(autouse=True)
def _torch_threads():
    """One intra-op thread: on more, torch splits sums and adds the parts in another order, so a
    test's numbers depended on the core count and on what ran before (test_tapfinger set 1 at
    import, and scheduler code a test calls sets its own)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _seeds():
    """torch's global generator from seed 0 (a module a test builds without its own seed gets the
    same weights in any order). Also random's and numpy's, for runs with pytest-randomly off;
    with it on, it seeds those two again just before the test from its own seed and the test's
    id (`--randomly-seed=N` repeats a run)."""
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    yield
    torch.set_rng_state(saved[0])
    random.setstate(saved[1])
    np.random.set_state(saved[2])


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
