"""The iteration-time model's phases (`perfmodel.collective_phases`): a star's gradients go up
and only then the average down, a tree's sums go up level by level and the average comes down
the same way, so their phases add up; a ring, an all-to-all and a custom graph are one phase of
parallel flows, predicted as before. (That the phases follow the worker's own order of messages
is checked in test_workload_collectives.py.)"""

from __future__ import annotations

import pytest

from scheduler.jobs import all_to_all_job, ring_job, star_job, tree_job
from scheduler.metrics import predicted_iteration_s
from scheduler.model import Cluster, Decision, FlowAssignment, Job, Resources
from scheduler.perfmodel import (
    BACKWARD_SHARE,
    IterationModel,
    collective_phases,
    collective_steps,
    overlapped_s,
)
from scheduler.rounds import estimated_iteration_s
from topologies import parse_topology

M = 4e6  # bytes of gradients
MBPS = 100.0
MODEL = IterationModel()
R = Resources(0.5, 100)


def ranked(job: Job) -> list[tuple[int, int, tuple[int, int]]]:
    """The job's flows as (src rank, dst rank, item), the item the pair of ranks itself."""
    rank = {t.name: r for r, t in enumerate(job.tasks)}
    return [(rank[f.src], rank[f.dst], (rank[f.src], rank[f.dst])) for f in job.flows]


def phases_of(job: Job) -> list[set[tuple[int, int]]]:
    return [set(p) for p in collective_phases(job.collective, ranked(job))]


def one_switch(n: int) -> Cluster:
    doc = {
        "switches": [{"name": "s"}],
        "nodes": [{"name": f"n{i}", "cpu": 1, "mem_mb": 1024} for i in range(n)],
        "links": [{"ends": [f"n{i}", "s"], "bw_mbps": 1000} for i in range(n)],
    }
    return Cluster.from_topology(parse_topology(doc, "one-switch"))


def spread(cluster: Cluster, job: Job, rate_of=lambda f: MBPS) -> Decision:
    """Every task on its own node, every flow at `rate_of(flow)`."""
    placement = {t.name: f"n{i}" for i, t in enumerate(job.tasks)}
    flows = [
        FlowAssignment(f.src, f.dst, (placement[f.src], "s", placement[f.dst]), rate_of(f))
        for f in job.flows
    ]
    return Decision(job.name, placement, flows)


def single_phase_s(job: Job, rates: list[float]) -> float:
    """The model before the phases: every flow at once, the slowest one."""
    flows = [(f.bytes_per_iter, r) for f, r in zip(job.flows, rates)]
    return MODEL.communication_s(flows, steps=collective_steps(job.collective, len(job.tasks)))


def test_a_star_sends_every_gradient_up_then_the_average_down():
    job = star_job("s", 3, R, M, MBPS)  # ps is rank 0, w_i rank i + 1
    assert phases_of(job) == [{(1, 0), (2, 0), (3, 0)}, {(0, 1), (0, 2), (0, 3)}]
    # up, then down: each phase one flow's time, twice the old single phase's transfer
    per_flow = M * 8 / (MBPS * MODEL.efficiency * 1e6)
    latency = 2 * MODEL.per_message_latency_s
    assert estimated_iteration_s(job, MODEL) == pytest.approx(2 * per_flow + latency)
    old = single_phase_s(job, [MBPS] * len(job.flows))
    assert old == pytest.approx(per_flow + latency)
    cluster = one_switch(len(job.tasks))
    assert predicted_iteration_s(cluster, job, spread(cluster, job)) == pytest.approx(
        2 * per_flow + latency
    )
    # the phases' slowest flows add: a slow up-flow and a slow down-flow of different workers
    slow = {("w0", "ps"): 50.0, ("ps", "w2"): 25.0}
    decision = spread(cluster, job, lambda f: slow.get((f.src, f.dst), MBPS))
    assert predicted_iteration_s(cluster, job, decision) == pytest.approx(
        M * 8 / (50 * MODEL.efficiency * 1e6) + M * 8 / (25 * MODEL.efficiency * 1e6) + latency
    )


def test_the_star_server_is_the_end_every_flow_shares_wherever_it_is():
    """(The Alibaba trace's jobs list their ps wherever the trace has it.)"""
    flows = [(1, 2, "up0"), (2, 1, "down0"), (0, 2, "up1"), (2, 0, "down1")]
    assert collective_phases("star", flows) == [["up0", "up1"], ["down0", "down1"]]
    assert collective_phases("star", [(3, 0, "down")]) == [["down"]]
    with pytest.raises(ValueError, match="share no end"):
        collective_phases("star", [(1, 0, "a"), (2, 3, "b")])


