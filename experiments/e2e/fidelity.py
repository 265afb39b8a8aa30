"""Is a run faithful? The invariants an emulation must hold for its figures to be the emulated
system's and not the host's (Mininet-HiFi, Handigol et al., CoNEXT 2012: isolate CPU and links,
monitor invariants, and say per run whether it held them), checked on every run:

- the switches' CPU: the share of the run in which ovs-vswitchd's forwarding thread (on the
  userspace datapath it forwards every packet, for every switch) waited for a core: a host short
  of CPU delays every packet there first;
- the host's CPU: the share of the run's seconds in which the host's cores were (nearly) all
  busy: when they are, a node's task that its quota lets run waits for a core
  (`machine.HostBusy`);
- each binding flow on the wire: what its sender put on the wire while busy against the rate
  installed for it (`rows.wire_ratio`), for the flows their own grant holds back, of the
  collectives that stream (`binding_flows`, `STREAMING`), up to what the grant's burst adds
  where a ring moves little per exchange (`wire_top`);
- the switches: packets their ports dropped on receive (the userspace datapath did not read them
  in time) against packets received.

Reported beside them, judging nothing: the host's pressure stall information (`cpu_stalled_share`,
PSI `some`), which counts a task its own CPU quota throttles as waiting for a core, so that a run
of quota-limited workers shows it high on an idle host; and each worker's own counters
(`starved_share`: its training thread's waits less its cgroup's throttled time), which on cgroup v1
mix the host's contention with the worker's threads taking turns under its quota and with the
scheduler's wake-up latency: a task weighted like a node, busy 0.5 ms every 20 ms under no quota,
waited 35-41 % of the time it wanted a core at K = 6 with the host 37-40 % busy.
(PSI measured: one busy loop at --cpus 0.2 on an idle 2-core host, `some` 75 % with the host 13 %
busy.) And the flows' TCP retransmission timeouts (`tcp_timeouts`, `tcp_rto_s_max`: the most
seconds one flow spent recovering from them): a flow that waits out a timeout, then one twice
as long, stalls its ring for seconds, as the Network Manager's leaves did when they followed
their grants (edge/tc.py). That is the emulated system's own shaping, not the host, so it judges
nothing; it says where such a run's time went.

The thresholds are here and nowhere else (docs/testbed.md, "Fidelity", gives their measurements).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from edge import tc

# The share of a run the switches' forwarding thread may wait for a core.
SWITCH_WAIT_MAX = 0.10
# A second in which at least this share of the host's cores is busy is a saturated one; a run may
# have at most HOST_SATURATED_MAX of its seconds saturated.
HOST_SATURATED, HOST_SATURATED_MAX = 0.90, 0.10
# Binding flows on the wire against their grant: the meter and the HTB class pass 0.92-1.0 of a
# rate to TCP on this datapath (docs/sdn_app.md); above 1.05 something bypassed them — beyond
# what the class's token bucket lets through at line rate after an idle moment (`wire_top`).
WIRE_BAND = (0.90, 1.05)
# Packets the switches dropped on receive, per packet received.
SWITCH_DROP_MAX = 1e-3

# What the band's text adds where `wire_top` raised a flow's top.
RAISED = "the top raised by the grant's burst where a ring moves little per exchange"
# The collectives whose flows stream, and so are judged on the wire. A ring all-reduce sends
# step after step, its socket busy while its grant holds it. The others (star, tree, all-to-all,
# custom) send one message per flow and round. A message starts with the class's burst at line
# rate, and its busy time ends with the wait for its last acknowledgement, which the receiver's
# CPU and the kernel's timers set (delayed ACKs, tail loss probes: host clock, not dilated). On
# an idle host, between gloo workers that spend their quota training, such a flow read far on
# both sides of the band, and higher the larger K (experiments/bench_wire.py --compute;
# docs/workloads.md, "The mixed scenario"): the band tells nothing of the host there.
STREAMING = ("ring",)
# A ring's flow installed above this × the least of its ring's other flows waits for data at that
# flow's pace rather than being held back by its own rate (`binds`, `rows.wire_ratio`).
RING_PACE = 1.01
# An interval of a flow is judged only if its installed rate stayed within this (relative) of one
# rate throughout: the Master re-notes rates it recomputes, which may differ by rounding
# (`rows.installed_steady`).
RATE_STEADY = 0.01


# --- which flows a grant holds back --------------------------------------------------------------
def collective(row: dict) -> str:
    """A job row's collective; a row recorded before jobs had other collectives ran a ring."""
    return row.get("collective", "ring")


def ring_bottleneck(row: dict) -> float | None:
    """The smallest grant of a ring job's inter-node flows (None for other collectives, or no
    grant): a ring's flows advance in lockstep, so none carries more than this."""
    grants = [f["rate_mbps"] for f in row["flows"] if (f["rate_mbps"] or 0) > 0]
    return min(grants) if collective(row) == "ring" and grants else None


