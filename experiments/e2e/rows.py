"""One results row per job and run (docs/e2e.md "results.json"), from the Master's view of the
job and the metric lines its workers wrote."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

from workloads.metrics import busy_rate_mbps, wire_rate_mbps

from .fidelity import RATE_STEADY, RING_PACE, starved_share


# --- one run: one scheduler, one seed ----------------------------------------------------------
def measured_mbps(records: list[dict], outgoing: int) -> float | None:
    """Goodput of a sender's inter-node flow while its collective runs: the median over
    iterations of payload bytes sent / collective time, split evenly over its `outgoing`
    inter-node flows. Application payload only (no TCP/IP headers), and the collective's waits
    for its slowest flow count as time: a lower bound of what the network delivered."""
    rates = [
        r["payload_tx_bytes"] * 8 / r["comm_s"] / 1e6
        for r in records
        if r.get("type") == "iter" and r.get("comm_s", 0) > 0 and r.get("payload_tx_bytes")
    ]
    rates = rates[2:] if len(rates) > 4 else rates  # the first iterations include warm-up
    return round(statistics.median(rates) / max(outgoing, 1), 3) if rates else None


def tcp_view(sender: list[dict], receiver: list[dict]) -> dict:
    """The network's view of one flow, from the kernel counters the sender's last record (its
    end, or its last evaluation if it was stopped) has of its connection to the receiver's
    address (`workloads.metrics.tcp_send_counters`):
    `tcp_mbps` (goodput while the socket had data to send: what the shaping and the switches
    delivered, application pauses excluded), `wire_mbps` (the same time's bytes on the wire,
    headers and retransmissions included: what the grant limits), the retransmitted share, the
    share of busy time the receiver's window held it back, and its retransmission timeouts and
    the seconds it spent recovering from them (None where the kernel does not count them)."""
    c = _last_tcp(sender).get("peers", {}).get(_address(receiver))
    if not c or not c.get("busy_us"):
        return {"tcp_mbps": None, "wire_mbps": None}
    return {
        "tcp_mbps": busy_rate_mbps(c),
        "wire_mbps": wire_rate_mbps(c),
        "tcp_retrans_share": round(c.get("bytes_retrans", 0) / max(c["bytes_acked"], 1), 5),
        "tcp_rwnd_limited_share": round(c.get("rwnd_limited_us", 0) / c["busy_us"], 4),
        "tcp_rto": c.get("rto_count"),
        "tcp_rto_s": None if c.get("rto_ms") is None else round(c["rto_ms"] / 1000, 3),
    }


def _last_tcp(records: list[dict]) -> dict:  # end, or the last evaluation of a stopped task
    return next((r["tcp"] for r in reversed(records) if "tcp" in r), {})


def _address(records: list[dict]) -> str | None:
    """A task's address on the testbed, as its TCP counters name it."""
    return _last_tcp(records).get("address")


def _steps(history: list, flow: str) -> list[tuple[float, float]]:
    """(since, Mbit/s) of each rate the Master noted for `flow`."""
    return [(t, rates[flow]) for t, rates in history if flow in rates]


def installed_mbps(
    history: list, flow: str, start: float, end: float | None
) -> tuple[float, float] | None:
    """What the network let `flow` ("src>dst") through from `start` to `end` (its grant and its
    share of the spare capacity; the Master notes each change as [t, {flow: Mbit/s}]): (the
    time-weighted mean, the highest); None without a note."""
    steps = _steps(history, flow)
    if not steps:
        return None
    end = end if end is not None else steps[-1][0]
    total = weight = 0.0
    for (t, mbps), (t_next, _) in zip(steps, steps[1:] + [(max(end, steps[-1][0]), None)]):
        span = max(min(t_next, end) - max(t, start), 0.0)
        total, weight = total + mbps * span, weight + span
    mean = total / weight if weight > 0 else steps[-1][1]
    return round(mean, 3), max(mbps for _, mbps in steps)


def installed_steady(history: list, flow: str, start: float, end: float) -> float | None:
    """The rate `flow` was installed at from `start` to `end` if it held one rate all along
    (within RATE_STEADY), else None: when it changed, the seconds the flow's socket was busy may
    fall at either rate, and no one rate is what the network let through then. A flow that sends
    a fixed amount per iteration is busy longer while its rate is low: installed at 20 for half
    an interval and 190 for the other half, busy throughout the first and a tenth of the second,
    it sends 195 Mbit in 5.5 busy seconds where the interval's mean rate (105) would expect 578
    (0.34)."""
    steps = _steps(history, flow)
    held = [
        mbps
        for (t, mbps), (t_next, _) in zip(steps, steps[1:] + [(math.inf, None)])
        if t < end and t_next > start
    ]
    if not held or max(held) > (1 + RATE_STEADY) * min(held):
        return None
    found = installed_mbps(history, flow, start, end)
    return found[0] if found else None


