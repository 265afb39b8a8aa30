#!/usr/bin/env python3
"""summary.md and results.csv from an end-to-end run's results.json.

    python experiments/report.py results/e2e/default-campus/results.json [--out DIR]

Time-to-accuracy is the workload's own (MLPerf-style: from the first touch of data to the first
evaluation at the target). A run that did not reach the target has no time-to-accuracy; the
comparison of schedulers states how many runs reached it, and also gives the mean with each
unreached run counted at the scenario's timeout (a lower bound of its real time).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import csv
import json
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from experiments.e2e.fidelity import (
    RAISED,
    WIRE_BAND,
    binding_flows,
    in_band,
    judged_ratios,
    over_grant,
    raised,
    rate_ratios,
    ring_bottleneck,
    verdict,
    wire_top,
)
from experiments.machine import QUIET_BUSY, QUIET_S, QUIET_TIMEOUT_S
from experiments.stats import Ratio, paired_ratio
from scheduler import compose
from scheduler.baselines import algorithm_factory

# Targets of the headline comparisons (issue 47): CES-PPO's mean TTA over jobs against the best
# network-blind baseline run best-effort, and against each scheduler composed from parts.
TARGET_BLIND, TARGET_PARTS = 0.75, 0.90
CSV_FIELDS = (
    "scheduler",
    "seed",
    "job",
    "collective",
    "model",
    "state",
    "reached_target",
    "tta_s",
    "final_accuracy",
    "jct_s",
    "startup_s",
    "iterations",
    "median_iter_s",
    "predicted_iter_s",
    "decision_ms",
    "attempts",
    "network",
    "placement",
    "flows",
    "min_rate_mbps",
    "rate_ratio_median",
    "adjustments",
    "reason",
)


def faithful(run: dict) -> bool:
    """Whether a run held the emulation's invariants (`fidelity.verdict`; a run recorded before
    runs were judged counts as it stands)."""
    return run.get("fidelity", {}).get("faithful", True)


def runs_judged(results: dict) -> list[dict]:
    """The runs the figures are made of: the faithful ones (an unfaithful run was re-run, and
    every attempt is kept in results.json with its verdict)."""
    return [run for run in results.get("runs", []) if faithful(run)]


def rows(results: dict) -> list[dict]:
    """Every (scheduler, seed, job) row of the faithful runs."""
    return [row for run in runs_judged(results) for row in run["jobs"]]


def bottleneck_ratios(row: dict) -> list[float]:
    """Measured / the smallest grant of the job's inter-node flows, for ring jobs: a ring's
    flows advance in lockstep, so none can carry more than its slowest grant. A ring without a
    grant: `rate_ratios` (none); other collectives' flows are messages, not judged so
    (`fidelity.STREAMING`)."""
    top = ring_bottleneck(row)
    if top is None:
        return rate_ratios(row, "measured_mbps")
    return [f["measured_mbps"] / top for f in row["flows"] if f.get("measured_mbps") is not None]


def background_mbps(results: dict, bg: dict) -> float | None:
    """Mean measured rate of a background flow on its first link, over every run's samples."""
    if not bg.get("path"):
        return None
    key = f"{bg['src']}>{bg['path'][0]}"
    xs = [
        x
        for run in results.get("runs", [])
        for x in run["links"]["mbps"].get(key, [])
        if x is not None
    ]
    return statistics.fmean(xs) if xs else None


def mean_std(xs: Iterable[float]) -> tuple[float | None, float | None]:
    xs = list(xs)
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def tta_censored(row: dict, timeout_s: float) -> float:
    return row["tta_s"] if row["reached_target"] else timeout_s


def job_ttas(results: dict) -> dict[tuple[str, str], list[float]]:
    """(scheduler, job) -> its TTA in every faithful run, an unreached target at the timeout."""
    out: dict[tuple[str, str], list[float]] = {}
    for r in rows(results):
        out.setdefault((r["scheduler"], r["job"]), []).append(
            tta_censored(r, results["scenario"]["timeout_s"])
        )
    return out


def jct_censored(row: dict, timeout_s: float) -> float:
    return row["jct_s"] if row["jct_s"] is not None else timeout_s


