"""The simulator: rates flows really get (granted, max-min fair, scaled on a capacity drop), event
order, progress at changing pace, node leave/join, rejection, reproducibility."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scheduler.arrivals import parse_arrivals
from scheduler.baselines import make_algorithm
from scheduler.evaluate import run_policy
from scheduler.jobs import custom_job
from scheduler.metrics import predicted_iteration_s
from scheduler.model import Cluster, Decision, FlowAssignment, Job, LogicalFlow, Resources, Task
from scheduler.multi import Fifo, FifoBackfill
from scheduler.rounds import Round, estimated_iteration_s, scale_job
from scheduler.simulator import (
    BackgroundFlow,
    LinkChange,
    NodeJoin,
    NodeLeave,
    SimConfig,
    Simulator,
)
from topologies import load_topology, parse_topology

FOREVER = 1e9


def line_cluster() -> Cluster:
    """s1 —10— s2 —4— s3 (Mbit/s); a1, b1 at s1; b2, c2 at s2; a3, c3 at s3. The node order
    makes first-fit put a 2×1-cpu job on a1 and a3."""
    nodes = ["a1", "a3", "b1", "b2", "c2", "c3"]
    at = {"a1": "s1", "b1": "s1", "b2": "s2", "c2": "s2", "a3": "s3", "c3": "s3"}
    doc = {
        "switches": [{"name": s} for s in ("s1", "s2", "s3")],
        "nodes": [{"name": n, "cpu": 1, "mem_mb": 1024} for n in nodes],
        "links": [{"ends": ["s1", "s2"], "bw_mbps": 10}, {"ends": ["s2", "s3"], "bw_mbps": 4}]
        + [{"ends": [n, at[n]], "bw_mbps": 1000} for n in nodes],
    }
    return Cluster.from_topology(parse_topology(doc, "line"))


def one_switch(cpus: list[float]) -> Cluster:
    doc = {
        "switches": [{"name": "s"}],
        "nodes": [{"name": f"n{i}", "cpu": c, "mem_mb": 1024} for i, c in enumerate(cpus)],
        "links": [{"ends": [f"n{i}", "s"], "bw_mbps": 100} for i in range(len(cpus))],
    }
    return Cluster.from_topology(parse_topology(doc, "star"))


def pair_job(name: str = "j", iterations: int = 100, submit: float = 0.0) -> Job:
    """Two 1-cpu workers and one flow w0 -> w1 of 1 MB per iteration."""
    return custom_job(
        name,
        [Task("w0", Resources(1, 100)), Task("w1", Resources(1, 100))],
        [LogicalFlow("w0", "w1", 100.0, 1e6)],
        compute_s=0.1,
        iterations=iterations,
        submit_time=submit,
    )


def solo_job(name: str, submit: float = 0.0, iterations: int = 100, cpu: float = 1.0) -> Job:
    """One task, no flows; compute_s = cpu makes one iteration exactly 1 s on a speed-1 node."""
    return custom_job(
        name,
        [Task("w0", Resources(cpu, 100))],
        [],
        compute_s=cpu,
        iterations=iterations,
        submit_time=submit,
    )


def run(cluster: Cluster, jobs: list[Job], events=(), policy=None, **config):
    policy = policy or FifoBackfill(make_algorithm("first-fit"))
    return Simulator(cluster, policy, SimConfig(**config)).run(jobs, events)


def iteration_at(cluster: Cluster, job: Job, placement: dict[str, str], path, rate: float) -> float:
    decision = Decision(job.name, placement, [FlowAssignment("w0", "w1", path, rate)])
    return predicted_iteration_s(cluster, job, decision)


A_PATH = ("a1", "s1", "s2", "s3", "a3")
A_PLACE = {"w0": "a1", "w1": "a3"}


# --- rates --------------------------------------------------------------------------------------


@pytest.mark.parametrize("c_demand, a_rate", [(math.inf, 2.0), (1.0, 3.0)])
def test_unmetered_job_gets_its_max_min_share(c_demand, a_rate):
    # Classic case: A crosses both links, B only s1-s2 (10), C only s2-s3 (4). Max-min: A and C
    # split 4 (2 each), B takes the 8 A leaves on s1-s2; if C only wants 1, A gets 3.
    cluster = line_cluster()
    job = pair_job()
    bg = [
        BackgroundFlow(0.0, "b1", "b2", FOREVER),
        BackgroundFlow(0.0, "c2", "c3", FOREVER, c_demand),
    ]
    res = run(cluster, [job], bg, metered=False)
    js = res.jobs[0]
    assert js.decision.placement == A_PLACE and js.decision.flows[0].path == A_PATH
    expected = job.iterations * iteration_at(cluster, job, A_PLACE, A_PATH, a_rate)
    assert js.finish == pytest.approx(expected, rel=1e-9)


def test_background_flow_gets_what_the_job_leaves():
    # B is the job now (b1 -> b2 over s1-s2 only); A (background) is held to 2 by C on s2-s3,
    # so B gets 10 - 2 = 8.
    cluster = line_cluster()
    job = pair_job()
    bg = [BackgroundFlow(0.0, "a1", "a3", FOREVER), BackgroundFlow(0.0, "c2", "c3", FOREVER)]
    busy = {"a1": Resources(1, 0), "a3": Resources(1, 0)}  # keep first-fit off a1, a3
    for node, r in busy.items():
        cluster.used[node] = r
    res = run(cluster, [job], bg, metered=False)
    js = res.jobs[0]
    assert js.decision.placement == {"w0": "b1", "w1": "b2"}
    expected = job.iterations * iteration_at(
        cluster, job, js.decision.placement, ("b1", "s1", "s2", "b2"), 8.0
    )
    assert js.finish == pytest.approx(expected, rel=1e-9)


def test_metered_flow_keeps_its_grant_whatever_the_background():
    cluster = line_cluster()
    job = pair_job()
    bg = [BackgroundFlow(0.0, "b1", "b2", FOREVER), BackgroundFlow(0.0, "c2", "c3", FOREVER)]
    js = run(cluster, [job], bg).jobs[0]
    granted = js.decision.flows[0].rate_mbps
    assert granted == pytest.approx(4.0)  # first-fit's rate split: min(demand, residual)
    expected = job.iterations * iteration_at(cluster, job, A_PLACE, A_PATH, granted)
    assert js.finish == pytest.approx(expected, rel=1e-9)


def test_capacity_drop_scales_metered_flows_and_keeps_progress():
    cluster = line_cluster()
    job = pair_job(iterations=1000)
    fast = iteration_at(cluster, job, A_PLACE, A_PATH, 4.0)
    slow = iteration_at(cluster, job, A_PLACE, A_PATH, 1.0)
    t_drop = 100 * fast + 1e-3
    res = run(cluster, [job], [LinkChange(t_drop, "s2", "s3", 1.0)])
    done_before = t_drop / fast
    expected = t_drop + (job.iterations - done_before) * slow
    assert res.jobs[0].finish == pytest.approx(expected, rel=1e-9)
    assert res.end_time == pytest.approx(expected, rel=1e-9)  # superseded events do not count


def triangle_cluster(cpu: float = 1) -> Cluster:
    """a at s1, b at s2; s1 —10— s2 directly and over s3 (10 + 10)."""
    doc = {
        "switches": [{"name": s} for s in ("s1", "s2", "s3")],
        "nodes": [{"name": n, "cpu": cpu, "mem_mb": 1024} for n in ("a", "b")],
        "links": [
            {"ends": ["s1", "s2"], "bw_mbps": 10},
            {"ends": ["s1", "s3"], "bw_mbps": 10},
            {"ends": ["s3", "s2"], "bw_mbps": 10},
            {"ends": ["a", "s1"], "bw_mbps": 1000},
            {"ends": ["b", "s2"], "bw_mbps": 1000},
        ],
    }
    return Cluster.from_topology(parse_topology(doc, "triangle"))


@pytest.mark.parametrize("adjust", [True, False])
def test_a_shrunk_link_re_routes_enforced_jobs_unless_adjustment_is_off(adjust):
    cluster = triangle_cluster()
    job = pair_job(iterations=1000)
    place, direct = {"w0": "a", "w1": "b"}, ("a", "s1", "s2", "b")
    full = iteration_at(cluster, job, place, direct, 10.0)
    t_drop = 100 * full + 1e-3
    res = run(cluster, [job], [LinkChange(t_drop, "s1", "s2", 1.0)], adjust=adjust)
    js = res.jobs[0]
    assert js.decision.placement == place
    if adjust:  # off the shrunk link, over s3, at the full rate: no slower than before
        assert js.reroutes == 1 and js.decision.flows[0].path == ("a", "s1", "s3", "s2", "b")
        assert js.finish == pytest.approx(job.iterations * full, rel=1e-9)
    else:  # stays, scaled down to the link's 1 Mbit/s
        slow = iteration_at(cluster, job, place, direct, 1.0)
        assert js.reroutes == 0 and js.decision.flows[0].path == direct
        assert js.finish == pytest.approx(
            t_drop + (job.iterations - t_drop / full) * slow, rel=1e-9
        )


class Doubled(FifoBackfill):
    """Starts every job at twice the cpu it asked (an elastic share, `Round.commit`'s granted)."""

    def schedule(self, rnd: Round) -> None:
        for js in list(rnd.queue):
            granted = scale_job(js.job, cpu=2.0)
            rnd.commit(js, self.algorithm.place(rnd.view(js), granted), granted)


def test_a_re_route_keeps_the_share_a_job_was_granted():
    cluster = triangle_cluster(cpu=2)
    job = pair_job(iterations=1000)
    sim = Simulator(cluster, Doubled(make_algorithm("first-fit")), SimConfig(until=50.0))
    js = sim.run([job], [LinkChange(10.0, "s1", "s2", 1.0)]).jobs[0]
    assert js.state == "running" and js.reroutes == 1
    assert cluster.free("a").cpu == cluster.free("b").cpu == 0.0  # still 2 cpu each, as granted


def test_background_ending_speeds_the_job_up():
    cluster = line_cluster()
    job = pair_job(iterations=1000)
    shared = iteration_at(cluster, job, A_PLACE, A_PATH, 2.0)
    alone = iteration_at(cluster, job, A_PLACE, A_PATH, 4.0)
    t_end = 50 * shared
    res = run(cluster, [job], [BackgroundFlow(0.0, "c2", "c3", t_end)], metered=False)
    expected = t_end + (job.iterations - t_end / shared) * alone
    assert res.jobs[0].finish == pytest.approx(expected, rel=1e-9)
    # The completion event planned at the slower pace is dropped, not waited for.
    assert res.end_time == pytest.approx(expected, rel=1e-9)


# --- events -------------------------------------------------------------------------------------


def test_completion_frees_resources_for_a_simultaneous_arrival_fifo_order():
    cluster = one_switch([1.0])
    jobs = [solo_job("first", 0.0), solo_job("second", 100.0), solo_job("early", 50.0)]
    res = run(cluster, jobs, policy=Fifo(make_algorithm("first-fit")))
    by = {js.name: js for js in res.jobs}
    assert by["first"].finish == pytest.approx(100.0)
    # "early" arrived before "second": FIFO starts it when "first" ends, at t = 100 exactly.
    assert by["early"].first_start == pytest.approx(100.0)
    assert by["second"].first_start == pytest.approx(200.0)
    assert by["second"].wait(res.end_time) == pytest.approx(100.0)
    assert [s[1] for s in res.starts] == ["first", "early", "second"]


def test_a_job_ending_when_its_node_leaves_finishes_first():
    res = run(one_switch([1.0, 1.0]), [solo_job("j")], [NodeLeave(100.0, "n0")])
    js = res.jobs[0]
    assert js.state == "finished" and js.finish == pytest.approx(100.0)
    assert len(res.starts) == 1


def test_strict_fifo_blocks_behind_the_head_backfill_does_not():
    cluster = one_switch([1.0])
    jobs = [solo_job("run", 0.0), solo_job("big", 1.0, cpu=1.0), solo_job("small", 2.0, cpu=0.5)]
    cluster.graph.nodes["n0"]["cpu"] = 1.5
    fifo = {
        js.name: js
        for js in run(cluster.copy(), jobs, policy=Fifo(make_algorithm("first-fit"))).jobs
    }
    back = {js.name: js for js in run(cluster.copy(), jobs).jobs}
    assert fifo["small"].first_start == pytest.approx(100.0)
    assert back["small"].first_start == pytest.approx(2.0)


def test_node_leave_requeues_the_job_with_its_progress():
    cluster = one_switch([1.0, 1.0])
    res = run(cluster, [solo_job("j")], [NodeLeave(30.0, "n0")], restart_overhead_s=10.0)
    js = res.jobs[0]
    assert js.decision.placement == {"w0": "n1"} and js.preemptions == 0
    assert js.state == "finished" and js.finish == pytest.approx(30 + 10 + 70)
    assert [s[:2] for s in res.starts] == [(0.0, "j"), (30.0, "j")]


def test_node_leave_fails_the_job_when_so_configured():
    res = run(one_switch([1.0, 1.0]), [solo_job("j")], [NodeLeave(30.0, "n0")], on_node_loss="fail")
    assert res.jobs[0].state == "failed" and res.jobs[0].finish == pytest.approx(30.0)


def test_job_waits_for_a_node_to_join_again():
    events = [NodeLeave(30.0, "n0"), NodeJoin(60.0, "n0")]
    res = run(one_switch([1.0]), [solo_job("j")], events, restart_overhead_s=5.0)
    js = res.jobs[0]
    assert js.wait(res.end_time) == pytest.approx(30.0)
    assert js.finish == pytest.approx(60 + 5 + 70)
    assert js.attained == pytest.approx(30 + 75)  # workers × seconds run, overhead included


def test_job_that_can_never_fit_is_rejected_and_blocks_nobody():
    jobs = [solo_job("huge", 0.0, cpu=4.0), solo_job("ok", 1.0)]
    res = run(one_switch([1.0, 1.0]), jobs, policy=Fifo(make_algorithm("first-fit")))
    by = {js.name: js for js in res.jobs}
    assert by["huge"].state == "rejected" and by["ok"].first_start == pytest.approx(1.0)
    assert res.summary()["rejected"] == 1


def test_until_stops_simulated_time():
    res = run(one_switch([1.0]), [solo_job("a"), solo_job("b")], until=150.0)
    assert res.end_time == 150.0
    s = res.summary()
    assert s["finished"] == 1 and s["unfinished"] == 1
    assert s["max_wait_s"] == pytest.approx(100.0)  # b waits from 0 until it starts at 100


def test_iterations_are_required():
    with pytest.raises(ValueError, match="iterations"):
        run(one_switch([1.0]), [replace(solo_job("a"), iterations=None)])


def test_round_holds_keep_resources_for_their_owner():
    from scheduler.rounds import JobState

    cluster = one_switch([1.0, 1.0])
    owner, other = (
        JobState(solo_job("owner"), 0, "queued"),
        JobState(solo_job("other"), 1, "queued"),
    )
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), [owner, other], [])
    rnd.hold(owner, Decision("owner", {"w0": "n0"}, []))
    assert rnd.view(other).free("n0") == Resources(0, 924)
    assert rnd.try_place(other).placement == {"w0": "n1"}
    assert rnd.try_place(owner).placement == {"w0": "n0"}
    assert [js.name for js in rnd.placed] == ["other", "owner"]


