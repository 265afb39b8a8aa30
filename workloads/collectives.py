"""How a job's tasks exchange gradients: along the flows of the scheduler's job model
(`scheduler.jobs`, task i is rank i), each timed as it really runs.

- `RingAllReduce` ("ring"): DistributedDataParallel over gloo; gloo's ring all-reduce sends each
  rank's 2(k-1)/k share of every gradient bucket to rank r-1. A DDP communication hook times
  every bucket's all-reduce from launch to completion.
- `ParameterServer` ("ps", the model's star): every worker sends its whole flattened gradient to
  the server task (rank 0, which also trains), the server sums, averages and sends the average
  back to each worker: M bytes up and M down per worker.
- `TreeAllReduce` ("tree"): a binary tree rooted at rank 0 (`protocol.worker.tree_parent`).
  Each rank adds its children's sums to its gradient and sends the sum to its parent; the root
  averages and the average goes back down: M bytes per tree edge and direction.
- `DirectAllReduce` ("all-to-all"): reduce-scatter then all-gather with every pair talking
  directly. Rank i sends rank j the j-th of k shares of its gradient; j sums and averages that
  share and sends it to every other rank. Each ordered pair i→j carries share j then share i:
  2M/k (when k does not divide the gradient's length the shares differ by one element).
- `GraphExchange` ("custom"): any directed graph, cycles included. Every iteration each flow
  carries its bytes: the source's gradient, cut to the flow's size or repeated to fill it. Each
  task then averages every gradient element it received with its own. That is gossip over the
  graph: replicas stay close but are not identical.

gloo has all-reduce, broadcast and barrier, but no tree, direct or graph exchange. So every
collective but the ring is point-to-point (isend/irecv) between exactly the ranks of a flow, so
no byte takes another route.

They share a small interface to the training loop: `wrap(model)`, `after_backward(model)`,
`take_window()` (what the last iteration's collective cost, bytes per peer included) and
`sum_(tensor)` (a tiny reduction used for the distributed evaluation).
"""

from __future__ import annotations

import math
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from protocol.worker import tree_parent

COLLECTIVES = ("ring", "ps", "tree", "all-to-all", "custom")
Flow = tuple[int, int, int]  # (source rank, destination rank, bytes per iteration)


@dataclass
class CommWindow:
    """The collective's share of one iteration."""

    first_launch: float | None = None  # perf_counter when the collective started
    last_launch: float | None = None  # ... the last one (all gradients were ready by then)
    last_done: float | None = None  # ... when the last one completed
    # How many exchanges it made (a ring: one all-reduce per DDP gradient bucket). Each starts
    # after the sender idled, on a full token bucket (experiments/e2e/fidelity.py `wire_top`).
    calls: int = 0
    # Application payload this rank's collective sent to / received from each peer rank.
    tx_by_peer: Counter[int] = field(default_factory=Counter)
    rx_by_peer: Counter[int] = field(default_factory=Counter)

    @property
    def seconds(self) -> float:
        if self.first_launch is None or self.last_done is None:
            return 0.0
        return self.last_done - self.first_launch

    @property
    def payload_tx(self) -> int:
        return sum(self.tx_by_peer.values())

    @property
    def payload_rx(self) -> int:
        return sum(self.rx_by_peer.values())


class _Timed:
    """Thread-safe accumulation of a CommWindow (DDP completes buckets on gloo's threads)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self._lock = threading.Lock()
        self._window = CommWindow()

    def _launched(self) -> None:
        now = time.perf_counter()
        with self._lock:
            w = self._window
            w.first_launch = now if w.first_launch is None else w.first_launch
            w.last_launch = now
            w.calls += 1

    def _count(self, peer: int, tx: int, rx: int) -> None:
        with self._lock:
            self._window.tx_by_peer[peer] += tx
            self._window.rx_by_peer[peer] += rx

    def _done(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self._window.last_done = now

    def take_window(self) -> CommWindow:
        with self._lock:
            window, self._window = self._window, CommWindow()
        return window


class RingAllReduce(_Timed):
    name = "ring"

    def wrap(self, model: nn.Module) -> nn.Module:
        # broadcast_buffers=False: otherwise rank 0 would broadcast the batch-norm statistics
        # before every forward, traffic the job model does not have. Each rank keeps its own,
        # as under the point-to-point collectives.
        ddp = DistributedDataParallel(model, broadcast_buffers=False)  # broadcasts parameters
        ddp.register_comm_hook(self, _timed_allreduce_hook)
        return ddp

    def after_backward(self, model: nn.Module) -> None:
        """Nothing to do: DDP's backward() returns once every bucket is all-reduced."""

    def sum_(self, tensor: torch.Tensor) -> None:
        dist.all_reduce(tensor)

    def ring_share(self, nbytes: int) -> int:
        k = self.world_size
        return 2 * (k - 1) * nbytes // k