@pytest.mark.parametrize(
    "workers, levels",
    [
        (4, [{(3, 1)}, {(1, 0), (2, 0)}]),
        (7, [{(3, 1), (4, 1), (5, 2), (6, 2)}, {(1, 0), (2, 0)}]),
    ],
)
def test_a_tree_goes_up_level_by_level_and_down_the_same_way(workers, levels):
    job = tree_job("t", workers, R, M, MBPS)
    depth = workers.bit_length() - 1
    assert len(levels) == depth
    down = [{(d, s) for s, d in level} for level in reversed(levels)]
    assert phases_of(job) == levels + down
    per_level = M * 8 / (MBPS * MODEL.efficiency * 1e6)
    latency = collective_steps("tree", workers) * MODEL.per_message_latency_s
    assert estimated_iteration_s(job, MODEL) == pytest.approx(2 * depth * per_level + latency)
    cluster = one_switch(workers)
    assert predicted_iteration_s(cluster, job, spread(cluster, job)) == pytest.approx(
        2 * depth * per_level + latency
    )
    assert single_phase_s(job, [MBPS] * len(job.flows)) == pytest.approx(per_level + latency)


def test_a_flow_off_the_tree_is_an_error():
    with pytest.raises(ValueError, match="not an edge of the tree"):
        collective_phases("tree", [(3, 0, None)])
    with pytest.raises(ValueError, match="unknown collective"):
        collective_phases("mesh", [])


@pytest.mark.parametrize(
    "job",
    [
        ring_job("r", 4, R, M, MBPS),
        all_to_all_job("a", 4, R, M, MBPS),
        Job("c", ring_job("x", 3, R, M, MBPS).tasks, ring_job("x", 3, R, M, MBPS).flows, "custom"),
    ],
    ids=["ring", "all-to-all", "custom"],
)
def test_one_phase_collectives_are_predicted_as_before_to_the_bit(job):
    assert collective_phases(job.collective, ranked(job)) == [[x for *_, x in ranked(job)]]
    rates = [MBPS * (1 + i) / len(job.flows) for i in range(len(job.flows))]
    compute = [0.1] * len(job.tasks)
    assert MODEL.iteration_s(compute, list(zip((f.bytes_per_iter for f in job.flows), rates))) == (
        0.1 + MODEL.communication_s([(f.bytes_per_iter, r) for f, r in zip(job.flows, rates)])
    )
    cluster = one_switch(len(job.tasks))
    rate = dict(zip(((f.src, f.dst) for f in job.flows), rates))
    decision = spread(cluster, job, lambda f: rate[f.src, f.dst])
    assert predicted_iteration_s(cluster, job, decision) == single_phase_s(job, rates)


# --- DDP's overlap of a ring's all-reduce with the backward pass (perfmodel.overlapped_s) -------
@pytest.mark.parametrize("buckets", [(), (45e6,)])
def test_one_bucket_overlaps_nothing(buckets):
    assert overlapped_s(2.0, 3.0, buckets) == 5.0


@pytest.mark.parametrize(
    "compute, comm, buckets",
    [(2.83, 2.8, (9.46e6, 26.49e6, 8.74e6)), (0.02, 0.5, (8.43e6, 0.53e6)), (1.0, 0.1, (1, 1, 1))],
)
def test_overlap_hides_at_most_the_buckets_before_the_last_under_the_backward_pass(
    compute, comm, buckets
):
    """Never less than the compute plus the last bucket's share of the all-reduce (it starts once
    the backward pass is over), nor than the all-reduce after the forward pass; never more than
    compute and all-reduce one after the other."""
    t = overlapped_s(compute, comm, buckets)
    last = comm * buckets[-1] / sum(buckets)
    forward = compute * (1 - BACKWARD_SHARE)
    assert max(compute + last, forward + comm) - 1e-12 <= t < compute + comm


def test_a_backward_pass_slower_than_the_network_leaves_only_the_last_bucket():
    """Buckets whose all-reduce ends before the next is produced: the iteration is the compute
    and the last bucket's all-reduce."""
    assert overlapped_s(3.0, 0.3, (1, 1, 1)) == pytest.approx(3.0 + 0.1)


def test_a_rings_buckets_shorten_its_prediction_and_other_collectives_ignore_them():
    cluster = one_switch(3)
    ring = ring_job("r", 3, R, M, MBPS, compute_s=1.0)
    bucketed = ring_job("r", 3, R, M, MBPS, compute_s=1.0, ddp_buckets=(M / 2, M / 2))
    decision = spread(cluster, ring)
    plain = predicted_iteration_s(cluster, ring, decision)
    assert predicted_iteration_s(cluster, bucketed, decision) < plain
    assert estimated_iteration_s(bucketed) < estimated_iteration_s(ring)