def per_run(results: dict, timeout_s: float) -> dict[str, list[dict]]:
    """Per scheduler, one entry per run: the mean TTA over its jobs, their mean JCT and its
    makespan (the last job's completion; unreached targets and unfinished jobs counted at the
    timeout). TTA runs from a job's first touch of data (MLPerf), so it leaves out the wait in
    the queue; JCT runs from submission and counts it: a scheduler that holds a job back until it
    can run fast shows a short TTA and a long JCT (docs/e2e.md, the star)."""
    out: dict[str, list[dict]] = {}
    for run in runs_judged(results):
        if run["jobs"]:
            out.setdefault(run["scheduler"], []).append(
                {
                    "seed": run["seed"],
                    "mean_tta": statistics.fmean(tta_censored(r, timeout_s) for r in run["jobs"]),
                    "mean_jct": statistics.fmean(jct_censored(r, timeout_s) for r in run["jobs"]),
                    "makespan": max(jct_censored(r, timeout_s) for r in run["jobs"]),
                    "reached": sum(r["reached_target"] for r in run["jobs"]),
                    "jobs": len(run["jobs"]),
                }
            )
    return out


def network_blind_best_effort(scheduler: str) -> bool:
    """A network-blind baseline as it runs on a plain network (`scheduler.compose`)."""
    try:
        name, _ = compose.parse(scheduler)
        blind = getattr(algorithm_factory(name), "network_blind", False)
    except ValueError:  # a queue policy (ces-multi), not a single-job algorithm
        return False
    return blind and compose.network_of(scheduler) == "best-effort"


def reaction_times(results: dict) -> dict[str, list[float]]:
    """Per scheduler: seconds from a background flow's start to the first re-route of a job
    after it (runtime adjustment), over the faithful runs."""
    out: dict[str, list[float]] = {}
    for run in results.get("runs", []):
        starts = list(run.get("background_started_at", {}).values())
        if not starts or not faithful(run):
            continue
        first = min(starts)
        after = [
            a["at"] - first
            for r in run["jobs"]
            for a in r.get("adjustments", [])
            if a["at"] >= first
        ]
        if after:
            out.setdefault(run["scheduler"], []).append(min(after))
    return out


def adjustment_effect(results: dict, timeout_s: float) -> list[str]:
    """Runtime adjustment on vs off: for every scheduler X run beside X/static, the TTA of the
    jobs a background is sent along (or that X re-routed), mean ± sd over seeds."""
    along = {b["along"] for b in results.get("background", []) if b.get("along")}
    tta: dict[tuple[str, str], list[float]] = {}
    for r in rows(results):
        tta.setdefault((r["scheduler"], r["job"]), []).append(tta_censored(r, timeout_s))
    lines = []
    ran = {run["scheduler"] for run in results.get("runs", [])}
    for s in sorted(ran):
        off = f"{s}/static"
        if off not in ran:
            continue
        affected = sorted(
            along
            | {r["job"] for r in rows(results) if r["scheduler"] == s and r.get("adjustments")}
        )
        for job in affected:
            on_m, on_s = mean_std(tta.get((s, job), []))
            off_m, off_s = mean_std(tta.get((off, job), []))
            if on_m is not None and off_m is not None:
                lines.append(
                    f"`{job}`: {_f(on_m)} ± {_f(on_s)} s with `{s}`, {_f(off_m)} ± "
                    f"{_f(off_s)} s with `{off}` ({100 * (1 - on_m / off_m):.0f}% lower)"
                )
    if not lines:
        return []
    return [
        "**Runtime adjustment on vs off** (time to accuracy of the affected jobs, unreached "
        f"counted at {timeout_s:g} s): " + "; ".join(lines) + ".",
        "",
    ]


def paired(runs: dict[str, list[dict]], ours: str, other: str, key: str):
    """`ours` / `other` of figure `key` over the seeds both ran faithfully (`stats.Ratio`), or
    None when they share none."""
    theirs = {x["seed"]: x[key] for x in runs.get(other, [])}
    pairs = [(x[key], theirs[x["seed"]]) for x in runs.get(ours, []) if x["seed"] in theirs]
    if not pairs:
        return None
    return paired_ratio([a for a, _ in pairs], [b for _, b in pairs])


