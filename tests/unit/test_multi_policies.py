"""CES-Multi (window, scores, ageing, backfilling, reservation) and the queue baselines on
hand-built queues; starvation under a stream of small jobs; reproducibility; the evaluation."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from scheduler import baselines
from scheduler.arrivals import parse_arrivals
from scheduler.baselines import make_algorithm
from scheduler.evaluate import evaluate_multi, multi_table, run_policy
from scheduler.jobs import custom_job
from scheduler.model import Cluster, Decision, FlowAssignment, Job, LogicalFlow, Resources, Task
from scheduler.multi import (
    BEST_HEURISTIC,
    POLICIES,
    BalancedChoice,
    CesMulti,
    Edf,
    FifoBackfill,
    Las,
    MultiConfig,
    Sjf,
    default_algorithm,
    shortness,
)
from scheduler.rounds import JobState, Round
from scheduler.simulator import Simulator
from topologies import load_topology, parse_topology


def cluster_of(
    cpus: list[float], mem_mb: int = 1024, bw: float = 100.0, speeds: list[float] | None = None
) -> Cluster:
    speeds = speeds or [1.0] * len(cpus)
    doc = {
        "switches": [{"name": "s"}],
        "nodes": [
            {"name": f"n{i}", "cpu": c, "mem_mb": mem_mb, "speed": v}
            for i, (c, v) in enumerate(zip(cpus, speeds))
        ],
        "links": [{"ends": [f"n{i}", "s"], "bw_mbps": bw} for i in range(len(cpus))],
    }
    return Cluster.from_topology(parse_topology(doc, "test"))


def job(
    name: str,
    cpu: float = 0.5,
    mem: float = 100,
    tasks: int = 1,
    iterations: int = 100,
    priority: int = 0,
    submit: float = 0.0,
    deadline: float | None = None,
) -> Job:
    """`tasks` workers without flows; one iteration takes 1 s on a speed-1 node."""
    return custom_job(
        name,
        [Task(f"w{i}", Resources(cpu, mem)) for i in range(tasks)],
        [],
        compute_s=cpu,
        iterations=iterations,
        priority=priority,
        submit_time=submit,
        deadline=deadline,
    )


def queued(j: Job, seq: int, since: float = 0.0) -> JobState:
    return JobState(j, seq, "queued", queued_since=since)


def ces(window: int = 16, **kw) -> CesMulti:
    return CesMulti(make_algorithm("first-fit"), MultiConfig(window=window, **kw))


def names(states) -> list[str]:
    return [js.name for js in states]


# --- CES-Multi on hand-built queues --------------------------------------------------------------


@pytest.mark.parametrize("window, placed", [(2, []), (3, ["small"])])
def test_the_window_bounds_how_far_backfilling_looks(window, placed):
    q = [
        queued(job("big1", cpu=1.5), 0),
        queued(job("big2", cpu=1.5), 1),
        queued(job("small", cpu=0.5), 2),
    ]
    rnd = Round(0.0, cluster_of([1.0]), make_algorithm("first-fit"), q, [])
    ces(window).schedule(rnd)
    assert names(rnd.placed) == placed


@pytest.mark.parametrize("backfill, placed", [(False, []), (True, ["small"])])
def test_without_backfilling_the_round_stops_at_the_best_job_that_does_not_fit(backfill, placed):
    # big1 waited longest: it scores best (wait and aged priority) but does not fit.
    q = [queued(job("big1", cpu=1.5), 0, since=-100.0), queued(job("small", cpu=0.5), 1)]
    rnd = Round(0.0, cluster_of([1.0]), make_algorithm("first-fit"), q, [])
    ces(backfill=backfill).schedule(rnd)
    assert names(rnd.placed) == placed


# Demand shares (cpu, mem, bandwidth; no gpu in the cluster) of the cluster, all of it free:
# a = (0.5, 0, 0), b = (0.25, 0.5, 0).
@pytest.mark.parametrize(
    "kind, fit_a, fit_b",
    [
        ("align", 0.5 / (0.5 * math.sqrt(3)), 0.75 / (math.hypot(0.25, 0.5) * math.sqrt(3))),
        ("headroom", 1 - 0.5, 1 - 0.5),
    ],
)  # 1 - the largest share of the free resources asked
def test_scores_are_fit_plus_aged_priority_plus_wait(kind, fit_a, fit_b):
    cfg = dict(a_fit=1.0, b_priority=0.5, c_wait=1.0, d_short=0.0, age_every_s=3600.0, fit=kind)
    a = queued(job("a", cpu=2.0, mem=0), 0, since=-7200.0)  # priority 0, waited 2 h: aged to 2
    b = queued(job("b", cpu=1.0, mem=500, priority=2), 1)
    rnd = Round(0.0, cluster_of([4.0], mem_mb=1000), make_algorithm("first-fit"), [a, b], [])
    scores = ces(**cfg).scores(rnd, [a, b])
    assert scores[a] == pytest.approx(fit_a + 0.5 * 1.0 + 1.0)
    assert scores[b] == pytest.approx(fit_b + 0.5 * 1.0 + 0.0)


def test_fit_is_zero_for_a_job_that_cannot_fit_and_follows_its_kind():
    cluster = cluster_of([4.0], mem_mb=1000)
    cluster.used["n0"] = Resources(0.0, 900.0)  # memory nearly gone, cpu free
    cpu_heavy = queued(job("cpu", cpu=2.0, mem=50), 0)
    mem_heavy = queued(job("mem", cpu=0.25, mem=90), 1)
    too_big = queued(job("big", cpu=5.0), 2)
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), [cpu_heavy, mem_heavy, too_big], [])
    s = ces(a_fit=1.0, b_priority=0.0, c_wait=0.0, d_short=0.0, fit="align").scores(rnd, rnd.queue)
    assert s[too_big] == 0.0
    assert s[cpu_heavy] > s[mem_heavy] > 0
    s = ces(a_fit=1.0, b_priority=0.0, c_wait=0.0, d_short=0.0, fit="headroom").scores(
        rnd, rnd.queue
    )
    assert s[too_big] == 0.0
    assert s[cpu_heavy] == pytest.approx(1 - 2.0 / 4.0)  # half the free cpu
    assert s[mem_heavy] == pytest.approx(1 - 90 / 100)  # 90 % of the free memory


def test_priority_ageing_lets_a_long_waiting_job_overtake_a_higher_priority_one():
    old = queued(job("old", cpu=1.0, priority=0), 0, since=-2.5 * 3600)
    vip = queued(job("vip", cpu=1.0, priority=2), 1)
    policy = ces(a_fit=0.0, b_priority=1.0, c_wait=0.0, age_every_s=3600.0, reservation=False)
    rnd = Round(0.0, cluster_of([1.0]), make_algorithm("first-fit"), [old, vip], [])
    policy.schedule(rnd)
    assert names(rnd.placed) == ["old"]
    young = queued(job("young", cpu=1.0, priority=0), 0, since=-1.5 * 3600)
    vip2 = queued(job("vip", cpu=1.0, priority=2), 1)
    rnd = Round(0.0, cluster_of([1.0]), make_algorithm("first-fit"), [young, vip2], [])
    policy.schedule(rnd)
    assert names(rnd.placed) == ["vip"]


@pytest.mark.parametrize(
    "link, busy, min_share, placed",
    [
        (100.0, 90.0, 0.5, []),  # other traffic leaves it 10 of the 100 its links carry: wait
        (100.0, 90.0, 0.05, ["pair"]),
        (10.0, 0.0, 0.5, ["pair"]),  # the links themselves carry only 10: waiting would not help
    ],
)
def test_a_start_left_too_little_bandwidth_by_other_jobs_is_deferred(link, busy, min_share, placed):
    cluster = cluster_of([2.0, 2.0], bw=link)
    if busy:
        other = custom_job(
            "other",
            [Task("a", Resources(0.5, 100)), Task("b", Resources(0.5, 100))],
            [LogicalFlow("a", "b", busy, 1e6)],
            compute_s=0.1,
            iterations=10,
        )
        cluster.allocate(
            other,
            Decision(
                "other", {"a": "n0", "b": "n1"}, [FlowAssignment("a", "b", ("n0", "s", "n1"), busy)]
            ),
        )
    # Two 1-cpu workers on the two nodes (first-fit fills n0 first), asking 100 Mbit/s.
    pair = custom_job(
        "pair",
        [Task("w0", Resources(1.5, 100)), Task("w1", Resources(1.5, 100))],
        [LogicalFlow("w0", "w1", 100.0, 1e6)],
        compute_s=0.1,
        iterations=10,
    )
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), [queued(pair, 0)], [])
    ces(min_bw_share=min_share).schedule(rnd)
    assert names(rnd.placed) == placed


def stream(reservation: bool, policy_name: str = "ces-multi", reserve_preempts: bool = True):
    """Two 1-cpu nodes; a 0.5-cpu, 100 s job every 30 s for 5000 s keeps both nodes busy; a job
    that needs both whole nodes arrives at t = 5. No shortest-first preemption: the reservation
    alone (enforced by preemption, or held until the nodes drain)."""
    small = [job(f"s{i:03d}", cpu=0.5, submit=30.0 * i) for i in range(167)]
    big = job("big", cpu=1.0, tasks=2, iterations=50, submit=5.0)
    algo = make_algorithm("first-fit")
    policy = (
        CesMulti(
            algo,
            MultiConfig(
                reservation=reservation,
                reserve_after_s=300.0,
                preempt_ratio=None,
                reserve_preempts=reserve_preempts,
            ),
        )
        if policy_name == "ces-multi"
        else FifoBackfill(algo)
    )
    res = Simulator(cluster_of([1.0, 1.0]), policy).run(small + [big])
    return {js.name: js for js in res.jobs}, res


# Past the threshold the big job starts at the next round (one every 30 s at least) by
# preempting, or once the nodes drained (the longest small job, 100 s, then that round).
@pytest.mark.parametrize("reserve_preempts, late", [(True, 30.0), (False, 100.0 + 30.0)])
def test_the_reservation_ends_starvation_under_a_stream_of_small_jobs(reserve_preempts, late):
    by, res = stream(reservation=True, reserve_preempts=reserve_preempts)
    assert all(js.state == "finished" for js in by.values())
    big_wait = by["big"].wait(res.end_time)
    assert 300.0 <= big_wait <= 300.0 + late
    # the small jobs it preempts wait for it (50 s) and its restart at most
    assert max(js.wait(res.end_time) for n, js in by.items() if n != "big") <= 300.0
    assert (sum(js.preemptions for js in by.values()) > 0) == reserve_preempts


@pytest.mark.parametrize("policy_name", ["ces-multi", "fifo-backfill"])
def test_without_the_reservation_the_big_job_starves_until_the_stream_ends(policy_name):
    by, _res = stream(reservation=False, policy_name=policy_name)
    assert by["big"].first_start > 166 * 30.0  # only after the last small job arrived


def test_reservation_holds_the_shadow_placement_and_keeps_it():
    # n0 runs a job ending at 100, n1 one ending at 500: the starving 1-cpu job is held on n0.
    cluster = cluster_of([1.0, 1.0])
    algo = make_algorithm("first-fit")
    running = []
    for i, end in enumerate((100.0, 500.0)):
        r = JobState(job(f"r{i}", cpu=1.0), i, "running", expected_end=end)
        cluster.allocate(r.job, Decision(r.name, {"w0": f"n{i}"}, []))
        running.append(r)
    starving = queued(job("starving", cpu=1.0), 2, since=-1000.0)
    fresh = queued(job("fresh", cpu=1.0), 3)
    policy = ces(reserve_after_s=600.0, reserve_preempts=False, preempt_ratio=None)
    rnd = Round(0.0, cluster, algo, [starving, fresh], running)
    policy.schedule(rnd)
    held, shadow_time = policy.reserved[starving]
    assert rnd.placed == [] and held.placement == {"w0": "n0"} and shadow_time == 100.0
    cluster.release("r0")  # n0 drains; "fresh" may not take it
    rnd = Round(100.0, cluster, algo, [starving, fresh], running[1:], epoch=1)
    policy.schedule(rnd)
    assert names(rnd.placed) == ["starving"] and rnd.placed[0].decision.placement == {"w0": "n0"}
    assert policy.reserved == {}


@pytest.mark.parametrize("reserve_preempts, preempted", [(True, ["b"]), (False, [])])
def test_a_reservation_preempts_the_least_served_job_that_has_not_starved(
    reserve_preempts, preempted
):
    # a has run 500 cpu-s, b 10, c none but starved once itself: b makes room for the job.
    cluster = cluster_of([1.0, 1.0, 1.0])
    algo = make_algorithm("first-fit")
    running = []
    for i, (name, attained, waited) in enumerate(
        [("a", 500.0, 0.0), ("b", 10.0, 0.0), ("c", 0.0, 7200.0)]
    ):
        r = JobState(
            job(name, cpu=1.0, iterations=1000), i, "running", attained=attained, waited_s=waited
        )
        cluster.allocate(r.job, Decision(name, {"w0": f"n{i}"}, []))
        running.append(r)
    starving = queued(job("starving", cpu=1.0), 3, since=-1000.0)
    policy = ces(reserve_after_s=600.0, reserve_preempts=reserve_preempts, preempt_ratio=None)
    rnd = Round(0.0, cluster, algo, [starving], running)
    policy.schedule(rnd)
    assert names(rnd.preempted) == preempted
    if reserve_preempts:
        assert (
            names(rnd.placed) == ["starving"]
            and rnd.placed[0].decision.placement == {"w0": "n1"}
            and policy.reserved == {}
        )
    else:
        assert rnd.placed == [] and starving in policy.reserved


def test_shortness_ranks_the_window_by_nominal_remaining_run_time():
    jobs = [
        queued(job(n, cpu=1.0, iterations=it), i)
        for i, (n, it) in enumerate([("long", 900), ("short", 5), ("mid", 50), ("mid2", 50)])
    ]
    assert {js.name: v for js, v in shortness(jobs).items()} == {
        "short": 1.0,
        "mid": pytest.approx(2 / 3),
        "mid2": pytest.approx(2 / 3),
        "long": 0.0,
    }
    rnd = Round(0.0, cluster_of([1.0]), make_algorithm("first-fit"), jobs, [])
    scores = ces(b_priority=0.0, c_wait=0.0, d_short=2.0).scores(rnd, jobs)
    assert scores[jobs[1]] == pytest.approx(2.0) and scores[jobs[0]] == 0.0
    ces(b_priority=0.0, c_wait=0.0, d_short=2.0).schedule(rnd)
    assert names(rnd.placed) == ["short"]


@pytest.mark.parametrize(
    "ratio, runner_iters, runner_waited, preempted, runner_end",
    [
        (None, 1000, 0.0, False, math.inf),  # preemption off
        (2.0, 1000, 0.0, True, math.inf),  # 1000 s left vs 10 s: make room
        (2.0, 15, 0.0, False, math.inf),  # 15 s left < 2 × 10 s: let it finish
        (2.0, 1000, 7200.0, False, math.inf),  # it starved once already: never preempted
        (2.0, 15, 0.0, True, 1000.0),  # 15 s nominally, but at its pace 1000 s are left
        (2.0, 1000, 0.0, False, 15.0),
    ],
)  # ... and the other way round
def test_ces_multi_preempts_much_longer_jobs_for_a_short_one(
    ratio, runner_iters, runner_waited, preempted, runner_end
):
    cluster = cluster_of([1.0])
    algo = make_algorithm("first-fit")
    r = JobState(
        job("runner", cpu=1.0, iterations=runner_iters),
        0,
        "running",
        waited_s=runner_waited,
        expected_end=runner_end,
    )
    cluster.allocate(r.job, Decision("runner", {"w0": "n0"}, []))
    short = queued(job("short", cpu=1.0, iterations=10), 1)
    rnd = Round(0.0, cluster, algo, [short], [r])
    ces(preempt_ratio=ratio, reserve_after_s=3600.0).schedule(rnd)
    assert (names(rnd.preempted), names(rnd.placed)) == (
        (["runner"], ["short"]) if preempted else ([], [])
    )


@pytest.mark.parametrize(
    "guard, cpus, placed_on",
    [
        (0.05, [2.0, 2.0], "n1"),  # n0 is crowded: the start goes to n1, not first-fit's n0
        (None, [2.0, 2.0], "n0"),  # guard off: first-fit's choice
        (0.05, [2.0, 0.5], "n0"),
    ],
)  # only the crowded node has room: it takes the job all the same
def test_the_balance_guard_keeps_starts_off_crowded_nodes_while_others_have_room(
    guard, cpus, placed_on
):
    cluster = cluster_of(cpus)
    for i, used in enumerate((1.5, 0.25)):  # Ū: n0 0.42; n1 0.11 (2 cpu) or 0.30 (0.5 cpu)
        bg = job(f"bg{i}", cpu=used)
        cluster.allocate(bg, Decision(bg.name, {"w0": f"n{i}"}, []))
    new = queued(job("new", cpu=0.5), 0)
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), [new], [])
    ces(balance_guard=guard, spread_tolerance=None).schedule(rnd)
    assert names(rnd.placed) == ["new"] and rnd.placed[0].decision.placement == {"w0": placed_on}


@pytest.mark.parametrize(
    "speed, tolerance, placed_on",
    [
        (1.0, 0.0, "n1"),  # as fast and more even: the spreader's placement
        (0.5, 0.5, "n0"),  # the spreader's node is twice as slow: beyond the tolerance
        (0.5, 1.0, "n1"),
    ],
)  # ... within it
def test_balanced_choice_takes_the_spreaders_placement_when_it_costs_little(
    speed, tolerance, placed_on
):
    cluster = cluster_of([2.0, 2.0], speeds=[1.0, speed])
    bg = job("bg", cpu=1.0)
    cluster.allocate(bg, Decision(bg.name, {"w0": "n0"}, []))
    algo = BalancedChoice(make_algorithm("first-fit"), make_algorithm("k8s-spread"), tolerance)
    assert algo.place(cluster, job("new", cpu=0.5)).placement == {"w0": placed_on}


@pytest.mark.parametrize(
    "tolerance, queued_jobs, placed_on",
    [
        (0.5, 1, "n1"),  # a short queue: the even placement
        (0.5, 3, "n0"),  # more than spread_queue jobs waiting: no spreading, first-fit's
        (None, 1, "n0"),
    ],
)  # off
def test_ces_multi_spreads_only_while_the_queue_is_short(tolerance, queued_jobs, placed_on):
    cluster = cluster_of([2.0, 2.0])
    bg = job("bg", cpu=1.0)
    cluster.allocate(bg, Decision(bg.name, {"w0": "n0"}, []))
    q = [queued(job(f"j{i}", cpu=0.5), i) for i in range(queued_jobs)]
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), q, [])
    ces(spread_tolerance=tolerance, spread_queue=2, balance_guard=None).schedule(rnd)
    assert rnd.placed[0].decision.placement == {"w0": placed_on}


@pytest.mark.parametrize(
    "lookahead, runner_end, placed",
    [
        (1, 50.0, []),  # spread now over the 10 Mbit/s link: ~800 s; on n0 alone after 50 s: ~60 s
        (None, 50.0, ["pair"]),  # delay deployment off: it starts now, spread
        (1, 2000.0, ["pair"]),  # the runner ends after the pair would have finished spread
    ],
)
def test_delay_deployment_waits_when_a_job_ending_soon_frees_a_better_placement(
    lookahead, runner_end, placed
):
    cluster = cluster_of([2.0, 1.0], bw=10.0)
    runner = JobState(job("runner", cpu=1.0, iterations=50), 0, "running", expected_end=runner_end)
    cluster.allocate(runner.job, Decision("runner", {"w0": "n0"}, []))
    # first-fit puts w0 on n0 (1 cpu free) and w1 on n1: 1e7 bytes an iteration over 10 Mbit/s
    pair = custom_job(
        "pair",
        [Task("w0", Resources(1.0, 100)), Task("w1", Resources(1.0, 100))],
        [LogicalFlow("w0", "w1", 100.0, 1e7)],
        compute_s=0.1,
        iterations=100,
    )
    rnd = Round(0.0, cluster, make_algorithm("first-fit"), [queued(pair, 1)], [runner])
    ces(delay_lookahead=lookahead, spread_tolerance=None, balance_guard=None).schedule(rnd)
    assert names(rnd.placed) == placed and not rnd.preempted
    if not placed:
        assert rnd.queue[0].why == "the queue policy did not accept the placement found"


@pytest.mark.parametrize("holds, filler_on", [(True, "n1"), (False, "n0")])
def test_a_job_that_waits_holds_the_placement_it_waits_for(holds, filler_on):
    cluster = cluster_of([2.0, 1.0], bw=10.0)
    runner = JobState(job("runner", cpu=1.0, iterations=50), 0, "running", expected_end=50.0)
    cluster.allocate(runner.job, Decision("runner", {"w0": "n0"}, []))
    pair = custom_job(
        "pair",
        [Task("w0", Resources(1.0, 100)), Task("w1", Resources(1.0, 100))],
        [LogicalFlow("w0", "w1", 100.0, 1e7)],
        compute_s=0.1,
        iterations=100,
    )
    filler = job("filler", cpu=1.0, iterations=1000)  # runs past the runner's end
    rnd = Round(
        0.0, cluster, make_algorithm("first-fit"), [queued(pair, 1), queued(filler, 2)], [runner]
    )
    policy = ces(delay_lookahead=1, delay_holds=holds, spread_tolerance=None, balance_guard=None)
    policy.schedule(rnd)
    # the pair waits for n0 whole; held, the filler may not take n0's free core meanwhile
    assert names(rnd.placed) == ["filler"]
    assert rnd.placed[0].decision.placement == {"w0": filler_on}
    assert names(policy.awaiting) == (["pair"] if holds else [])
    if holds:  # held until the runner's expected end
        held, until = policy.awaiting[rnd.queue[0]]
        assert held.placement == {"w0": "n0", "w1": "n0"} and until == 50.0


def test_bad_spreading_knobs_are_named():
    with pytest.raises(ValueError, match="spread_tolerance"):
        MultiConfig(spread_tolerance=-0.1)
    with pytest.raises(ValueError, match="delay_lookahead"):
        MultiConfig(delay_lookahead=0)
    with pytest.raises(ValueError, match="spread_queue"):
        MultiConfig(spread_queue=-1)
    with pytest.raises(ValueError, match="spreader: unknown algorithm 'nope'"):
        CesMulti(make_algorithm("first-fit"), MultiConfig(spreader="nope"))


# --- baselines ------------------------------------------------------------------------------------


def test_sjf_starts_the_shortest_nominal_job_first():
    q = [
        queued(job("long", cpu=1.0, iterations=500), 0),
        queued(job("short", cpu=1.0, iterations=5), 1),
    ]
    rnd = Round(0.0, cluster_of([1.0]), make_algorithm("first-fit"), q, [])
    Sjf(make_algorithm("first-fit")).schedule(rnd)
    assert names(rnd.placed) == ["short"]


def test_edf_serves_the_earliest_admitted_deadline_and_demotes_hopeless_jobs():
    algo = make_algorithm("first-fit")
    q = [
        queued(job("none", cpu=1.0), 0),
        queued(job("late", cpu=1.0, deadline=10_000), 1),
        queued(job("soon", cpu=1.0, deadline=1_000), 2),
        queued(job("hopeless", cpu=1.0, deadline=50), 3),
    ]  # 100 s of work, 50 s deadline
    rnd = Round(0.0, cluster_of([1.0]), algo, q, [])
    Edf(algo).schedule(rnd)
    assert names(rnd.placed) == ["soon"]
    assert [js.admitted for js in q] == [False, True, True, False]
    rnd = Round(0.0, cluster_of([1.0]), algo, [q[0], q[1], q[3]], [], epoch=1)  # a new cluster
    Edf(algo).schedule(rnd)
    assert names(rnd.placed) == ["late"]


@pytest.mark.parametrize("attained, preempted", [(5000.0, True), (100.0, False)])
def test_las_preempts_only_jobs_of_lower_queues(attained, preempted):
    cluster = cluster_of([1.0])
    algo = make_algorithm("first-fit")
    r = JobState(job("runner", cpu=1.0), 0, "running", attained=attained)
    cluster.allocate(r.job, Decision("runner", {"w0": "n0"}, []))
    newcomer = queued(job("new", cpu=1.0), 1)
    rnd = Round(0.0, cluster, algo, [newcomer], [r])
    Las(algo, thresholds=(3600.0,)).schedule(rnd)
    assert (names(rnd.preempted), names(rnd.placed)) == (
        (["runner"], ["new"]) if preempted else ([], [])
    )


# --- selection of the single-job scheduler, reproducibility, the evaluation -------------------------


def test_default_switches_to_ces_ppo_when_it_can_be_built(monkeypatch):
    def no_checkpoint(**kw):
        raise FileNotFoundError("no checkpoint")

    monkeypatch.setitem(baselines.ALGORITHMS, "ces-ppo", no_checkpoint)
    default_algorithm.cache_clear()
    assert default_algorithm() == BEST_HEURISTIC
    monkeypatch.setitem(baselines.ALGORITHMS, "ces-ppo", baselines.ALGORITHMS["first-fit"])
    default_algorithm.cache_clear()
    assert default_algorithm() == "ces-ppo"
    default_algorithm.cache_clear()


@pytest.mark.parametrize("policy", ["ces-multi", "las", "edf"])
def test_same_seed_same_schedule(policy):
    cluster = Cluster.from_topology(load_topology("campus"))
    spec = parse_arrivals("poisson:n=80,load=1.5,tidal=1,day_s=30000")
    a = run_policy(policy, cluster, spec, seed=11, algorithm="random")
    b = run_policy(policy, cluster, spec, seed=11, algorithm="random")
    assert a == {**b, "events_per_s": a["events_per_s"], "decision_ms": a["decision_ms"]}
    assert (
        run_policy(policy, cluster, spec, seed=12, algorithm="random")["schedule_digest"]
        != a["schedule_digest"]
    )


def test_evaluate_multi_writes_the_documented_json(tmp_path):
    args = argparse.Namespace(
        topo="campus", arrivals="poisson:n=25,load=0.5", algos="all", seeds=2, single="first-fit"
    )
    result = evaluate_multi(args)
    assert list(result["algorithms"]) == list(POLICIES)
    for metrics in result["algorithms"].values():
        for key in (
            "avg_wait_s",
            "p95_wait_s",
            "max_wait_s",
            "jct_s",
            "bw_satisfaction",
            "balance_std",
            "fairness",
            "deadline_hit_rate",
        ):
            assert set(metrics[key]) == {"mean", "std"} and metrics[key]["mean"] is not None
        assert metrics["avg_wait_s"]["mean"] <= metrics["max_wait_s"]["mean"]
        assert 0 < metrics["fairness"]["mean"] <= 1
    json.dumps(result)
    table = multi_table(result)
    assert "ces-multi" in table and "edf" in table
    with pytest.raises(ValueError, match="unknown queue policy 'lifo'"):
        evaluate_multi(argparse.Namespace(**{**vars(args), "algos": "fifo,lifo"}))


def test_cli_multi_mode_writes_json_and_rejects_bad_input(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "multi.json"
    cmd = [
        sys.executable,
        "-m",
        "scheduler.evaluate",
        "--mode",
        "multi",
        "--topo",
        "campus",
        "--arrivals",
        "poisson:n=20,load=0.5",
        "--algos",
        "fifo,ces-multi",
        "--seeds",
        "1",
        "--single",
        "first-fit",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert list(json.loads(out.read_text())["algorithms"]) == ["fifo", "ces-multi"]
    assert "ces-multi" in done.stdout
    bad = subprocess.run(
        cmd[:7] + ["--arrivals", "poisson:load=many"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "load must be a number" in bad.stderr
    assert "Traceback" not in bad.stderr