def contended_periods(notes: list, flow: str, end: float | None) -> list[tuple[float, float]]:
    """The spans in which `flow` ("src>dst") crossed a contended link, from the Master's notes
    [[since, t, [flows]], ...] (the set changed between its readings at `since` and `t`): from
    the `since` of the note that adds it to the `t` of the note that drops it (or `end`)."""
    spans, start = [], None
    for since, t, flows in notes:
        if flow in flows and start is None:
            start = since
        elif flow not in flows and start is not None:
            spans.append((start, t))
            start = None
    if start is not None:
        spans.append((start, end if end is not None else float("inf")))
    return spans


def wire_ratio(
    sender: list[dict],
    address: str | None,
    history: list,
    flow: str,
    contended: Sequence[tuple[float, float]] = (),
    ring: Sequence[str] = (),
    least_busy_s: float = 0.2,
) -> tuple[float | None, float | None]:
    """What the sender put on the wire against what the network let `flow` through, interval by
    interval: between two of its counter snapshots (each evaluation and the end), the wire rate
    while its socket was busy (`wire_rate_mbps` of the difference) against the installed rate of
    those same seconds (`installed_mbps`), weighted by busy time — Σ bits on the wire / Σ
    installed rate × busy time. One mean over the whole run would set the seconds the socket was
    busy against seconds it was not, while a flow's share of the spare moves as jobs start and
    end. Left out, the intervals in which something other than the grant held the flow back:
    those that overlap a `contended` span (`contended_periods`: the link did), and for a flow of
    a ring those in which it was installed above 1.01 × the least of the ring's other flows
    (`ring`, their "src>dst" keys): it then waits for data at that flow's pace; and those in
    which its installed rate changed (`installed_steady`).
    Returns (the ratio, the busy seconds judged); (None, 0) when every interval that could be
    judged was left out so; (None, None) without the sender's clock or counters, or without an
    interval long enough to judge."""
    start = next((r.get("clock_start") for r in sender if r.get("type") == "data"), None)
    if start is None or address is None:
        return None, None
    snaps: list[tuple[float, dict]] = [(start, {})]
    for r in sender:
        c = r.get("tcp", {}).get("peers", {}).get(address)
        if c and r.get("type") in ("eval", "end"):
            snaps.append((start + (r["elapsed_s"] if r["type"] == "eval" else r["train_s"]), c))
    if len(snaps) == 1:
        return None, None
    on_wire = expected = judged_us = left_out_us = 0.0
    for (t0, before), (t1, after) in itertools.pairwise(snaps):
        counted = (
            "busy_us",
            "bytes_sent",
            "data_segs_out" if "data_segs_out" in after else "segs_out",
        )
        diff = {k: after.get(k, 0) - before.get(k, 0) for k in counted}
        rates = installed_mbps(history, flow, t0, t1)
        wire = wire_rate_mbps({**diff, "options": after.get("options", 0)})
        if (
            diff["busy_us"] < least_busy_s * 1e6
            or min(diff.values()) < 0
            or not rates
            or wire is None
        ):  # too short to judge, or another connection took over
            continue
        paced = [r[0] for r in (installed_mbps(history, f, t0, t1) for f in ring) if r]
        steady = installed_steady(history, flow, t0, t1)
        if (
            any(a < t1 and t0 < b for a, b in contended)
            or (paced and rates[0] > RING_PACE * min(paced))
            or steady is None
        ):
            left_out_us += diff["busy_us"]
            continue
        on_wire += wire * diff["busy_us"]
        expected += steady * diff["busy_us"]
        judged_us += diff["busy_us"]
    if expected == 0 and left_out_us == 0:
        return None, None  # nothing to judge by interval: the whole run's figure is all there is
    return (round(on_wire / expected, 4) if expected > 0 else None), round(judged_us / 1e6, 3)


def mark_shared_pairs(rows: list[dict]) -> None:
    """Set `pair_shared` on every flow of a run's rows: whether its grant is enforced and another
    enforced flow, of a job attempt that ran at the same time, has the same sender and receiver
    nodes. The Network Controller enforces per node pair (one meter, one tc class at the sum of
    the pair's grants: the workers of a node share its address), so such a flow may use what the
    other leaves idle, or lose to it what TCP shares evenly: its own grant is not what holds it
    back."""

    def span(r: dict) -> tuple[float, float]:
        return r.get("started_at") or 0.0, r.get("ended_at") or math.inf

    enforced = [(span(r), f) for r in rows for f in r["flows"] if f["granted_mbps"]]
    for r in rows:
        (a, b) = span(r)
        for f in r["flows"]:
            f["pair_shared"] = bool(f["granted_mbps"]) and any(
                g is not f
                and (g["src_node"], g["dst_node"]) == (f["src_node"], f["dst_node"])
                and a < d
                and c < b
                for (c, d), g in enforced
            )