def comparisons(results: dict, timeout: float) -> list[dict]:
    """CES-PPO against the best network-blind baseline run best-effort (target: mean TTA ratio
    below TARGET_BLIND) and against each scheduler composed from parts (below TARGET_PARTS):
    {"other", "target", "tta": Ratio, "jct": Ratio, "verdict"} paired by seed over faithful runs.
    results.json keeps them (`comparisons`), and the summary states them."""
    runs = per_run(results, timeout)
    if "ces-ppo" not in runs:
        return []
    blind = [s for s in runs if network_blind_best_effort(s)]
    others = []
    if blind:
        best = min(blind, key=lambda s: mean_std(x["mean_tta"] for x in runs[s])[0])
        others.append((best, TARGET_BLIND))
    others += [(s, TARGET_PARTS) for s in runs if "/" in s and s != "ces-ppo"]
    out = []
    for other, target in others:
        tta, jct = (paired(runs, "ces-ppo", other, key) for key in ("mean_tta", "mean_jct"))
        if tta is not None:
            out.append(
                {
                    "other": other,
                    "target": target,
                    "tta": tta,
                    "jct": jct,
                    "verdict": tta.judge(target),
                }
            )
    return out


def comparisons_json(results: dict, timeout: float) -> list[dict]:
    """`comparisons` as results.json keeps them."""
    return [
        {**c, "tta": c["tta"].to_json(), "jct": c["jct"] and c["jct"].to_json()}
        for c in comparisons(results, timeout)
    ]


def rejudge(results: dict) -> str | None:
    """Judge every run of `results` again by today's `fidelity.verdict`, in place, from the
    figures results.json keeps (what was derived from the senders' records as the run ended —
    `wire_ratio`, `pair_shared` — is taken as it stands); or say why not (None: done). A run
    whose verdict changes keeps the old one (`fidelity_at_run`), `rejudged` says when and how
    many changed, and comparisons stored at a set's end are made again. Refused for a set with
    re-runs: an attempt made because an earlier one was judged unfaithful would count beside
    it."""
    runs = results.get("runs", [])
    if any(run.get("attempt", 1) > 1 for run in runs):
        return "runs: it holds re-run attempts, made by the rules they were judged by"
    timeout = results.get("scenario", {}).get("timeout_s")
    if timeout is None:
        return "scenario.timeout_s: missing (the comparisons count an unreached target at it)"
    changed = 0
    for run in runs:
        now = verdict(run)
        if now["faithful"] != faithful(run):
            run.setdefault("fidelity_at_run", run.get("fidelity"))
            changed += 1
        run["fidelity"] = now
    results["rejudged"] = {"at": time.strftime("%Y-%m-%d"), "changed": changed}
    if "comparisons" in results:  # an unfinished set has none: run.py writes them at its end
        results["comparisons"] = comparisons_json(results, timeout)
    return None


def settle(ratio: Ratio, target: float, verdict: str, unit: str = "seeds") -> str:
    """' (N seeds would settle it)' for an inconclusive verdict: what settling it costs, in the
    `unit` the ratio is paired over."""
    if verdict != "inconclusive" or ratio.n < 2:  # one seed: its text says there is no interval
        return ""
    m = ratio.seeds_for_verdict(target)
    return f" ({m} {unit} would settle it)" if m else f" (more than 100 {unit} to settle it)"


def headline(runs: dict[str, list[dict]], results: dict) -> list[str]:
    timeout = results.get("scenario", {}).get("timeout_s", 0.0)
    lines = [
        "**CES-PPO against the others**, paired by seed over the faithful runs: the geometric "
        "mean of CES-PPO's mean TTA over jobs / the other's, with its 95 % interval (Student's "
        "t over the seeds' log ratios), and a verdict against the target — `met` when the whole "
        "interval is below it, `missed` when it is wholly above, `inconclusive` when it "
        "straddles it; for an inconclusive one, the seeds that would settle it at the spread "
        "and ratio measured. Mean JCT over jobs beside it.",
        "",
        "| against | target | TTA ratio [95 % interval] | verdict | JCT ratio [95 % interval] |",
        "| --- | --- | --- | --- | --- |",
    ]
    for c in comparisons(results, timeout):
        blind = network_blind_best_effort(c["other"])
        lines.append(
            f"| `{c['other']}`{' (best network-blind, best-effort)' if blind else ''} | "
            f"< {c['target']:g} | {c['tta'].text()} | **{c['verdict']}**"
            f"{settle(c['tta'], c['target'], c['verdict'])} | "
            f"{c['jct'].text() if c['jct'] else '–'} |"
        )
    return [*lines, ""]