# --- reproducibility -------------------------------------------------------------------------------


def test_same_seed_same_run_different_seed_different_run():
    cluster = Cluster.from_topology(load_topology("campus"))
    spec = parse_arrivals("bursty:n=60,load=0.7,tidal=1,background=30,day_s=20000")
    a = run_policy("fifo-backfill", cluster, spec, seed=7, algorithm="random")
    b = run_policy("fifo-backfill", cluster, spec, seed=7, algorithm="random")
    c = run_policy("fifo-backfill", cluster, spec, seed=8, algorithm="random")
    for key in ("schedule_digest", "avg_wait_s", "jct_s", "balance_std", "bw_satisfaction"):
        assert a[key] == b[key]
    assert a["schedule_digest"] != c["schedule_digest"]
    assert a["finished"] == 60


def test_nominal_iteration_uses_speed_one_and_demanded_rates():
    job = pair_job()
    # compute 0.1 s on 1 core + 1 MB at 100 Mbit/s × efficiency, plus the custom graph's one
    # round (every flow sent at once).
    from scheduler.perfmodel import IterationModel

    m = IterationModel()
    comm = 1e6 * 8 / (min(100 * m.efficiency, m.max_rate_mbps) * 1e6) + m.per_message_latency_s
    assert estimated_iteration_s(job) == pytest.approx(0.1 + comm)


