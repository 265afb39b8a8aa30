"""One task of a distributed training job: PyTorch DDP over gloo (CPU), timed MLPerf-style.

    python -m workloads.train --rank R --world-size K --master-addr IP --master-port P \\
        --iface eth0 --model cnn --dataset digits --collective ring --target-acc 0.95 \\
        --eval-every 10 --max-iters 2000 --max-seconds 600 --batch-size 32 --lr 0.05 \\
        --seed 0 --out /results/rank0.jsonl [--flows 0>1:4000000 1>0:4000000 ...]

Rendezvous is at rank 0's testbed address and gloo is bound to `--iface`, so every byte of the
job crosses the emulated links. Timing (MLPerf training rules): the clock starts after the
process group and the model exist and before any data is touched; evaluation runs at a fixed
cadence inside the clock; the clock stops at the first evaluation that reaches the target. A run
that hits --max-iters / --max-seconds first reports `reached_target: false` and no time.

--collective is one of `workloads.collectives`: ring, ps (the job model's star), tree, all-to-all
or custom, whose graph is given by --flows (`protocol.worker.flow_option`: SRC>DST:BYTES per
iteration, ranks). A dataset read from files (mnist, cifar10) that is absent is replaced by random
data of its shapes (`data.synthetic_dataset`): iteration times only, never a time-to-accuracy;
--require-data makes its absence an error instead.

JSON lines written to --out (one file per task), each with a "type":
  start  configuration, model size, threads, clocks, dilation (K: 1 unless the worker runs under
         time dilation, `protocol.worker` DILATION_ENV; then every time below is emulated), cpu
         (as in end: what start-up took; the data line has it at the clock's start)
  data   dataset, synthetic (random data of its shapes), sizes of the splits and of this
         rank's evaluation shard, clock_start (the wall clock when the clock started:
         evaluations are at clock_start + elapsed_s)
  iter   iter, loss, iter_s, compute_s, comm_s, tx_bytes, rx_bytes (interface counters),
         payload_tx_bytes, payload_rx_bytes (what the collective sent), payload_tx_by_peer,
         payload_rx_by_peer (the same per peer rank: the bytes of each of the job's flows)
  eval   iter, elapsed_s, eval_s, accuracy (over the whole held-out split), tcp and cpu (as in
         end: so far, for a task that is stopped before it ends)
  end    reached_target, tta_s, tta_iter, stop_reason, synthetic, iters, train_s, init_s, startup_s,
         container_startup_s, jct_s, param_sum, tcp (the kernel's counters of this task's
         connections per peer address, `metrics.tcp_send_counters`), cpu (what the host's
         scheduler gave this process, in host seconds: `metrics.cpu_counters`)
Exit codes: 0 done (converged or not), 1 runtime failure, 2 bad parameters, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from protocol.worker import METRICS_OUT, RENDEZVOUS_PORT, parse_flow

from .collectives import COLLECTIVES, check_flows, make_collective
from .data import (
    DATASET_SHAPES,
    DATASETS,
    DEFAULT_DATA_DIR,
    FILE_DATASETS,
    DatasetError,
    as_float,
    check_available,
    load_dataset,
    synthetic_dataset,
)
from .metrics import (
    InterfaceCounters,
    JsonLines,
    container_start_time,
    cpu_counters,
    cpu_quota,
    default_threads,
    dilation,
    process_start_time,
    tcp_send_counters,
)
from .models import MODELS, build_model, gradient_bytes, parameter_count


@dataclass(frozen=True)
class TrainConfig:
    rank: int
    world_size: int
    master_addr: str = "127.0.0.1"
    master_port: int = RENDEZVOUS_PORT
    iface: str = "lo"
    model: str = "mlp-small"
    dataset: str = "digits"
    collective: str = "ring"
    target_acc: float = 0.95
    eval_every: int = 10
    max_iters: int = 2000
    max_seconds: float = 600.0
    batch_size: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    threads: int = 0  # 0: one per core of the CPU quota
    timeout_s: float = 300.0  # rendezvous and per-collective timeout
    data_dir: str = DEFAULT_DATA_DIR
    require_data: bool = False  # absent files are an error, not synthetic data
    flows: tuple[str, ...] = ()  # a custom graph's, `protocol.worker.flow_option`
    out: str = METRICS_OUT


class JobError(Exception):
    """A failure while the job runs (peer lost, rendezvous timeout): reported, exit 1."""


# --- command line ---------------------------------------------------------------------------
def _bounded(
    kind: type,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    what: str = "",
) -> argparse._ActionType:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got '{text}'") from None
        too_low = low is not None and (value <= low if low_open else value < low)
        if too_low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{what or 'value'} must be in "
                f"{'(' if low_open else '['}{low}, "
                f"{high if high is not None else 'inf'}], got {text}"
            )
        return value

    parse.__name__ = kind.__name__
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workloads.train", description="One task of a DDP training job (gloo, CPU)."
    )
    p.add_argument("--rank", type=_bounded(int, 0, what="rank"), required=True)
    p.add_argument("--world-size", type=_bounded(int, 1, what="world size"), required=True)
    p.add_argument("--master-addr", default="127.0.0.1", help="rank 0's testbed address")
    p.add_argument(
        "--master-port", type=_bounded(int, 1, 65535, what="port"), default=RENDEZVOUS_PORT
    )
    p.add_argument("--iface", default="lo", help="interface gloo binds to (testbed: eth0)")
    p.add_argument("--model", choices=sorted(MODELS), default="mlp-small")
    p.add_argument("--dataset", choices=DATASETS, default="digits")
    p.add_argument("--collective", choices=COLLECTIVES, default="ring")
    p.add_argument(
        "--target-acc",
        type=_bounded(float, 0, 1, low_open=True, what="target accuracy"),
        default=0.95,
    )
    p.add_argument("--eval-every", type=_bounded(int, 1, what="eval cadence"), default=10)
    p.add_argument("--max-iters", type=_bounded(int, 1, what="max iterations"), default=2000)
    p.add_argument(
        "--max-seconds", type=_bounded(float, 0, low_open=True, what="max seconds"), default=600.0
    )
    p.add_argument("--batch-size", type=_bounded(int, 1, what="batch size"), default=32)
    p.add_argument(
        "--lr", type=_bounded(float, 0, low_open=True, what="learning rate"), default=0.05
    )
    p.add_argument("--momentum", type=_bounded(float, 0, 0.999, what="momentum"), default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads",
        type=_bounded(int, 0, what="threads"),
        default=0,
        help="intra-op threads (0: one per core of the cgroup CPU quota)",
    )
    p.add_argument(
        "--timeout",
        dest="timeout_s",
        default=300.0,
        type=_bounded(float, 0, low_open=True, what="timeout"),
    )
    p.add_argument(
        "--data-dir",
        default=DEFAULT_DATA_DIR,
        help="where local datasets live (MNIST/raw/*-idx?-ubyte[.gz], cifar-10-batches-py/)",
    )
    p.add_argument(
        "--require-data",
        action="store_true",
        help="fail if the dataset's files are absent (default: random data of its shapes)",
    )
    p.add_argument(
        "--flows",
        nargs="*",
        default=(),
        metavar="SRC>DST:BYTES",
        help="a custom graph's flows: ranks and bytes per iteration",
    )
    p.add_argument("--out", default=METRICS_OUT, help="JSON-lines output file ('-': stdout)")
    return p


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """Parse and validate; on bad input print a clear message and exit 2 (argparse's way)."""
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    cfg = TrainConfig(**{**args, "flows": tuple(args["flows"])})
    if cfg.rank >= cfg.world_size:
        parser.error(f"--rank {cfg.rank} is outside the job (world size {cfg.world_size})")
    if not (Path("/sys/class/net") / cfg.iface).exists():
        parser.error(f"--iface {cfg.iface}: no such network interface here")
    try:
        check_flows(cfg.collective, cfg.world_size, [parse_flow(f) for f in cfg.flows])
    except ValueError as e:
        parser.error(f"--flows: {e}")
    if cfg.require_data or cfg.dataset not in FILE_DATASETS:
        try:
            check_available(cfg.dataset, cfg.data_dir)
        except DatasetError as e:
            parser.error(str(e))
    return cfg


def _data_absent(cfg: TrainConfig) -> str | None:
    """Why the dataset's files are absent (then the run uses synthetic data), None if present."""
    try:
        check_available(cfg.dataset, cfg.data_dir)
    except DatasetError as e:
        return str(e)
    return None


# --- the training run -------------------------------------------------------------------------
def run(cfg: TrainConfig, log: JsonLines) -> dict:
    # Under time dilation every time and instant reported is emulated (`metrics.dilation`): the
    # loop measures host seconds and `em` converts them; --max-seconds is emulated too.
    clock = dilation()
    em = clock.emulated_seconds
    started = clock.emulated_instant(process_start_time())
    container_started = container_start_time()
    threads = cfg.threads or default_threads(clock)
    torch.set_num_threads(threads)
    os.environ["GLOO_SOCKET_IFNAME"] = cfg.iface  # else gloo may bind Docker's or loopback
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
            rank=cfg.rank,
            world_size=cfg.world_size,
            timeout=timedelta(seconds=cfg.timeout_s),
        )
    except (RuntimeError, ValueError) as e:
        raise JobError(f"rendezvous at {cfg.master_addr}:{cfg.master_port} failed: {e}") from e

    absent = _data_absent(cfg)
    if absent:
        print(f"rank {cfg.rank}: {absent}; training on synthetic data", file=sys.stderr)
    torch.manual_seed(cfg.seed)  # the same on every rank: replicas start equal
    shape, classes = DATASET_SHAPES[cfg.dataset]
    model = build_model(cfg.model, shape, classes)
    flows = [parse_flow(f) for f in cfg.flows]
    collective = make_collective(cfg.collective, cfg.rank, cfg.world_size, flows)
    net = collective.wrap(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum)
    log.write(
        "start",
        config=asdict(cfg),
        host=socket.gethostname(),
        threads=threads,
        cpu_quota=cpu_quota(),
        torch=torch.__version__,
        parameters=parameter_count(model),
        gradient_bytes=gradient_bytes(model),
        process_start=started,
        container_start=container_started,
        dilation=clock.factor,
        cpu=cpu_counters(),
    )
    dist.barrier()

    # ---- the clock starts: from here on everything counts toward time-to-accuracy ----
    t0 = time.perf_counter()
    clock_start = clock.time()
    data = synthetic_dataset(cfg.dataset) if absent else load_dataset(cfg.dataset, cfg.data_dir)
    x_eval, y_eval = (
        data.x_test[cfg.rank :: cfg.world_size],
        data.y_test[cfg.rank :: cfg.world_size],
    )
    batches = _batches(data.x_train, data.y_train, cfg)
    log.write(
        "data",
        dataset=data.name,
        synthetic=data.synthetic,
        train=len(data.y_train),
        test=len(data.y_test),
        shard_eval=len(y_eval),
        clock_start=clock_start,
        cpu=cpu_counters(),
    )
    counters = InterfaceCounters(cfg.iface)
    loss_fn = nn.CrossEntropyLoss()

    first_iter_wall = None
    tta_s = tta_iter = None
    stop_reason = "max_iters"
    it = 0
    while it < cfg.max_iters:
        it += 1
        t_start = time.perf_counter()
        if first_iter_wall is None:
            first_iter_wall = clock.time()
        x, y = next(batches)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(as_float(x)), y)
        loss.backward()  # DDP: returns once every gradient bucket is all-reduced
        collective.after_backward(model)  # the others: their exchange
        t_synced = time.perf_counter()
        optimizer.step()
        t_end = time.perf_counter()
        window = collective.take_window()
        # Compute = until the last gradient was handed to the collective, plus the update.
        grads_ready = window.last_launch if window.last_launch is not None else t_synced
        compute_s = (grads_ready - t_start) + (t_end - t_synced)
        tx, rx = counters.delta()
        log.write(
            "iter",
            iter=it,
            loss=round(loss.item(), 5),
            iter_s=em(t_end - t_start),
            compute_s=em(compute_s),
            comm_s=em(window.seconds),
            comm_calls=window.calls,
            tx_bytes=tx,
            rx_bytes=rx,
            payload_tx_bytes=window.payload_tx,
            payload_rx_bytes=window.payload_rx,
            payload_tx_by_peer={str(r): n for r, n in sorted(window.tx_by_peer.items()) if n},
            payload_rx_by_peer={str(r): n for r, n in sorted(window.rx_by_peer.items()) if n},
        )

        if it % cfg.eval_every == 0 or it == cfg.max_iters:
            t_eval = time.perf_counter()
            accuracy, over_time = _evaluate(
                model, collective, x_eval, y_eval, em(t_eval - t0) > cfg.max_seconds
            )
            elapsed = em(time.perf_counter() - t0)
            log.write(
                "eval",
                iter=it,
                elapsed_s=elapsed,
                eval_s=em(time.perf_counter() - t_eval),
                accuracy=accuracy,
                tcp=tcp_send_counters(clock),
                cpu=cpu_counters(),
            )
            counters.delta()  # evaluation traffic is not the next iteration's
            if accuracy >= cfg.target_acc and not data.synthetic:  # random labels: no TTA
                tta_s, tta_iter, stop_reason = elapsed, it, "target"
                break
            if over_time:
                stop_reason = "max_seconds"
                break

    t_finish = time.perf_counter()
    end_wall = clock.time()
    result = {
        "reached_target": tta_s is not None,
        "tta_s": tta_s,
        "tta_iter": tta_iter,
        "target_acc": cfg.target_acc,
        "stop_reason": stop_reason,
        "synthetic": data.synthetic,
        "iters": it,
        "train_s": em(t_finish - t0),
        "clock_start": clock_start,
        "init_s": clock_start - started,
        "startup_s": first_iter_wall - started if first_iter_wall else None,
        "container_startup_s": (
            first_iter_wall - container_started if first_iter_wall and container_started else None
        ),
        "jct_s": end_wall - (container_started or started),
        # Equal on every rank when the replicas stayed in sync (a check, not a metric).
        "param_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
        "tcp": tcp_send_counters(clock),
        "cpu": cpu_counters(),
    }
    log.write("end", **result)
    return result


