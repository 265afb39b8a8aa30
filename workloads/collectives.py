"""The two ways a job's tasks exchange gradients, each timed as it really runs.

- `RingAllReduce`: DistributedDataParallel over gloo; gloo's ring all-reduce sends each rank's
  2(k-1)/k share of every gradient bucket to its ring neighbour. A DDP communication hook times
  every bucket's all-reduce from launch to completion.
- `ParameterServer`: a star. Every worker sends its whole flattened gradient to the server task
  (which also trains), the server sums, averages and sends the average back to each worker, all
  with point-to-point send/recv so that no byte takes another route.

Both expose the same small interface to the training loop: `wrap(model)`, `after_backward()`,
`take_window()` (what the last iteration's collective cost) and `sum_(tensor)` (a tiny
reduction used for the distributed evaluation, over the same pattern as the gradients).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

COLLECTIVES = ("ring", "ps")


@dataclass
class CommWindow:
    """The collective's share of one iteration."""

    first_launch: float | None = None  # perf_counter when the first message was posted
    last_launch: float | None = None  # ... the last one (all gradients were ready by then)
    last_done: float | None = None  # ... when the last one completed
    payload_tx: int = 0  # bytes this rank's collective sent / received (application payload)
    payload_rx: int = 0

    @property
    def seconds(self) -> float:
        if self.first_launch is None or self.last_done is None:
            return 0.0
        return self.last_done - self.first_launch


class _Timed:
    """Thread-safe accumulation of a CommWindow (DDP completes buckets on gloo's threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._window = CommWindow()

    def _launched(self, tx: int, rx: int) -> None:
        now = time.perf_counter()
        with self._lock:
            w = self._window
            w.first_launch = now if w.first_launch is None else w.first_launch
            w.last_launch = now
            w.payload_tx += tx
            w.payload_rx += rx

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

    def __init__(self, world_size: int) -> None:
        super().__init__()
        self.world_size = world_size

    def wrap(self, model: nn.Module) -> nn.Module:
        ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters
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
    ring._launched(share, share)
    buffer.div_(ring.world_size)
    future = dist.all_reduce(buffer, async_op=True).get_future()

    def completed(fut: torch.futures.Future) -> torch.Tensor:
        ring._done()
        return fut.value()[0]

    return future.then(completed)


class ParameterServer(_Timed):
    name = "ps"

    def __init__(self, rank: int, world_size: int, server: int = 0) -> None:
        super().__init__()
        self.rank, self.world_size, self.server = rank, world_size, server
        self.workers = [r for r in range(world_size) if r != server]

    def wrap(self, model: nn.Module) -> nn.Module:
        # The server's initial parameters go to every worker (the star, before the clock).
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            self._star(flat, reduce=False)
            _unflatten_into(flat, list(model.parameters()))
        self.take_window()  # set-up traffic is not an iteration's
        return model

    def after_backward(self, model: nn.Module) -> None:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._star(flat, reduce=True, average=True)
        _unflatten_into(flat, grads)

    def sum_(self, tensor: torch.Tensor) -> None:
        self._star(tensor, reduce=True, average=False)
        self.take_window()

    def _star(self, flat: torch.Tensor, reduce: bool, average: bool = False) -> None:
        """Workers → server (summed) → workers when `reduce`; server → workers otherwise."""
        if self.world_size == 1:
            return
        nbytes = flat.numel() * flat.element_size()
        if self.rank == self.server:
            fan = len(self.workers)
            self._launched(fan * nbytes, fan * nbytes if reduce else 0)
            if reduce:
                incoming = [torch.empty_like(flat) for _ in self.workers]
                for req in [dist.irecv(buf, src=r) for buf, r in zip(incoming, self.workers)]:
                    req.wait()
                for buf in incoming:
                    flat.add_(buf)
                if average:
                    flat.div_(self.world_size)
            for req in [dist.isend(flat, dst=r) for r in self.workers]:
                req.wait()
        else:
            self._launched(nbytes if reduce else 0, nbytes)
            if reduce:
                dist.send(flat, dst=self.server)
            dist.recv(flat, src=self.server)
        self._done()


def _unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.data.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def make_collective(name: str, rank: int, world_size: int) -> RingAllReduce | ParameterServer:
    if name == "ring":
        return RingAllReduce(world_size)
    if name == "ps":
        return ParameterServer(rank, world_size)
    raise ValueError(f"unknown collective '{name}' (expected one of {', '.join(COLLECTIVES)})")
