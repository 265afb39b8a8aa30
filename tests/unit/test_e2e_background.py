"""Other tenants in a scenario: a transfer sent along a job (`background: {along: JOB}`) — which
link it hits, how a scenario spells it, and the on-vs-off figure of runtime adjustment in the
report; the network they leave (`background_load`); and the network without delays."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

import itertools

from experiments import report
from experiments.e2e.scenario import (
    BackgroundFlow,
    ScenarioError,
    loaded,
    plan,
    scaled,
    spread_out,
    tenant_path,
)
from scheduler.jobs import JobDocument, parse_job
from topologies import load_topology

CAMPUS = scaled(load_topology("campus"), 0.2)
# The light ring of a contention run: lab1, lab2 and lib1; lab2 -> lib1 and lib1 -> lab1 over
# the core, lab1 -> lab2 inside acc1.
VIA_CORE = [
    {"path": ["lib1", "acc2", "agg2", "core1", "agg1", "acc1", "lab1"], "rate_mbps": 38.0},
    {"path": ["lab2", "acc1", "agg1", "core1", "agg2", "acc2", "lib1"], "rate_mbps": 37.7},
    {"path": ["lab1", "acc1", "lab2"], "rate_mbps": 190.0},
]


def test_the_tenant_crosses_the_most_loaded_link_that_a_reroute_can_avoid():
    # acc2-agg2 and agg2-core1 both run at 38 of 40 Mbit/s; acc2's only other uplink has 10,
    # agg2's other core link 40: the tenant goes where the job has a detour.
    path, link = tenant_path(CAMPUS, BackgroundFlow("lab3", "srv3", 20.0, along="light"), VIA_CORE)
    assert link == ("agg2", "core1")
    assert path == ["acc1", "agg2", "core1", "agg3"]  # shares no other link with the job


def test_the_tenant_path_is_loop_free_and_joins_its_own_ends():
    for src, dst in [("lab3", "srv3"), ("srv3", "lab3"), ("lib2", "dorm1"), ("dorm2", "lib2")]:
        found = tenant_path(CAMPUS, BackgroundFlow(src, dst, 5.0, along="light"), VIA_CORE)
        assert found is not None, (src, dst)
        path, (u, v) = found
        assert len(set(path)) == len(path)
        assert path[0] == CAMPUS.access_link(src).other(src)
        assert path[-1] == CAMPUS.access_link(dst).other(dst)
        assert (u, v) in list(itertools.pairwise(path))
        assert all(CAMPUS.graph().has_edge(a, b) for a, b in itertools.pairwise(path))


def test_the_tenant_rides_along_the_job_on_as_few_links_as_it_can():
    # From lab3 (acc1) to lib2 (acc2), crossing core1 -> agg2 would follow lab2 -> lib1 over four
    # of its links; acc1-agg2-acc2 meets the job on agg2 -> acc2 only (as loaded: 37.7 of 40).
    path, link = tenant_path(CAMPUS, BackgroundFlow("lab3", "lib2", 20.0, along="light"), VIA_CORE)
    assert link == ("agg2", "acc2") and path == ["acc1", "agg2", "acc2"]


def test_a_job_that_crosses_no_switch_to_switch_link_cannot_be_hit():
    one_switch = [{"path": ["srv1", "acc4", "srv2"], "rate_mbps": 130.0}]
    assert (
        tenant_path(CAMPUS, BackgroundFlow("lab3", "srv3", 20.0, along="heavy"), one_switch) is None
    )


def _plan(tmp_path: Path, background: str) -> argparse.Namespace:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: s\ntopology: campus\nschedulers: [ces-ppo]\n"
        f"background: [{background}]\n"
        f"jobs: {REPO / 'experiments' / 'jobs' / 'contention.yaml'}\n"
    )
    return argparse.Namespace(
        scenario=str(scenario),
        quick=False,
        seeds=None,
        topo=None,
        jobs=None,
        schedulers=None,
        out=str(tmp_path / "out"),
        hosts=None,
        background_seed=None,
    )


def test_a_scenario_names_the_job_the_tenant_follows(tmp_path: Path):
    p = plan(_plan(tmp_path, "{src: lab3, dst: srv3, mbps: 20, along: light, start_s: 0}"))
    assert p.scenario.background[0].along == "light"
    with pytest.raises(ScenarioError, match="along 'nope' is not a job of the scenario"):
        plan(_plan(tmp_path, "{src: lab3, dst: srv3, mbps: 20, along: nope, start_s: 0}"))
    for bad in [
        "{src: lab3, dst: srv3, mbps: 20, along: light}",  # needs start_s
        "{src: lab3, dst: srv3, mbps: 20, along: light, start_s: 0, path: [acc1]}",
        "{src: lab3, dst: srv3, mbps: 20, along: [light], start_s: 0}",
    ]:
        with pytest.raises(ScenarioError, match=r"background\[0\].*along: JOB"):
            plan(_plan(tmp_path, bad))


def test_quick_with_a_scenario_file_is_refused_not_ignored(tmp_path: Path):
    args = _plan(tmp_path, "{src: lab3, dst: srv3, mbps: 20, along: light, start_s: 0}")
    args.quick = True  # run.py prints the one line and exits 2
    with pytest.raises(
        ScenarioError, match=r"^--quick and --scenario each name a scenario: give one$"
    ):
        plan(args)


@pytest.mark.parametrize("topo", ["campus", "ring", "fattree", "star", "gen:internet:12:1"])
def test_the_default_scenario_spreads_its_jobs_on_every_topology(topo, tmp_path: Path):
    """`spread: true`: on any topology no node holds a whole job and all three run at once."""
    p = plan(
        argparse.Namespace(
            scenario=None,
            quick=False,
            seeds=None,
            topo=topo,
            jobs=None,
            schedulers="k8s-spread",
            out=str(tmp_path / "o"),
            hosts=None,
            background_seed=None,
        )
    )
    nodes = p.topo.nodes
    for d in p.scenario.jobs:
        [mem] = {t.demand.mem_mb for t in d.job.tasks}
        assert max(n.mem_mb for n in nodes) < len(d.job.tasks) * mem  # no node holds it whole
        assert max(n.mem_mb for n in nodes) >= (len(d.job.tasks) - 1) * mem  # the least such
        assert d.mapping["task"]["mem_mb"] == mem  # what the Master is sent
    assert not [w for w in p.warnings if "cannot all run at once" in w]
    if topo == "campus":  # a server holds two tasks, a lab node one, the smaller nodes none
        assert mem == 1366 and not p.warnings


def test_spreading_keeps_larger_asks_and_one_task_jobs_and_needs_a_node(tmp_path: Path):
    ring = load_topology("ring")
    jobs = [
        JobDocument("j.yaml", m, parse_job(m, "j.yaml"))
        for m in (
            {
                "name": "big",
                "collective": "ring",
                "workers": 3,
                "task": {"cpu": 0.1, "mem_mb": 900},
                "model_params": 10,
                "demand_mbps": 1,
                "iterations": 1,
            },
            {
                "name": "one",
                "collective": "ring",
                "workers": 1,
                "task": {"cpu": 0.1},
                "model_params": 10,
                "demand_mbps": 1,
                "iterations": 1,
            },
            {
                "name": "ps",
                "collective": "star",
                "workers": 3,
                "task": {"cpu": 0.1},
                "ps": {"cpu": 0.1, "mem_mb": 100},
                "model_params": 10,
                "demand_mbps": 1,
                "iterations": 1,
            },
        )
    ]
    big, one, ps = spread_out(jobs, ring, set())
    assert {t.demand.mem_mb for t in big.job.tasks} == {900}  # more than 2048 // 3 + 1
    assert one is jobs[1]
    assert {t.demand.mem_mb for t in ps.job.tasks} == {2048 // 4 + 1}
    with pytest.raises(ScenarioError, match="every compute node is a background endpoint"):
        spread_out(jobs, ring, {n.name for n in ring.nodes})


def test_jobs_that_cannot_run_together_are_said_to_wait(tmp_path: Path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: s\ntopology: ring\nschedulers: [k8s-spread]\njobs:\n"
        + "".join(
            f"  - {{name: j{i}, collective: ring, workers: 3, task: {{cpu: 0.1, mem_mb: 1000}}, "
            "model_params: 1000, demand_mbps: 10, iterations: 5}\n"
            for i in range(3)
        )
    )
    args = argparse.Namespace(
        scenario=str(scenario),
        quick=False,
        seeds=None,
        topo=None,
        jobs=None,
        schedulers=None,
        out=str(tmp_path / "out"),
        hosts=None,
        background_seed=None,
    )
    [warning] = plan(args).warnings
    assert "cannot all run at once on ring" in warning and "j0, j1, j2" in warning
    scenario.write_text(scenario.read_text() + "spread: yes please\n")
    with pytest.raises(ScenarioError, match="'spread': expected true or false"):
        plan(args)


def _row(scheduler: str, seed: int, job: str, tta: float | None, adjusted: bool = False) -> dict:
    return {
        "scheduler": scheduler,
        "seed": seed,
        "job": job,
        "tta_s": tta,
        "reached_target": tta is not None,
        "flows": [],
        "adjustments": [{"at": 1.0, "links": ["a>b"]}] if adjusted else [],
    }


def test_the_report_compares_the_affected_job_with_adjustment_on_and_off():
    runs = [
        {
            "scheduler": s,
            "seed": seed,
            "jobs": [_row(s, seed, "light", tta), _row(s, seed, "heavy", 20.0)],
        }
        for s, seed, tta in [
            ("ces-ppo", 0, 20.0),
            ("ces-ppo", 1, 30.0),
            ("ces-ppo/static", 0, 40.0),
            ("ces-ppo/static", 1, None),
        ]
    ]
    results = {"background": [{"src": "lab3", "dst": "srv3", "along": "light"}], "runs": runs}
    [line, _] = report.adjustment_effect(results, timeout_s=100.0)
    # on: 25 ± 7.1; off: 40 and the unreached run at the timeout, 70 ± 42.4
    assert (
        "`light`: 25.0 ± 7.1 s with `ces-ppo`, 70.0 ± 42.4 s with `ces-ppo/static` (64% lower)"
        in line
        and "heavy" not in line
    )
    # No `along`: the jobs the scheduler re-routed are the affected ones.
    runs[0]["jobs"][1] = _row("ces-ppo", 0, "heavy", 20.0, adjusted=True)
    [line, _] = report.adjustment_effect({"runs": runs}, timeout_s=100.0)
    assert "`heavy`" in line and "`light`" not in line
    assert report.adjustment_effect({"runs": runs[:2]}, timeout_s=100.0) == []


def test_an_emulation_without_netem_gives_the_master_the_links_without_their_delays(
    monkeypatch, tmp_path
):
    """Where the kernel has no sch_netem the links run without delay; the Master and the SDN app
    must get that network (`Stack`), and the rates and ports stay as they were."""
    from rich.console import Console

    from edge import tc
    from experiments.e2e import stack

    atlanta = load_topology("sndlib/atlanta")
    assert max(lk.delay_ms for lk in atlanta.links) > 50
    monkeypatch.setattr(tc, "probe_netem", lambda: False)
    s = stack.Stack(atlanta, "ces0000", tmp_path, Console(quiet=True))
    assert all(lk.delay_ms == 0.0 for lk in s.topo.links)
    assert [(lk.a, lk.b, lk.bw_mbps, lk.port_a, lk.port_b) for lk in s.topo.links] == [
        (lk.a, lk.b, lk.bw_mbps, lk.port_a, lk.port_b) for lk in atlanta.links
    ]
    monkeypatch.setattr(tc, "probe_netem", lambda: True)
    assert stack.Stack(atlanta, "ces0000", tmp_path, Console(quiet=True)).topo is atlanta


def test_a_loaded_network_is_what_the_background_load_leaves_of_every_node_and_link():
    a, b = loaded(CAMPUS, 0.5, 3), loaded(CAMPUS, 0.5, 4)
    assert loaded(CAMPUS, 0.5, 3) == a and a != b  # a draw per seed, the same for a seed
    for before, after in zip(CAMPUS.nodes, a.nodes):
        assert after.name == before.name and after.ip == before.ip
        assert 0.5 * before.cpu <= after.cpu <= before.cpu  # level 0.5: at most half taken
        assert 0.5 * before.mem_mb - 1 <= after.mem_mb <= before.mem_mb
    pairs = list(zip(CAMPUS.links, a.links))
    assert all(
        (x.a, x.b, x.port_a, x.port_b, x.delay_ms) == (y.a, y.b, y.port_a, y.port_b, y.delay_ms)
        for x, y in pairs
    )
    assert all(0 < y.bw_mbps <= x.bw_mbps for x, y in pairs)
    assert sum(y.bw_mbps < x.bw_mbps for x, y in pairs) >= 3  # flows took some links' share
    assert any(y.cpu < x.cpu for x, y in zip(CAMPUS.nodes, a.nodes))
    idle = loaded(CAMPUS, 0.0, 3)
    assert [lk.bw_mbps for lk in idle.links] == [lk.bw_mbps for lk in CAMPUS.links]


def test_a_scenario_draws_its_background_load_per_seed(tmp_path: Path):
    scenario = REPO / "experiments" / "scenarios" / "loaded.yaml"

    def args(seed: int | None, path: Path = scenario) -> argparse.Namespace:
        return argparse.Namespace(
            scenario=str(path),
            quick=False,
            seeds=None,
            topo="ring",
            jobs=None,
            schedulers=None,
            out=str(tmp_path / "o"),
            hosts=None,
            background_seed=seed,
        )

    ring = scaled(load_topology("ring"), 0.2)
    assert plan(args(None)).topo == loaded(ring, 0.5, 0)  # what the Master and the SDN app get
    assert plan(args(2)).topo == loaded(ring, 0.5, 2)
    with pytest.raises(ScenarioError, match="--background-seed: expected an integer >= 0"):
        plan(args(-1))
    text = scenario.read_text()
    for bad in ("{level: 1.5, seed: 0}", "{level: 0.5}", "{level: 0.5, seed: x}", "0.5"):
        path = tmp_path / "bad.yaml"
        path.write_text(
            text.replace("{level: 0.5, seed: 0}", bad).replace(
                "../jobs/contention.yaml", str(REPO / "experiments" / "jobs" / "contention.yaml")
            )
        )
        with pytest.raises(
            ScenarioError,
            match=r"bad.yaml: field 'background_load': expected "
            r"\{level",
        ):
            plan(args(None, path))
    plain = REPO / "experiments" / "scenarios" / "contention.yaml"
    with pytest.raises(ScenarioError, match=r"contention.yaml has no 'background_load'"):
        plan(args(1, plain))