def _batches(
    x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's shard of the training set, reshuffled every epoch, forever."""
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(
        dataset,
        num_replicas=cfg.world_size,
        rank=cfg.rank,
        shuffle=True,
        seed=cfg.seed,
        drop_last=True,
    )
    loader = DataLoader(dataset, batch_size=cfg.batch_size, sampler=sampler, drop_last=True)
    if len(loader) == 0:
        raise JobError(
            f"batch size {cfg.batch_size} exceeds this rank's shard ({len(sampler)} samples)"
        )
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


# Images scored at once: a whole 10k-image shard would not fit a worker's memory. At 256,
# MobileNetV2 on 32x32 images peaked at 1.32 GB (its training step at batch 32: 0.93 GB) and a
# worker of 1536 MiB was killed; at 64 the evaluation peaks below the training step.
EVAL_CHUNK = 64


@torch.no_grad()
def _evaluate(
    model: nn.Module, collective, x: torch.Tensor, y: torch.Tensor, over_time: bool
) -> tuple[float, bool]:
    """Accuracy over the whole held-out split (each rank scores its slice, the counts are
    summed over the job's own pattern), and whether any rank is past --max-seconds: all ranks
    get the same answers, so they stop at the same iteration."""
    model.eval()
    correct = sum(
        int((model(as_float(x[i : i + EVAL_CHUNK])).argmax(dim=1) == y[i : i + EVAL_CHUNK]).sum())
        for i in range(0, len(y), EVAL_CHUNK)
    )
    model.train()
    counts = torch.tensor([correct, len(y), int(over_time)], dtype=torch.float64)
    collective.sum_(counts)
    return counts[0].item() / max(counts[1].item(), 1.0), counts[2].item() > 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_config(argv)
    # `docker stop` sends SIGTERM: unwind like Ctrl-C so the process group is torn down.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    log = JsonLines(cfg.out)
    try:
        run(cfg, log)
        # Every rank stops at the same evaluation; meet once more so that no rank tears its
        # gloo connections down under a peer that is still using them (seen as SIGABRT).
        if dist.is_initialized():
            dist.barrier()
        return 0
    except KeyboardInterrupt:
        print(f"rank {cfg.rank}: interrupted", file=sys.stderr)
        return 130
    except (JobError, RuntimeError, OSError) as e:  # gloo reports a lost peer as RuntimeError
        print(f"error: rank {cfg.rank}: {e}", file=sys.stderr)
        log.write("error", message=str(e))
        return 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        log.close()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: gloo's C++ threads may abort the process in static destructors
    # after all results are written, turning a finished task into exit -6.
    os._exit(code)