def comparison(
    results: dict, all_rows: list[dict], schedulers: list[str], timeout: float
) -> list[str]:
    """The comparison of schedulers over runs, and CES-PPO against the best network-blind
    baseline run best-effort and against each scheduler composed from parts."""
    runs = per_run(results, timeout)
    if not runs:
        return []
    lines = [
        "## The comparison",
        "",
        "Per run: the mean time-to-accuracy over its jobs (from each job's first touch of "
        "data), their mean completion time (from submission: the wait in the queue "
        "included) and its makespan (the last job's completion), mean ± sd over seeds; an "
        f"unreached target or an unfinished job counts at the timeout ({timeout:g} s).",
        "",
        "| scheduler | network | mean TTA over jobs s | mean JCT over jobs s | makespan s "
        "| targets reached |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    networks = {
        s: {r.get("network") for r in all_rows if r["scheduler"] == s} - {None} for s in schedulers
    }
    for s in schedulers:
        if s not in runs:
            continue
        tta_m, tta_s = mean_std(x["mean_tta"] for x in runs[s])
        jct_m, jct_s = mean_std(x["mean_jct"] for x in runs[s])
        mk_m, mk_s = mean_std(x["makespan"] for x in runs[s])
        lines.append(
            f"| {s} | {', '.join(sorted(networks[s])) or '–'} | {_f(tta_m)} ± "
            f"{_f(tta_s)} | {_f(jct_m)} ± {_f(jct_s)} | {_f(mk_m)} ± {_f(mk_s)} | "
            f"{sum(x['reached'] for x in runs[s])}/{sum(x['jobs'] for x in runs[s])} |"
        )
    lines.append("")
    if "ces-ppo" in runs:
        lines += headline(runs, results)
    reactions = reaction_times(results)
    if reactions:
        lines += [
            "**Runtime adjustment**: from the background's start to the first re-routed "
            "job, "
            + "; ".join(
                f"`{s}` {_f(mean_std(v)[0])} s (max {max(v):.1f}, {len(v)} runs)"
                for s, v in reactions.items()
            )
            + ".",
            "",
        ]
    return lines + adjustment_effect(results, timeout)


def fidelity_section(results: dict) -> list[str]:
    """The run's time dilation and CPU budget, and every run's fidelity verdict."""
    lines = []
    dil = results.get("dilation")
    if dil:
        budget = dil.get("budget") or {}
        lines += [
            f"**Time dilation** K = {dil['factor']:g} ({dil['chosen']}): every link rate, meter, "
            "tc class, CPU quota and tenant rate at 1/K on the host, every period and timeout "
            "× K, every time and rate reported in emulated units."
            + (f" CPU budget: {budget['line']}." if budget.get("line") else ""),
            "",
        ]
    judged = [run for run in results.get("runs", []) if "fidelity" in run]
    if not judged:
        return lines
    good = [run for run in judged if run["fidelity"]["faithful"]]
    reruns = sum(run.get("attempt", 1) > 1 for run in judged)
    lines += [
        "## Fidelity",
        "",
        f"{len(good)} of {len(judged)} runs faithful ({reruns} re-runs of unfaithful ones); the "
        "figures above are made of the faithful runs only. Invariants per run "
        "(`experiments/e2e/fidelity.py`): the share of the run the switches' forwarding thread "
        "waited for a core, the share of the run's seconds in which the host's cores were "
        "(nearly) all busy, the binding flows of a ring on the wire "
        f"within {WIRE_BAND[0]}–{WIRE_BAND[1]} of their grant ({RAISED}), the switches' "
        "receive drops. "
        "Beside them, not judged: the host's pressure stall (PSI `some`: it counts "
        "quota-throttled tasks as waiting), the worst worker's own wait beyond its "
        "throttling (on cgroup v1 its threads' turns under its quota count too), and the "
        "flows' TCP retransmission timeouts (each a stall of the emulated network, not of the "
        "host; `–` where the kernel does not count them)."
        + (
            f" Judged again by later rules (`report.py --rejudge`, {r['at']}): {r['changed']} "
            "runs' verdicts changed; results.json keeps each one's verdict at the time "
            "(`fidelity_at_run`)."
            if (r := results.get("rejudged"))
            else ""
        ),
        "",
        "`#`: the run's place in the set's order (attempts included)"
        + (
            "; `host before`: the seconds the run waited for the host to be quiet (at most "
            f"{100 * QUIET_BUSY:.0f} % of its cores busy for {QUIET_S} s; `busy` when it was "
            f"not, after {QUIET_TIMEOUT_S:.0f} s)."
            if any("host_before" in run for run in judged)
            else "; this set's runs did not wait for a quiet host (`host before`)."
        ),
        "",
        "| scheduler | seed | attempt | # | host before | faithful | switch wait | host saturated "
        "| binding in band | wire/grant median | switch drops | PSI stall | worst worker wait "
        "| TCP timeouts (longest recovery) | host cores used | why not |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
        "| --- | --- |",
    ]
    order = {s: i for i, s in enumerate(results.get("schedulers") or [])}
    place = {id(run): i + 1 for i, run in enumerate(results["runs"])}
    for run in sorted(
        judged,
        key=lambda r: (
            order.get(r["scheduler"], len(order)),
            r["scheduler"],
            r["seed"],
            r.get("attempt", 1),
        ),
    ):
        v = run["fidelity"]
        lines.append(
            f"| {run['scheduler']} | {run['seed']} | {run.get('attempt', 1)} | "
            f"{place[id(run)]} | {_before(run.get('host_before'))} | "
            f"{'yes' if v['faithful'] else '**no**'} | {_pct(v.get('switch_wait_share'))} | "
            f"{_pct(v.get('host_saturated_share'))} | {v.get('binding_in_band', 0)}/"
            f"{v.get('binding_flows', 0)} | {_f(v.get('wire_ratio_median'), 2)} | "
            f"{_pct(v.get('switch_drop_share'), 2)} | {_pct(v.get('cpu_stalled_share'))} | "
            f"{_pct(v.get('workers_starved_max'))} | {_timeouts(v)} | "
            f"{_f((run.get('cpu_cores') or {}).get('host'), 2)} | "
            f"{'; '.join(v['reasons']) or '–'} |"
        )
    return [*lines, ""]