def workers_cpu(attempt: dict, records: dict[str, list[dict]]) -> list[dict]:
    """What the host's scheduler gave each worker of the attempt, from its last `cpu` counters
    (`workloads.metrics.cpu_counters`, host seconds: its end, or its last evaluation when it was
    stopped) and the share of its runnable time it waited for a core (`fidelity.starved_share`)."""
    out = []
    for task, worker in attempt["workers"].items():
        cpu = next((r["cpu"] for r in reversed(records.get(worker, [])) if "cpu" in r), None)
        if cpu:
            out.append(
                {
                    "task": task,
                    "node": attempt["placement"].get(task),
                    **cpu,
                    "starved_share": starved_share(cpu),
                }
            )
    return out


def job_row(scheduler: str, seed: int, base: str, view: dict, timed_out: bool) -> dict:
    """One results row (see docs/e2e.md "results.json") from the Master's view of a job."""
    att = view["attempts"][-1] if view["attempts"] else None
    records = view.get("records", {})
    rank0 = records.get(att["workers"][view["tasks"][0]], []) if att else []
    evals = [r for r in rank0 if r.get("type") == "eval"]
    end = next((r for r in rank0 if r.get("type") == "end"), None)
    start = next((r for r in rank0 if r.get("type") == "start"), {})
    iters = [r["iter_s"] for r in rank0 if r.get("type") == "iter"]
    calls = [r["comm_calls"] for r in rank0 if r.get("type") == "iter" and "comm_calls" in r]
    reached = bool(end and end.get("reached_target"))
    network = att.get("network", "enforced") if att else None
    flows = []
    if att:
        out_count: dict[str, int] = {}
        for f in att["flows"]:
            out_count[f["src"]] = out_count.get(f["src"], 0) + 1
        inter_node = [f"{f['src']}>{f['dst']}" for f in att["flows"]]
        for f in att["flows"]:
            sender = records.get(att["workers"][f["src"]], [])
            receiver = records.get(att["workers"][f["dst"]], [])
            # A best-effort flow has no grant: its rate is only what the decision expected.
            grant = f["rate_mbps"] if network == "enforced" else None
            key = f"{f['src']}>{f['dst']}"
            rates = (
                installed_mbps(
                    att.get("installed", []), key, att.get("started_at", 0.0), att.get("ended_at")
                )
                if grant
                else None
            )
            mean, peak = rates if rates else (grant, grant)
            spans = contended_periods(att.get("contended", []), key, att.get("ended_at"))
            ring = (
                tuple(k for k in inter_node if k != key) if view.get("collective") == "ring" else ()
            )
            ratio, judged = (
                wire_ratio(sender, _address(receiver), att.get("installed", []), key, spans, ring)
                if grant
                else (None, None)
            )
            flows.append(
                {
                    **f,
                    "rate_mbps": mean,
                    "rate_max_mbps": peak,
                    "granted_mbps": grant,
                    "measured_mbps": measured_mbps(sender, out_count[f["src"]]),
                    **tcp_view(sender, receiver),
                    "wire_ratio": ratio,
                    "judged_busy_s": judged,
                    "contended_s": round(sum(b - a for a, b in spans if b < float("inf")), 2),
                    # what the flow was judged by, so that a reader can judge it again (with
                    # the sender's counters in agents/)
                    "installed": [[t, r[key]] for t, r in att.get("installed", []) if key in r]
                    if grant
                    else None,
                    "contended_spans": [[a, b if b < math.inf else None] for a, b in spans],
                }
            )
    state = "timeout" if timed_out else view["state"]
    return {
        "scheduler": scheduler,
        "seed": seed,
        "job": base,
        "collective": view["collective"],
        "model": view["workload"].get("model", ""),
        # the model's gradient and the exchanges an iteration makes of it (DDP's buckets), for
        # the verdict's view of a ring's flows against their grant's burst (`fidelity.wire_top`)
        "gradient_bytes": start.get("gradient_bytes"),
        "comm_calls": statistics.median(calls) if calls else None,
        "state": state,
        "reason": view["reason"],
        "reached_target": reached,
        "tta_s": end.get("tta_s") if reached else None,
        "final_accuracy": evals[-1]["accuracy"] if evals else None,
        "jct_s": view["jct_s"] if state == "finished" else None,
        "startup_s": end.get("startup_s") if end else None,
        "iterations": end.get("iters") if end else (len(iters) or None),
        "median_iter_s": round(statistics.median(iters), 4) if iters else None,
        "predicted_iter_s": att.get("predicted_iteration_s") if att else None,
        "decision_ms": round(att["decision_s"] * 1000, 3) if att else None,
        "attempts": len(view["attempts"]),
        "placement": att["placement"] if att else {},
        "started_at": att.get("started_at") if att else None,
        "ended_at": att.get("ended_at") if att else None,
        "network": network,
        "adjustments": att.get("adjustments", []) if att else [],
        "flows": flows,
        "workers": workers_cpu(att, records) if att else [],
        "curve": [[round(e["elapsed_s"], 3), e["accuracy"]] for e in evals],
        "events": view["events"],
    }