def binds(flow: dict, ring_bottleneck_mbps: float | None) -> bool:
    """Whether the flow's own grant holds it back (`binding_flows`); a best-effort flow has no
    grant, and one whose node pair carries another enforced flow (`rows.mark_shared_pairs`)
    shares the pair's class rather than being held to its own grant."""
    grant = flow["rate_mbps"]
    return (
        grant is not None
        and grant > 0
        and not flow.get("pair_shared")
        and (ring_bottleneck_mbps is None or grant <= RING_PACE * ring_bottleneck_mbps)
    )


def binding_flows(row: dict) -> list[dict]:
    """The inter-node flows that their own grant holds back, of a collective whose flows stream
    (`STREAMING`). A ring's flows advance together at the pace of its smallest grant, so a flow
    granted more sends what reaches it from upstream as it comes: its socket stays busy with a
    trickle, and its rate says nothing of the network."""
    if collective(row) not in STREAMING:
        return []
    top = ring_bottleneck(row)
    return [f for f in row["flows"] if binds(f, top)]


def wire_top(row: dict, flow: dict) -> float:
    """The top of the wire band for `flow` of `row`: WIRE_BAND's, raised by what its grant's
    token bucket adds where a ring moves little per exchange. Bytes through a class of rate r and
    burst B (`edge.tc.burst_bytes`, 4 ms of r; the law and its probe are there) in a busy time
    T are at most r × T + B: a sender that idled finds the bucket full, and its first B bytes go
    out at line rate. A ring's sender idles between iterations and between their exchanges —
    one all-reduce per DDP gradient bucket (`comm_calls`), within which gloo keeps two segments
    in flight and so does not idle — so over an iteration of P bytes (2(k − 1)/k of the gradient,
    each flow of a k-rank ring) and n exchanges it reads up to P / (P − n × B) × r while busy,
    B taken at the flow's highest installed rate (the class's burst follows its rate). Counting
    one idle per exchange errs toward the plain band, never toward passing a flow that bypassed
    its shaper; where n × B ≥ P everything an iteration sends can go out as bursts, and there is
    no top. The small CNN (406 504 bytes: P = 542 KB) installed at 160 Mbit/s (an 80 KB burst,
    one bucket) may read 1.05 × 1.17; mlp-large (8 966 184 bytes, two buckets) at the same rate
    1.05 × 1.014. Rows recorded before they held `gradient_bytes` and `comm_calls` are judged
    by WIRE_BAND alone, as they were."""
    rate = flow.get("rate_max_mbps") or flow.get("rate_mbps")
    ranks, calls = len(row.get("placement") or {}), row.get("comm_calls")
    if collective(row) != "ring" or not row.get("gradient_bytes") or not calls or ranks < 2:
        return WIRE_BAND[1]
    per_iter = 2 * (ranks - 1) / ranks * row["gradient_bytes"]
    bursts = calls * tc.burst_bytes(rate) if rate else 0
    return WIRE_BAND[1] * per_iter / (per_iter - bursts) if per_iter > bursts else math.inf


def in_band(ratio: float, top: float = WIRE_BAND[1]) -> bool:
    """Whether a ratio to the grant lies in WIRE_BAND, with `top` (`wire_top`) its top."""
    return WIRE_BAND[0] <= ratio <= top


def raised(judged: list[tuple[float, float]]) -> bool:
    """Whether `wire_top` raised the top of any of these (ratio, top): the texts then say so
    (`RAISED`)."""
    return any(top != WIRE_BAND[1] for _, top in judged)


def judged_ratios(row: dict, measure: str = "wire_mbps") -> list[tuple[dict, float]]:
    """(flow, `measure` / granted rate) of the flows their grant holds back (`binding_flows`);
    by default what the sender put on the wire while its socket was busy (`rows.tcp_view`): the
    bytes the grant's shaper and meter count, judged interval by interval where the sender's
    counters allow (`rows.wire_ratio`: without the seconds its path crossed a contended link,
    or its ring was paced by another flow)."""
    out = []
    for f in binding_flows(row):
        if f.get(measure) is None:
            continue
        if measure == "wire_mbps" and f.get("wire_ratio") is not None:
            out.append((f, f["wire_ratio"]))
        elif measure == "wire_mbps" and f.get("judged_busy_s") is not None:
            continue  # every interval left out: the grant held nothing back there
        elif not f.get("contended_s"):  # a whole-run figure would count the contended seconds
            out.append((f, f[measure] / f["rate_mbps"]))
    return out


def rate_ratios(row: dict, measure: str = "wire_mbps") -> list[float]:
    """The ratios of `judged_ratios`."""
    return [x for _, x in judged_ratios(row, measure)]