def _before(before: dict | None) -> str:
    if not before:
        return "–"
    return f"{before['waited_s']:.0f} s" + ("" if before["quiet"] else ", busy")


def _pct(x: float | None, digits: int = 0) -> str:
    return "–" if x is None else f"{100 * x:.{digits}f} %"


def write_csv(results: dict, path: Path) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in rows(results):
            ratios = rate_ratios(row)
            w.writerow(
                {
                    **row,
                    "placement": ";".join(f"{t}={n}" for t, n in row["placement"].items()),
                    "flows": len(row["flows"]),
                    "adjustments": len(row.get("adjustments", [])),
                    "min_rate_mbps": min(
                        (f["rate_mbps"] for f in row["flows"] if f["rate_mbps"] is not None),
                        default="",
                    ),
                    "rate_ratio_median": round(statistics.median(ratios), 3) if ratios else "",
                }
            )
    return path


def _band(judged: list[tuple[float, float]]) -> str:
    """(ratio to the grant, the band's top for it: `fidelity.wire_top`) of judged flows."""
    if not judged:
        return "no flow to judge"
    ratios = [x for x, _ in judged]
    inside = sum(in_band(x, top) for x, top in judged)
    return (
        f"median {statistics.median(ratios):.2f} × granted (min {min(ratios):.2f}, max "
        f"{max(ratios):.2f}); {inside} of {len(ratios)} ({100 * inside / len(ratios):.0f}%) "
        f"within {WIRE_BAND[0]}…{WIRE_BAND[1]}{f' ({RAISED})' if raised(judged) else ''}"
    )