def test_balance_and_utilisation_are_time_averages_over_online_nodes():
    # n0 runs one task (all its cpu, 100 of 1024 MB) for 100 s while n1 idles; then, from 100 s
    # to 200 s, n1 runs it alone after n0 has left (restart overhead 0).
    u = (1.0 + 100 / 1024) / 2  # Ū_n of the busy node: mean of its cpu and memory shares
    res = run(one_switch([1.0, 1.0]), [solo_job("j", iterations=100)], restart_overhead_s=0.0)
    assert res.balance_std == pytest.approx(u / 2) and res.utilisation == pytest.approx(u / 2)
    res = run(
        one_switch([1.0, 1.0]),
        [solo_job("j", iterations=200)],
        [NodeLeave(100.0, "n0")],
        restart_overhead_s=0.0,
    )
    assert res.end_time == pytest.approx(200.0)
    # first half: two online nodes (std u/2, mean u/2); second half: n1 alone (std 0, mean u)
    assert res.balance_std == pytest.approx((u / 2) / 2)
    assert res.utilisation == pytest.approx((u / 2 + u) / 2)


def test_balance_while_jobs_arrive_stops_at_the_last_arrival():
    # j runs on n0 from 0 to 200 s; k arrives at 100 s and runs on n1 to 200 s.
    u = (1.0 + 100 / 1024) / 2
    res = run(
        one_switch([1.0, 1.0]),
        [solo_job("j", iterations=200), solo_job("k", submit=100.0, iterations=100)],
    )
    assert res.end_time == pytest.approx(200.0)
    assert res.balance_std_arrivals == pytest.approx(u / 2)  # [0, 100]: n0 busy, n1 idle
    assert res.balance_std == pytest.approx(u / 4)  # then both busy: std 0
    # One arrival: no window of its own, the whole run's average.
    res = run(one_switch([1.0, 1.0]), [solo_job("j", iterations=100)])
    assert res.balance_std_arrivals == res.balance_std == pytest.approx(u / 2)


