"""The Scheduler: the pluggable joint decision (placement + path + rate) behind the Master.

Any algorithm of the registry (`scheduler.baselines.ALGORITHMS`: the baselines, `exact`,
`ces-ppo`, ...) plugs in by name. Every decision passes `check_decision` on the view it was made
on before the Master acts on it: an algorithm bug becomes a clear `CannotPlace`, never a
half-enforced job.
"""
from __future__ import annotations

import time

from ..baselines import ALGORITHMS, make_algorithm
from ..model import CannotPlace, Cluster, Decision, Job, check_decision


class UnknownAlgorithm(ValueError):
    pass


class Scheduler:
    def __init__(self, default: str, seed: int = 0):
        self.seed = seed
        self._algorithms: dict[str, object] = {}
        self.default = self._check(default)

    @staticmethod
    def _check(name: str) -> str:
        if name not in ALGORITHMS:
            raise UnknownAlgorithm(f"unknown scheduler '{name}' (known: "
                                   f"{', '.join(sorted(ALGORITHMS))})")
        return name

    def configure(self, default: str, seed: int) -> None:
        """A new default algorithm and seed (algorithms are re-created: seeded at construction)."""
        self.default, self.seed = self._check(default), seed
        self._algorithms.clear()

    def resolve(self, name: str | None) -> str:
        return self._check(name) if name else self.default

    def decide(self, view: Cluster, job: Job, algorithm: str) -> Decision:
        """The algorithm's decision for `job` on `view`; `CannotPlace` when it does not fit."""
        algo = self._algorithms.get(algorithm)
        if algo is None:
            algo = self._algorithms[algorithm] = make_algorithm(algorithm, seed=self.seed)
        t0 = time.perf_counter()
        decision = algo.place(view, job)
        decision.decision_s = time.perf_counter() - t0
        problems = check_decision(view, job, decision)
        if problems:
            raise CannotPlace(f"{algorithm} returned an infeasible decision: {problems[0]}")
        return decision