def _f(x: Any, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _timeouts(verdict: dict) -> str:
    """A run's TCP retransmission timeouts and the longest a flow spent recovering from them."""
    n = verdict.get("tcp_timeouts")
    return "–" if n is None else f"{n} ({verdict['tcp_rto_s_max']:.1f} s)" if n else "0"


def summary(results: dict) -> str:
    timeout = results.get("scenario", {}).get("timeout_s", 0.0)
    all_rows = rows(results)
    m = results.get("machine", {})
    lines = [
        f"# End-to-end run: scenario `{results['scenario']['name']}` on `{results['topology']}`",
        "",
        results["scenario"].get("description", ""),
        "",
        f"Machine: {m.get('cpu_model', '?')}, {m.get('cores', '?')} cores, "
        f"{m.get('mem_gb', '?')} GB, kernel {m.get('kernel', '?')}, {m.get('datapath', '?')} "
        f"OVS datapath; load average at start {m.get('loadavg', ['?'])[0]}. "
        f"Wall time {_f(results.get('wall_s'), 0)} s (bring-up {_f(results.get('bringup_s'))} s,"
        f" teardown {_f(results.get('teardown_s'))} s); {len(results.get('runs', []))} runs, "
        f"per-run timeout {timeout:g} s.",
        "",
        *fidelity_section(results),
    ]
    if results.get("background"):
        lines.append(
            "Background: "
            + "; ".join(
                f"{b['src']}→{b['dst']} {b['mbps']:g} Mbit/s"
                + (f" via {'-'.join(b['path'])}" if b["path"] else "")
                + (
                    f" (measured {m:.1f} Mbit/s on average)"
                    if (m := background_mbps(results, b)) is not None
                    else ""
                )
                + (
                    f" from {b['start_s']:g} s into each run"
                    if b.get("start_s") is not None
                    else ""
                )
                + ("" if b.get("cordon", True) else ", endpoints shared with jobs")
                for b in results["background"]
            )
            + "; paced iperf3 TCP."
        )
        lines.append("")
    jobs = sorted({r["job"] for r in all_rows}, key=[r["job"] for r in all_rows].index)
    schedulers = results.get("schedulers", [])
    for job in jobs:
        lines += [
            f"## Job `{job}`",
            "",
            "| scheduler | reached | TTA s (mean ± sd, reached) | TTA s (unreached = "
            "timeout) | JCT s | final accuracy | iteration s (measured / predicted) |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for s in schedulers:
            rs = [r for r in all_rows if r["job"] == job and r["scheduler"] == s]
            if not rs:
                continue
            reached = [r for r in rs if r["reached_target"]]
            tta_m, tta_s = mean_std(r["tta_s"] for r in reached)
            cen_m, cen_s = mean_std(tta_censored(r, timeout) for r in rs)
            jct_m, jct_s = mean_std(r["jct_s"] for r in rs if r["jct_s"] is not None)
            acc_m, _ = mean_std(r["final_accuracy"] for r in rs if r["final_accuracy"] is not None)
            it_m, _ = mean_std(r["median_iter_s"] for r in rs if r["median_iter_s"] is not None)
            pr_m, _ = mean_std(
                r["predicted_iter_s"] for r in rs if r["predicted_iter_s"] is not None
            )
            lines.append(
                f"| {s} | {len(reached)}/{len(rs)} | {_f(tta_m)} ± {_f(tta_s)} | "
                f"{_f(cen_m)} ± {_f(cen_s)} | {_f(jct_m)} ± {_f(jct_s)} | "
                f"{_f(acc_m, 3)} | {_f(it_m, 3)} / {_f(pr_m, 3)} |"
            )
        lines.append("")
    lines += comparison(results, all_rows, schedulers, timeout)
    wire = [(x, wire_top(r, f)) for r in all_rows for f, x in judged_ratios(r)]
    goodput = [(x, wire_top(r, f)) for r in all_rows for f, x in judged_ratios(r, "tcp_mbps")]
    ring = [x for r in all_rows for x in bottleneck_ratios(r)]
    if wire or ring:
        lines += [
            "## Measured vs granted rate per flow",
            "",
            "Granted: what the flow's meter and tc class let through (`rate_mbps`), the "
            "time-weighted mean over its job of its grant and its share of the spare "
            "capacity (docs/e2e.md, work-conserving rates).",
            "",
        ]
    if wire:
        measured = sum(f.get("wire_mbps") is not None for r in all_rows for f in r["flows"])
        over = [(r, f) for r in all_rows for f in over_grant(r)]
        over_binding = sum(any(f is b for b in binding_flows(r)) for r, f in over)
        lines += [
            f"What the network carried on the {len(wire)} flows their grant holds back (a "
            "ring's flows granted more than its smallest grant wait for data instead; the "
            "other collectives send a message per flow and round, whose busy time holds its "
            "wait for the last acknowledgement, and are not judged so: docs/e2e.md), "
            "from the kernel's tcp_info of the sender's connection, over the time its "
            "socket had data to send. On the wire (`wire_mbps`: bytes sent, "
            "retransmissions and headers included — what the shaper and the meter count — "
            "against the rate installed during the same seconds, between each two of the "
            "sender's evaluations, weighted by busy time, leaving out the intervals in "
            "which another flow of its ring was installed lower, so that it waited for "
            "data: `wire_ratio`): "
            f"{_band(wire)}. Goodput (`tcp_mbps`: bytes acknowledged, ≈ 0.96 × the wire "
            f"rate at full-size frames): {_band(goodput)}. Above the band's top "
            f"({WIRE_BAND[1]}; {RAISED}) × their "
            f"grant on the wire: {len(over)} of {measured} measured flows, "
            f"{over_binding} of them binding"
            + (
                ""
                if not over
                else " (a flow that idles between small sends goes out in bursts the shaper's "
                "and the meter's token buckets let through at line rate; one that shares "
                "its node pair may use what the pair's other flows leave idle: "
                + ", ".join(
                    f"{r['scheduler']} seed {r['seed']} `{r['job']}` "
                    f"{f['src']}→{f['dst']} {f['wire_mbps']:.1f} on "
                    f"{f['rate_mbps']:g}" + (" (shared pair)" if f.get("pair_shared") else "")
                    for r, f in over
                )
                + ")"
            )
            + ".",
            "",
        ]
    shared = sum(bool(f.get("pair_shared")) for r in all_rows for f in r["flows"])
    if shared:
        lines += [
            f"{shared} enforced flows shared their node pair with another enforced "
            "flow of the run (`pair_shared`): the network enforces per node pair, one "
            "meter and one tc class at the sum of the pair's grants, so such a flow is "
            "not held to its own grant and is not counted above.",
            "",
        ]
    contended = [f for r in all_rows for f in binding_flows(r) if f.get("contended_s")]
    if contended:
        lines += [
            f"{len(contended)} of the binding flows crossed a contended link for a "
            f"while ({_f(min(f['contended_s'] for f in contended))}–"
            f"{_f(max(f['contended_s'] for f in contended))} s, `contended_s`: the "
            "Master found another tenant's traffic or a link's loss leaving the grants "
            "more than the link holds): the intervals that overlap those seconds are "
            "not judged against the grant — there the link held the flow back.",
            "",
        ]
    stalls = [
        run["cpu_stalled_share"]
        for run in results.get("runs", [])
        if run.get("cpu_stalled_share") is not None
    ]
    if wire and stalls:
        lines += [
            f"CPU during the runs: some runnable task waited for a core "
            f"{_f(100 * min(stalls), 0)}–{_f(100 * max(stalls), 0)} % of the time (median "
            f"{_f(100 * statistics.median(stalls), 0)} %; the kernel's pressure stall "
            "information, `cpu_stalled_share` per run): switching, shaping and training "
            "share this machine's cores, and a flow's sender or its switch waiting for one "
            "sends less than it was let through.",
            "",
        ]
    if ring:
        lines += [
            "The application's view (`measured_mbps`: payload / collective time, median "
            "over iterations, against the ring's bottleneck grant, as a ring's flows "
            "advance together; it also counts the waits for the slowest rank's compute and "
            f"CPU): {_band([(x, WIRE_BAND[1]) for x in ring])}.",
            "",
        ]
    failed = [r for r in all_rows if not r["reached_target"]]
    if failed:
        lines += ["## Runs that did not reach the target", ""]
        lines += [
            f"- {r['scheduler']} seed {r['seed']} `{r['job']}`: {r['state']}"
            f"{': ' + r['reason'] if r['reason'] else ''} (final accuracy "
            f"{_f(r['final_accuracy'], 3)})"
            for r in failed
        ]
        lines.append("")
    return "\n".join(lines)


def write(results: dict, out: Path) -> tuple[Path, Path]:
    md = out / "summary.md"
    md.write_text(summary(results))
    return write_csv(results, out / "results.csv"), md


def read_results(path: str) -> dict | None:
    """A results.json of run.py, or None after saying on stderr why it cannot be read."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", help="results.json of experiments/run.py")
    p.add_argument("--out", help="folder for summary.md and results.csv (default: beside it)")
    p.add_argument(
        "--rejudge",
        action="store_true",
        help="judge every run again by today's fidelity rules, from the figures results.json "
        "keeps, and remake its comparisons (rewrites results.json; refused for a set with "
        "re-runs)",
    )
    a = p.parse_args(argv)
    results = read_results(a.results)
    if results is None:
        return 2
    if a.rejudge:
        why = rejudge(results)
        if why is not None:
            print(f"error: {a.results}: {why}; not re-judged", file=sys.stderr)
            return 2
        tmp = Path(a.results).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(a.results)
    paths = write(results, Path(a.out) if a.out else Path(a.results).parent)
    print("wrote", ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
