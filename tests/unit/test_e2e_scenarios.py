"""The bundled scenarios (experiments/scenarios/) as `run.py` reads them, without a testbed: each
one plans — its jobs, schedulers and tenants checked, its jobs sized — on campus and on the metro
ring; and the mixed scenario's jobs span nodes and are placed, one after the other as the Master
places them, by every scheduler of its set (pure Python: the schedulers need no Docker)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

from experiments.e2e.scenario import SCENARIOS, Plan, plan
from scheduler import compose
from scheduler.metrics import packable
from scheduler.model import CannotPlace, Cluster

MIXED = SCENARIOS / "mixed.yaml"


def _plan(path: Path, topo: str, out: Path) -> Plan:
    return plan(
        argparse.Namespace(
            scenario=str(path),
            quick=False,
            seeds=None,
            topo=topo,
            jobs=None,
            schedulers=None,
            out=str(out),
            hosts=None,
            background_seed=None,
        )
    )


@pytest.mark.parametrize("topo", ["campus", "ring"])
@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_bundled_scenario_plans(path: Path, topo: str, tmp_path: Path):
    p = _plan(path, topo, tmp_path / "out")
    assert p.scenario.jobs and p.schedulers and p.topo.name == topo


def _placed(p: Plan, spec: str, seed: int) -> dict[str, list[str]]:
    """Each job's nodes as `spec` places the jobs one after the other in submission order, on
    the network as the earlier ones left it; a job it cannot place now is left out (it waits)."""
    algorithm = compose.build(spec, seed)
    cluster = Cluster.from_topology(p.topo)
    nodes = {}
    for d in p.scenario.jobs:
        try:
            decision = algorithm.place(cluster, d.job)
        except CannotPlace:
            continue
        cluster.allocate(d.job, decision)
        nodes[d.job.name] = sorted(decision.placement.values())
    return nodes


def test_the_mixed_scenario_runs_every_graph_at_once_on_campus(tmp_path: Path):
    p = _plan(MIXED, "campus", tmp_path / "out")
    jobs = {d.job.name: d.job for d in p.scenario.jobs}
    assert {j.collective for j in jobs.values()} == {"ring", "star", "all-to-all", "custom"}
    assert p.schedulers == ["ces-ppo", "k8s-spread", "ces-ppo/best-effort", "network-aware/ces"]
    assert not p.warnings  # the tenant's nodes and path are campus's; all fit at once
    largest = max(n.mem_mb for n in p.topo.nodes)
    for job in jobs.values():  # spread: no node holds a whole job
        assert sum(t.demand.mem_mb for t in job.tasks) > largest
    cycle = jobs["cycle"].logical_graph()
    assert {("a", "b"), ("b", "c"), ("c", "a"), ("a", "c"), ("c", "d"), ("d", "a")} == set(
        cycle.edges
    )
    for spec in p.schedulers:
        for seed in range(3):
            placed = _placed(p, spec, seed)
            assert set(placed) == set(jobs), (spec, seed)
            assert all(len(set(nodes)) > 1 for nodes in placed.values())


def test_the_mixed_scenario_sizes_for_the_ring_where_the_star_waits(tmp_path: Path):
    p = _plan(MIXED, "ring", tmp_path / "out")
    [warning] = p.warnings  # campus's tenant is not on the ring
    assert "background lab3->srv3 skipped" in warning
    jobs = [d.job for d in p.scenario.jobs]
    cluster = Cluster.from_topology(p.topo)
    together = replace(jobs[0], tasks=[t for j in jobs for t in j.tasks], flows=[])
    assert packable(cluster, together, budget=3_000_000) is False
    for spec in p.schedulers:
        assert all(compose.build(spec).place(cluster, job).placement for job in jobs)
        assert list(_placed(p, spec, 0)) == ["cycle", "ring", "a2a"], spec
