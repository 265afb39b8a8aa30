"""Every collective of the job model as the real worker program runs it: 2-4 local processes over
gloo on loopback, a few iterations of a small model. The bytes each flow carried (counted by its
source and by its destination) must be the scheduler's model of that job (`scheduler.jobs`,
`perfmodel.flow_bytes`), and no other pair may talk; where the collective averages, the replicas
must end identical."""

from __future__ import annotations

import math
import queue
import threading
from types import SimpleNamespace

import pytest
import torch

from protocol.worker import flow_option
from scheduler.jobs import all_to_all_job, load_jobs, ring_job, star_job, tree_job
from scheduler.model import Job, Resources
from scheduler.perfmodel import collective_phases, collective_steps
from workloads import collectives
from workloads.launch import PACKAGE_ROOT, run_local
from workloads.results import read_job, read_task_log

FAST = {
    "threads": 1,
    "model": "mlp-small",
    "dataset": "digits",
    "target_acc": 1.0,
    "max_iters": 4,
    "eval_every": 2,
    "timeout_s": 60,
}
R = Resources(0.5, 256)


def _run(tmp_path, world_size: int, collective: str, **options):
    paths = run_local(
        world_size, tmp_path, deadline_s=180, collective=collective, **{**FAST, **options}
    )
    return sorted((read_task_log(p) for p in paths), key=lambda t: t.rank), paths


def _model_flows(job: Job) -> dict[tuple[int, int], float]:
    """The job's flows by rank (task i is rank i) → bytes per iteration."""
    rank = {t.name: r for r, t in enumerate(job.tasks)}
    return {(rank[f.src], rank[f.dst]): f.bytes_per_iter for f in job.flows}


def _measured(logs) -> list[dict[tuple[int, int], tuple[int, int]]]:
    """Per iteration: (src, dst) → (bytes src counted sent to dst, bytes dst counted from src)."""
    per_iter = []
    for i in range(len(logs[0].iters)):
        flows: dict[tuple[int, int], tuple[int, int]] = {}
        for t in logs:
            for peer, n in t.iters[i]["payload_tx_by_peer"].items():
                rx = logs[int(peer)].iters[i]["payload_rx_by_peer"].get(str(t.rank), 0)
                flows[(t.rank, int(peer))] = (n, rx)
        per_iter.append(flows)
    return per_iter


def _gradient_bytes(logs) -> int:
    grad = logs[0].start["gradient_bytes"]
    assert all(t.start["gradient_bytes"] == grad for t in logs)
    return grad


@pytest.mark.parametrize(
    "collective, world_size, build",
    [
        ("ring", 3, lambda k, m: ring_job("j", k, R, m, 10)),
        ("ps", 3, lambda k, m: star_job("j", k - 1, R, m, 10)),  # ps + 2 workers
        ("tree", 4, lambda k, m: tree_job("j", k, R, m, 10)),  # rank 3 under 1 under 0
        ("all-to-all", 3, lambda k, m: all_to_all_job("j", k, R, m, 10)),
    ],
)
def test_averaging_collectives_carry_the_models_bytes_on_its_flows(
    tmp_path, collective, world_size, build
):
    logs, paths = _run(tmp_path, world_size, collective)
    grad = _gradient_bytes(logs)
    model = _model_flows(build(world_size, grad))
    for flows in _measured(logs):
        assert set(flows) == set(model)  # every flow of the model, and no other pair
        for pair, (tx, rx) in flows.items():
            assert tx == rx == model[pair], pair
    assert len({t.end["param_sum"] for t in logs}) == 1  # replicas identical
    assert all(r["comm_s"] > 0 and r["iter_s"] > 0 for t in logs for r in t.iters)
    assert all(r["comm_calls"] == 1 for t in logs for r in t.iters)  # one exchange an iteration
    summary = read_job(paths)
    assert summary.flow_bytes == {f"{s}>{d}": n for (s, d), n in model.items()}
    assert summary.collective == collective and not summary.synthetic