def test_balance_while_jobs_wait_covers_only_the_time_with_a_queue():
    # j runs on n0 from 0 to 300 s, k on n1 from 0 to 100 s; l waits for k and runs on n1 from
    # 100 to 200 s. Queued only in [0, 100), both nodes busy (std 0); in [200, 300) n0 runs alone.
    u = (1.0 + 100 / 1024) / 2
    res = run(
        one_switch([1.0, 1.0]),
        [solo_job("j", iterations=300), solo_job("k"), solo_job("l", submit=1.0)],
        restart_overhead_s=0.0,
    )
    assert res.end_time == pytest.approx(300.0)
    assert res.queued_share == pytest.approx(99 / 300)
    assert res.balance_std_queued == pytest.approx(0.0)
    assert res.balance_std == pytest.approx((u / 2) * 100 / 300)
    assert res.summary()["balance_std_queued"] == res.balance_std_queued
    # Nothing ever waits: no figure rather than a zero that reads as perfect balance.
    res = run(one_switch([1.0, 1.0]), [solo_job("j")])
    assert res.balance_std_queued is None and res.queued_share == 0.0


def test_a_hold_lets_jobs_done_before_its_owner_starts_backfill():
    from scheduler.rounds import JobState

    cluster = one_switch([1.0])
    owner = JobState(solo_job("owner"), 0, "queued")
    short, long = (
        JobState(solo_job("short", iterations=50), 1, "queued"),
        JobState(solo_job("long", iterations=500), 2, "queued"),
    )
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), [owner, long, short], [])
    rnd.hold(owner, Decision("owner", {"w0": "n0"}, []), until=60.0)  # owner expected at 60 s
    assert rnd.try_place(long) is None  # 500 s: would delay the owner
    assert rnd.try_place(short).placement == {"w0": "n0"}  # done after 50 s
