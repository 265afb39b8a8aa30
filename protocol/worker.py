"""The contract between whoever starts a training worker (an edge agent, a local launcher) and
the training program (`workloads.train`, or a job's own command).

- The worker writes its metric lines to stdout (`METRICS_OUT`), one JSON object per line with a
  "type"; the agent follows the container's log.
- `START_ENV` holds the epoch second at which the worker's container was started, so the worker
  can measure its own start-up (container start -> first iteration).
- `DILATION_ENV`, when set, is the time dilation the worker runs under (`protocol.dilation`,
  "K@ORIGIN"): its quota is the host's share of its task's CPU, and it reports every time and
  rate in emulated units on the emulated clock (START_ENV is on that clock too).
- Rank 0 listens for the rendezvous on `RENDEZVOUS_PORT` unless told otherwise (the Master gives
  every attempt a port of its own, counting up from here).
- Options travel as command-line flags built by `option_flags`.
- The job's communication graph is the scheduler's (`scheduler.jobs`), task i being rank i: the
  worker sends along exactly the flows the scheduler routed. A tree's shape is `tree_parent`; a
  custom graph's flows travel as `--flows` values in `flow_option`'s format.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

METRICS_OUT = "-"
START_ENV = "CES_CONTAINER_START"
DILATION_ENV = "CES_TIME_DILATION"
RENDEZVOUS_PORT = 29500


def option_flags(options: Mapping[str, Any]) -> list[str]:
    """Flags from a mapping: `max_iters: 5` -> `--max-iters 5`, a true boolean -> the bare flag,
    false or None -> nothing, a list -> the flag followed by each value."""
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)):
            args += [flag, *map(str, value)]
        else:
            args += [flag, str(value)]
    return args


def tree_parent(rank: int) -> int:
    """The parent of a rank (> 0) in a tree job: a binary tree rooted at rank 0."""
    return (rank - 1) // 2


def flow_option(src: int, dst: int, nbytes: int) -> str:
    """One flow of a custom graph as a worker option value: `SRC>DST:BYTES` (ranks, bytes per
    iteration)."""
    return f"{src}>{dst}:{nbytes}"


def parse_flow(text: str) -> tuple[int, int, int]:
    """(src, dst, bytes) from `flow_option`'s format; ValueError says what is wrong."""
    ends, sep, nbytes = text.partition(":")
    src, arrow, dst = ends.partition(">")
    try:
        if not (sep and arrow):
            raise ValueError
        flow = int(src), int(dst), int(nbytes)
    except ValueError:
        raise ValueError(f"flow '{text}': expected SRC>DST:BYTES (ranks, bytes)") from None
    if min(flow) < 0 or flow[0] == flow[1]:
        raise ValueError(f"flow '{text}': ranks and bytes must be >= 0, SRC different from DST")
    return flow