def test_all_to_all_shares_differ_by_one_element_when_k_does_not_divide(tmp_path):
    """85,002 parameters over 4 ranks: shares of 21,251, 21,251, 21,250, 21,250 elements. Each
    flow i→j carries share j (reduce-scatter) and share i (all-gather): within 8 bytes of the
    model's 2M/k, and all flows together carry exactly the model's 2(k-1)·M."""
    logs, _ = _run(tmp_path, 4, "all-to-all")
    grad = _gradient_bytes(logs)
    model = _model_flows(all_to_all_job("j", 4, R, grad, 10))
    shares = [4 * (grad // 4 // 4 + (i < grad // 4 % 4)) for i in range(4)]
    for flows in _measured(logs):
        assert set(flows) == set(model)
        for (src, dst), (tx, rx) in flows.items():
            assert tx == rx == shares[src] + shares[dst]
            assert abs(tx - model[(src, dst)]) <= 8
        assert sum(tx for tx, _ in flows.values()) == sum(model.values()) == 6 * grad
    assert len({t.end["param_sum"] for t in logs}) == 1


def test_a_cyclic_custom_graph_sends_each_flows_bytes_every_iteration(tmp_path):
    """workloads/jobs/custom-cycle.yaml: a→b→c→a and a→c→d→a, 0.5-4 MB per flow, more than the
    340 kB gradient (cut or repeated to size)."""
    (job,) = [j for j in load_jobs(PACKAGE_ROOT / "workloads" / "jobs") if j.name == "custom-cycle"]
    model = _model_flows(job)
    flows = [flow_option(s, d, round(n)) for (s, d), n in model.items()]
    logs, _ = _run(tmp_path, len(job.tasks), "custom", flows=flows)
    for measured in _measured(logs):
        assert set(measured) == set(model)
        for pair, (tx, rx) in measured.items():
            assert tx == rx == model[pair], pair
    # Gossip: each task mixes only what reached it, so the replicas drift apart.
    sums = [t.end["param_sum"] for t in logs]
    assert all(math.isfinite(s) for s in sums) and len(set(sums)) > 1


def test_a_custom_two_way_flow_of_the_whole_gradient_is_an_all_reduce(tmp_path):
    """Two tasks that send each other their whole gradient average it exactly: the replicas stay
    identical, as under the averaging collectives."""
    grad = 4 * 85002  # mlp-small on digits
    flows = [flow_option(0, 1, grad), flow_option(1, 0, grad)]
    logs, _ = _run(tmp_path, 2, "custom", flows=flows)
    assert _gradient_bytes(logs) == grad
    assert all(f == {(0, 1): (grad, grad), (1, 0): (grad, grad)} for f in _measured(logs))
    assert len({t.end["param_sum"] for t in logs}) == 1


class _LamportNet:
    """A stand-in for torch.distributed's isend/irecv between threads, one per rank. Every
    message carries its sender's clock + 1 and a receiver's clock becomes the largest it
    received: the clocks end at the length of the longest chain of messages each waited for,
    the sequential rounds the collective took. Every message also carries the messages its
    sender had waited for (directly or not), its causal past, kept in `messages`."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.pipes: dict[tuple[int, int], queue.Queue] = {}
        self.lock = threading.Lock()
        # message id -> (src, dst, ids of the messages before it in the causal order)
        self.messages: dict[int, tuple[int, int, frozenset[int]]] = {}
        # rank -> what it did, in order: "send" / "recv" (posted) and "wait"
        self.posted: dict[int, list[str]] = {}

    def _post(self, what: str) -> None:
        self.posted.setdefault(self.local.rank, []).append(what)

    def _pipe(self, src: int, dst: int) -> queue.Queue:
        with self.lock:
            return self.pipes.setdefault((src, dst), queue.Queue())

    def isend(self, tensor: torch.Tensor, dst: int) -> SimpleNamespace:
        me = self.local
        self._post("send")
        past = frozenset(me.past)
        with self.lock:
            mid = len(self.messages)
            self.messages[mid] = (me.rank, dst, past)
        self._pipe(me.rank, dst).put((tensor.clone(), me.clock + 1, past | {mid}))
        return SimpleNamespace(wait=lambda: self._post("wait"))

    def irecv(self, tensor: torch.Tensor, src: int) -> SimpleNamespace:
        me = self.local
        self._post("recv")
        pipe = self._pipe(src, me.rank)

        def wait() -> None:
            self._post("wait")
            data, clock, past = pipe.get(timeout=10)
            tensor.copy_(data)
            me.clock = max(me.clock, clock)
            me.past |= past

        return SimpleNamespace(wait=wait)

    def reduce(self, collective: str, world_size: int, flows: list[tuple[int, int]]) -> list[int]:
        """One averaging reduction of `collective` on `world_size` threads: each rank's clock."""
        clocks = [0] * world_size

        def rank(r: int) -> None:
            self.local.rank, self.local.clock, self.local.past = r, 0, set()
            c = collectives.make_collective(
                collective, r, world_size, [(s, d, 64) for s, d in flows]
            )
            c._reduce(torch.ones(16), average=True)
            clocks[r] = self.local.clock

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(world_size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=20)
        return clocks


def _cycle_flows() -> list[tuple[int, int]]:
    (cycle,) = [
        j for j in load_jobs(PACKAGE_ROOT / "workloads" / "jobs") if j.name == "custom-cycle"
    ]
    return list(_model_flows(cycle))


@pytest.mark.parametrize(
    "collective, world_size",
    [(c, k) for c in ("ps", "tree", "all-to-all") for k in range(2, 10)] + [("custom", 4)],
)
def test_the_model_counts_the_sequential_rounds_the_worker_runs(
    monkeypatch, collective, world_size
):
    """`perfmodel.collective_steps` is the longest chain of messages one reduction of the
    worker's collective waits for (gloo's ring is 2(k-1) by its algorithm and is not re-run
    here). The custom graph is custom-cycle.yaml's."""
    net = _LamportNet()
    monkeypatch.setattr(collectives, "dist", net)
    flows = _cycle_flows() if collective == "custom" else []
    clocks = net.reduce(collective, world_size, flows)
    job_collective = {"ps": "star"}.get(collective, collective)
    assert max(clocks) == collective_steps(job_collective, world_size)


@pytest.mark.parametrize(
    "collective, world_size", [("all-to-all", 3), ("all-to-all", 5), ("custom", 4)]
)
def test_every_exchange_posts_its_receives_before_its_sends(monkeypatch, collective, world_size):
    """gloo's TCP pair sends only once the peer's receive is posted, and queues the receive's
    notice behind what it is already sending to that peer: a receive posted after a send to the
    same peer waits for the whole send, and a pair carrying flows both ways takes turns (the
    direct all-reduce ran at 2.4 × its bandwidth bound so). Between two waits, no rank posts a
    receive after a send."""
    net = _LamportNet()
    monkeypatch.setattr(collectives, "dist", net)
    flows = _cycle_flows() if collective == "custom" else []
    net.reduce(collective, world_size, flows)
    assert len(net.posted) == world_size
    for events in net.posted.values():
        batches = "".join(e[0] for e in events).split("w")
        assert all("sr" not in batch for batch in batches), events
        assert any("r" in b and "s" in b for b in batches)  # both kinds posted together


@pytest.mark.parametrize(
    "collective, world_size",
    [(c, k) for c in ("ps", "tree") for k in range(2, 10)] + [("custom", 4)],
)
def test_the_models_phases_follow_the_order_the_worker_sends_in(
    monkeypatch, collective, world_size
):
    """`perfmodel.collective_phases` puts every message of the worker's reduction in a later
    phase than every message it waited for (directly or not), so running a phase's flows at once
    after the phases before it never runs a message before its cause; and there are as many
    phases as the longest chain of messages (`collective_steps`: no phase could be split off or
    merged). Each flow of the job carries one message. (All-to-all's two rounds travel on the
    same pairs, one flow of 2M/k each: one phase, not checked here; gloo's ring is pipelined.)"""
    net = _LamportNet()
    monkeypatch.setattr(collectives, "dist", net)
    flows = _cycle_flows() if collective == "custom" else []
    net.reduce(collective, world_size, flows)
    pairs = [(s, d) for s, d, _ in net.messages.values()]
    assert len(set(pairs)) == len(pairs)  # one message per flow
    job_collective = {"ps": "star"}.get(collective, collective)
    job = (
        star_job("s", world_size - 1, R, 64, 1)
        if collective == "ps"
        else tree_job("t", world_size, R, 64, 1)
        if collective == "tree"
        else None
    )
    if job is not None:
        assert set(pairs) == set(_model_flows(job))
    phases = collective_phases(job_collective, [(s, d, (s, d)) for s, d in pairs])
    phase = {pair: i for i, members in enumerate(phases) for pair in members}
    for src, dst, past in net.messages.values():
        for before in past:
            assert phase[net.messages[before][:2]] < phase[src, dst], (before, (src, dst))
    assert len(phases) == collective_steps(job_collective, world_size)
