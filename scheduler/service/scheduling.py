"""The Scheduler: the pluggable joint decision (placement + path + rate) behind the Master.

Any algorithm of the registry (`scheduler.baselines.ALGORITHMS`: the baselines, `exact`,
`ces-ppo`, ...) plugs in by name. Every decision passes `check_decision` on the view it was made
on before the Master acts on it: an algorithm bug becomes a clear `CannotPlace`, never a
half-enforced job.
"""
from __future__ import annotations

import time

from ..baselines import algorithm_names, make_algorithm
from ..model import CannotPlace, Cluster, Decision, Job, check_decision


class UnknownAlgorithm(ValueError):
    """A scheduler name that is not registered, or whose algorithm cannot be built."""


class Scheduler:
    def __init__(self, default: str, seed: int = 0):
        self._algorithms: dict[str, object] = {}
        self.configure(default, seed)

    @staticmethod
    def _check(name: str) -> str:
        known = algorithm_names()
        if name.partition(":")[0] not in known:
            raise UnknownAlgorithm(f"unknown scheduler '{name}' (known: {', '.join(known)})")
        return name

    def configure(self, default: str, seed: int) -> None:
        """A new default algorithm and seed (algorithms are re-created: seeded at construction).
        Fails, changing nothing, when the algorithm cannot be built (e.g. a missing checkpoint)."""
        algo = self._build(self._check(default), seed)
        self._algorithms = {default: algo}
        self.default, self.seed = default, seed

    def resolve(self, name: str | None) -> str:
        if not name:
            return self.default
        self.algorithm(self._check(name))
        return name

    def algorithm(self, name: str):
        if name not in self._algorithms:
            self._algorithms[name] = self._build(name, self.seed)
        return self._algorithms[name]

    @staticmethod
    def _build(name: str, seed: int):
        try:
            return make_algorithm(name, seed=seed)
        except (OSError, ValueError, RuntimeError) as e:
            raise UnknownAlgorithm(f"scheduler '{name}' cannot be used: {e}") from None

    def decide(self, view: Cluster, job: Job, algorithm: str) -> Decision:
        """The algorithm's decision for `job` on `view`; `CannotPlace` when it does not fit."""
        algo = self.algorithm(algorithm)
        t0 = time.perf_counter()
        decision = algo.place(view, job)
        decision.decision_s = time.perf_counter() - t0
        problems = check_decision(view, job, decision)
        if problems:
            raise CannotPlace(f"{algorithm} returned an infeasible decision: {problems[0]}")
        return decision
