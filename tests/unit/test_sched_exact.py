"""The exact reference against brute force: every placement × every loop-free path per flow,
rates by the bytes-weighted rate split, judged by `predicted_iteration_s`."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.baselines import make_algorithm
from scheduler.instances import random_instance
from scheduler.jobs import ring_job
from scheduler.metrics import predicted_iteration_s
from scheduler.model import (
    CannotPlace,
    Cluster,
    Decision,
    FlowAssignment,
    Job,
    Resources,
    check_decision,
)
from scheduler.paths import fair_rates
from scheduler.perfmodel import IterationModel
from topologies import load_topology


def all_paths(cluster: Cluster, a: str, b: str) -> list[tuple[str, ...]]:
    g = cluster.graph
    view = g.subgraph([v for v in g if v in (a, b) or g.nodes[v]["kind"] == "switch"])
    return [tuple(p) for p in nx.all_simple_paths(view, a, b)]


def brute_force(cluster: Cluster, job: Job, model: IterationModel) -> float:
    """The best predicted iteration time over everything (inf when nothing is feasible)."""
    nodes = cluster.compute_nodes(online_only=True)
    best = math.inf
    for combo in itertools.product(nodes, repeat=len(job.tasks)):
        placement = {t.name: n for t, n in zip(job.tasks, combo)}
        crossing = [f for f in job.flows if placement[f.src] != placement[f.dst]]
        options = [all_paths(cluster, placement[f.src], placement[f.dst]) for f in crossing]
        for paths in itertools.product(*options):
            chosen = {(f.src, f.dst): p for f, p in zip(crossing, paths)}
            rates = fair_rates(
                cluster,
                chosen,
                {(f.src, f.dst): f.demand_mbps for f in crossing},
                {(f.src, f.dst): f.bytes_per_iter for f in crossing},
            )
            decision = Decision(
                job.name,
                placement,
                [
                    FlowAssignment(f.src, f.dst, chosen[f.src, f.dst], rates[f.src, f.dst])
                    for f in crossing
                ],
            )
            if check_decision(cluster, job, decision):
                continue
            best = min(best, predicted_iteration_s(cluster, job, decision, model))
    return best


@pytest.mark.parametrize(
    "model",
    [IterationModel(), IterationModel(max_rate_mbps=40)],
    ids=["default-model", "goodput-capped"],
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_exact_matches_brute_force_on_tiny_instances(model, seed):
    cluster, job = random_instance(
        np.random.default_rng(seed), max_switches=3, max_nodes=3, max_workers=3
    )
    expected = brute_force(cluster, job, model)
    exact = make_algorithm("exact", model=model)
    try:
        decision = exact.place(cluster, job)
    except CannotPlace:
        assert expected == math.inf
        return
    assert check_decision(cluster, job, decision) == []
    got = predicted_iteration_s(cluster, job, decision, model)
    assert got == pytest.approx(expected, rel=1e-9)
    assert exact.last_objective_s == pytest.approx(got, rel=1e-9)  # the closed form is the model


def test_exact_on_campus_is_optimal_and_fast_enough():
    cluster = Cluster.from_topology(load_topology("campus"))
    job = ring_job("r", 5, Resources(0.5, 256), 4e7, 100, compute_s=0.05, iterations=10)
    exact = make_algorithm("exact")
    decision = exact.place(cluster, job)
    assert exact.last_optimal and decision.decision_s < 20
    assert predicted_iteration_s(cluster, job, decision) <= min(
        predicted_iteration_s(cluster, job, make_algorithm(n).place(cluster, job))
        for n in ("first-fit", "k8s-spread", "network-aware")
    )


def test_exact_reports_a_timeout_and_applies_by_size():
    cluster = Cluster.from_topology(load_topology("campus"))
    job = ring_job("r", 6, Resources(0.25, 256), 4e7, 100, compute_s=0.05, iterations=10)
    exact = make_algorithm("exact", time_limit_s=0.0)
    try:
        exact.place(cluster, job)
    except CannotPlace as e:
        assert "timed out" in str(e)
    assert not exact.last_optimal
    assert exact.applies(cluster, job)
    assert not make_algorithm("exact", max_tasks=5).applies(cluster, job)
    assert not exact.applies(Cluster.from_topology(load_topology("gen:internet:30")), job)