def over_grant(row: dict) -> list[dict]:
    """Flows, binding or not, whose sender got more than the band's top (`wire_top`) × its
    grant."""
    return [
        f
        for f in row["flows"]
        if f.get("wire_mbps") is not None
        and f["rate_mbps"]
        and f["wire_mbps"] > wire_top(row, f) * f["rate_mbps"]
    ]


# --- the workers' CPU ----------------------------------------------------------------------------
def starved_share(cpu: dict) -> float | None:
    """Of the time a worker's training thread was runnable and its quota let it run, the share it
    waited for a core: (wait − throttled) / (on a core + wait − throttled), from its `cpu`
    counters (host seconds; `workloads.metrics.cpu_counters`); None without them."""
    if not cpu or cpu.get("throttled_s") is None or cpu.get("main_wait_s") is None:
        return None
    waited = max(cpu["main_wait_s"] - cpu["throttled_s"], 0.0)
    entitled = cpu["main_used_s"] + waited
    return round(waited / entitled, 4) if entitled > 0 else None


# --- the verdict ---------------------------------------------------------------------------------
def verdict(run: dict) -> dict[str, Any]:
    """Whether `run` (one results.json run: its jobs' rows with their flows and workers' CPU, its
    `switch_wait_share`, `host_busy` and `switch_drops`) held every invariant: {"faithful", "reasons" (one
    line per broken invariant), and per invariant what was measured}. An invariant nothing could
    be measured for (no binding flow, a physical switch) is not held against the run."""
    reasons: list[str] = []
    switch_wait = run.get("switch_wait_share")
    if switch_wait is not None and switch_wait > SWITCH_WAIT_MAX:
        reasons.append(
            f"the switches' forwarding thread waited for a core {switch_wait:.0%} of the run "
            f"(> {SWITCH_WAIT_MAX:.0%})"
        )
    saturated = (run.get("host_busy") or {}).get("saturated_share")
    if saturated is not None and saturated > HOST_SATURATED_MAX:
        reasons.append(
            f"the host's cores were {HOST_SATURATED:.0%} busy or more in {saturated:.0%} of the "
            f"run's seconds (> {HOST_SATURATED_MAX:.0%})"
        )
    starved = [
        w["starved_share"]
        for row in run.get("jobs", [])
        for w in row.get("workers", [])
        if w.get("starved_share") is not None
    ]
    timeouts = [
        (f["tcp_rto"], f.get("tcp_rto_s") or 0.0)
        for row in run.get("jobs", [])
        for f in row.get("flows", [])
        if f.get("tcp_rto") is not None
    ]
    judged = [(x, wire_top(row, f)) for row in run.get("jobs", []) for f, x in judged_ratios(row)]
    ratios = [x for x, _ in judged]
    outside = [x for x, top in judged if not in_band(x, top)]
    if outside:
        reasons.append(
            f"{len(outside)} of {len(ratios)} binding flows outside {WIRE_BAND[0]}-"
            f"{WIRE_BAND[1]} of their grant on the wire (min {min(ratios):.2f}, max "
            f"{max(ratios):.2f}{f'; {RAISED}' if raised(judged) else ''})"
        )
    drops = run.get("switch_drops") or {}
    drop_share = drops["rx_dropped"] / drops["rx_packets"] if drops.get("rx_packets") else None
    if drop_share is not None and drop_share > SWITCH_DROP_MAX:
        reasons.append(
            f"the switches dropped {drops['rx_dropped']} of {drops['rx_packets']} packets on "
            f"receive ({drop_share:.2%} > {SWITCH_DROP_MAX:.1%})"
        )
    # A run spread over several hosts (run.py --cluster): each host judged on its own switches
    # and cores (its `usage`), its reasons the run's too.
    hosts = {name: verdict(h) for name, h in (run.get("hosts") or {}).items()}
    reasons += [f"{name}: {r}" for name, v in hosts.items() for r in v["reasons"]]
    return {
        "faithful": not reasons,
        "reasons": reasons,
        **({"hosts": hosts} if hosts else {}),
        "cpu_stalled_share": run.get("cpu_stalled_share"),
        "switch_wait_share": switch_wait,
        "host_saturated_share": saturated,
        "workers_starved_max": max(starved) if starved else None,
        "binding_flows": len(ratios),
        "binding_in_band": len(ratios) - len(outside),
        "wire_ratio_median": round(statistics.median(ratios), 3) if ratios else None,
        "switch_drop_share": None if drop_share is None else round(drop_share, 6),
        "tcp_timeouts": sum(n for n, _ in timeouts) if timeouts else None,
        "tcp_rto_s_max": max(s for _, s in timeouts) if timeouts else None,
    }