# No annotations: DDP compares them with the real classes, and this module's are strings.
def _timed_allreduce_hook(ring, bucket):
    buffer = bucket.buffer()
    share = ring.ring_share(buffer.numel() * buffer.element_size())
    ring._launched()
    if ring.world_size > 1:
        # gloo's ring sends to rank r-1 and receives from r+1: measured per TCP connection
        # (docs/workloads.md, "Collectives"), so these are the counts of the ring's two flows.
        ring._count((ring.rank - 1) % ring.world_size, share, 0)
        ring._count((ring.rank + 1) % ring.world_size, 0, share)
    buffer.div_(ring.world_size)
    future = dist.all_reduce(buffer, async_op=True).get_future()

    def completed(fut: torch.futures.Future) -> torch.Tensor:
        ring._done()
        return fut.value()[0]

    return future.then(completed)


class _PointToPoint(_Timed, ABC):
    """A collective made of isend/irecv rounds."""

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model as it is: every rank built it from the same seed (`train.run`), so the
        replicas start equal without any traffic."""
        return model

    def after_backward(self, model: nn.Module) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._launched()
        self._reduce(flat, average=True)
        self._done()
        _unflatten_into(flat, grads)

    def sum_(self, tensor: torch.Tensor) -> None:
        self._reduce(tensor, average=False)
        self.take_window()  # evaluation traffic is not an iteration's

    @abstractmethod
    def _reduce(self, flat: torch.Tensor, average: bool) -> None:
        """Reduce `flat` in place: to its sum over the job (`average` False: the evaluation's
        counts), or to the gradient this rank applies (`average` True)."""

    def _exchange(
        self,
        sends: Sequence[tuple[torch.Tensor, int]] = (),
        recvs: Sequence[tuple[torch.Tensor, int]] = (),
    ) -> None:
        """Post every receive, then every send (tensor, peer rank), then wait for all of them;
        empty tensors are skipped (both ends know the sizes).

        Receives first: gloo's TCP pair sends a message only once the peer has posted its
        receive (the receiver's "recv ready" notice), and queues that notice behind whatever
        the pair is already sending. Posted after a send to the same peer, a receive's notice
        waits for the whole send, and the two directions of the pair take turns: the direct
        all-reduce and a custom graph with flows both ways ran at 1.6-2.5 × their bandwidth
        bound so, against 1.1 × for gloo's ring (results/calibration.json)."""
        requests = []
        for tensor, peer in recvs:
            if tensor.numel():
                self._count(peer, 0, _nbytes(tensor))
                requests.append(dist.irecv(tensor, src=peer))
        for tensor, peer in sends:
            if tensor.numel():
                self._count(peer, _nbytes(tensor), 0)
                requests.append(dist.isend(tensor, dst=peer))
        for request in requests:
            request.wait()


class ParameterServer(_PointToPoint):
    name = "ps"
    server = 0  # the star's centre: the job model's `ps` task is the first (`scheduler.jobs`)

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.workers = [r for r in range(world_size) if r != self.server]

    def wrap(self, model: nn.Module) -> nn.Module:
        # The server's initial parameters go to every worker (the star, before the clock).
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            self._broadcast(flat)
            _unflatten_into(flat, list(model.parameters()))
        self.take_window()  # set-up traffic is not an iteration's
        return model

    def _reduce(self, flat: torch.Tensor, average: bool) -> None:
        """Workers → server (summed, averaged when `average`) → workers."""
        if self.rank == self.server:
            incoming = [torch.empty_like(flat) for _ in self.workers]
            self._exchange(recvs=list(zip(incoming, self.workers)))
            for buf in incoming:
                flat.add_(buf)
            if average:
                flat.div_(self.world_size)
        else:
            self._exchange(sends=[(flat, self.server)])
        self._broadcast(flat)

    def _broadcast(self, flat: torch.Tensor) -> None:
        if self.rank == self.server:
            self._exchange(sends=[(flat, r) for r in self.workers])
        else:
            self._exchange(recvs=[(flat, self.server)])


class TreeAllReduce(_PointToPoint):
    name = "tree"

    def _reduce(self, flat: torch.Tensor, average: bool) -> None:
        children = [c for c in range(1, self.world_size) if tree_parent(c) == self.rank]
        incoming = [torch.empty_like(flat) for _ in children]
        self._exchange(recvs=list(zip(incoming, children)))
        for buf in incoming:
            flat.add_(buf)
        if self.rank == 0:
            if average:
                flat.div_(self.world_size)
        else:
            parent = tree_parent(self.rank)
            self._exchange(sends=[(flat, parent)])  # the subtree's sum up ...
            self._exchange(recvs=[(flat, parent)])  # ... the root's result down
        self._exchange(sends=[(flat, c) for c in children])


class DirectAllReduce(_PointToPoint):
    name = "all-to-all"

    def _reduce(self, flat: torch.Tensor, average: bool) -> None:
        shares = flat.tensor_split(self.world_size)  # views: writing a share writes `flat`
        mine = shares[self.rank]
        peers = [r for r in range(self.world_size) if r != self.rank]
        incoming = [torch.empty_like(mine) for _ in peers]
        self._exchange(
            sends=[(shares[p], p) for p in peers], recvs=list(zip(incoming, peers))
        )  # reduce-scatter
        for buf in incoming:
            mine.add_(buf)
        if average:
            mine.div_(self.world_size)
        self._exchange(
            sends=[(mine, p) for p in peers], recvs=[(shares[p], p) for p in peers]
        )  # all-gather


class GraphExchange(_PointToPoint):
    name = "custom"

    def __init__(self, rank: int, world_size: int, flows: Sequence[Flow]) -> None:
        super().__init__(rank, world_size)
        self.outgoing = [(dst, n) for src, dst, n in flows if src == rank]
        self.incoming = [(src, n) for src, dst, n in flows if dst == rank]

    def _reduce(self, flat: torch.Tensor, average: bool) -> None:
        if not average:
            # A custom graph need not reach every rank from every other: the evaluation's three
            # counts take gloo's own all-reduce (24 bytes an evaluation).
            dist.all_reduce(flat)
            return
        payload = flat.view(torch.uint8)
        received = [torch.empty(n, dtype=torch.uint8) for _, n in self.incoming]
        self._exchange(
            sends=[(_filled(payload, n), dst) for dst, n in self.outgoing],
            recvs=[(buf, src) for buf, (src, _) in zip(received, self.incoming)],
        )
        total, count = flat.clone(), torch.ones_like(flat)
        for buf in received:
            m = min(buf.numel(), payload.numel()) // flat.element_size()
            total[:m] += buf[: m * flat.element_size()].view(flat.dtype)
            count[:m] += 1
        torch.div(total, count, out=flat)


def _filled(payload: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The first `nbytes` of `payload` repeated as often as needed."""
    if nbytes <= payload.numel():
        return payload[:nbytes]
    return payload.repeat(math.ceil(nbytes / payload.numel()))[:nbytes]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.data.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def make_collective(
    name: str, rank: int, world_size: int, flows: Sequence[Flow] = ()
) -> RingAllReduce | _PointToPoint:
    """The collective `name`; `flows` are a custom graph's (`check_flows`)."""
    check_flows(name, world_size, flows)
    if name == "ring":
        return RingAllReduce(rank, world_size)
    if name == "ps":
        return ParameterServer(rank, world_size)
    if name == "tree":
        return TreeAllReduce(rank, world_size)
    if name == "all-to-all":
        return DirectAllReduce(rank, world_size)
    if name == "custom":
        return GraphExchange(rank, world_size, flows)
    raise ValueError(f"unknown collective '{name}' (expected one of {', '.join(COLLECTIVES)})")


def check_flows(name: str, world_size: int, flows: Sequence[Flow]) -> None:
    """ValueError unless `flows` fit collective `name`: only a custom graph has flows, between
    ranks of the job, each (source, destination) pair once."""
    if flows and name != "custom":
        raise ValueError(f"flows are a custom graph's; the {name} collective has its own")
    for src, dst, _ in flows:
        if max(src, dst) >= world_size:
            raise ValueError(f"flow {src}>{dst} names a rank outside the job (size {world_size})")
    if len({(src, dst) for src, dst, _ in flows}) < len(flows):
        raise ValueError("a (source, destination) pair more than once")
