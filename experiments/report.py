#!/usr/bin/env python3
"""summary.md and results.csv from an end-to-end run's results.json.

    python experiments/report.py results/e2e/default-campus/results.json [--out DIR]

Time-to-accuracy is the workload's own (MLPerf-style: from the first touch of data to the first
evaluation at the target). A run that did not reach the target has no time-to-accuracy; the
comparison of schedulers states how many runs reached it, and also gives the mean with each
unreached run counted at the scenario's timeout (a lower bound of its real time).
"""
from __future__ import annotations

import _venv  # noqa: F401  (re-exec under .venv)

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable

RATE_BAND = (0.85, 1.05)  # measured / granted counted as faithful
CSV_FIELDS = ("scheduler", "seed", "job", "collective", "model", "state", "reached_target",
              "tta_s", "final_accuracy", "jct_s", "startup_s", "iterations", "median_iter_s",
              "predicted_iter_s", "decision_ms", "attempts", "placement", "flows",
              "min_rate_mbps", "rate_ratio_median", "reason")


def rows(results: dict) -> list[dict]:
    """Every (scheduler, seed, job) row of the results."""
    return [row for run in results.get("runs", []) for row in run["jobs"]]


def ring_bottleneck(row: dict) -> float | None:
    """The smallest grant of a ring job's inter-node flows (None for other collectives, or no
    grant): a ring's flows advance in lockstep, so none carries more than this."""
    grants = [f["rate_mbps"] for f in row["flows"] if f["rate_mbps"] > 0]
    return min(grants) if row.get("collective") == "ring" and grants else None


def binding_flows(row: dict) -> list[dict]:
    """The inter-node flows that their own grant holds back. A ring's flows advance together at
    the pace of its smallest grant, so a flow granted more sends what reaches it from upstream
    as it comes: its socket stays busy with a trickle, and its rate says nothing of the network.
    Other collectives: every flow."""
    top = ring_bottleneck(row)
    return [f for f in row["flows"] if binds(f, top)]


def binds(flow: dict, ring_bottleneck_mbps: float | None) -> bool:
    """Whether the flow's own grant holds it back (`binding_flows`)."""
    return 0 < flow["rate_mbps"] and (ring_bottleneck_mbps is None
                                      or flow["rate_mbps"] <= 1.01 * ring_bottleneck_mbps)


def rate_ratios(row: dict, measure: str = "wire_mbps") -> list[float]:
    """`measure` / granted rate of the flows their grant holds back (`binding_flows`); by default
    what the sender put on the wire while its socket was busy (`run.tcp_view`): the bytes the
    grant's shaper and meter count."""
    return [f[measure] / f["rate_mbps"] for f in binding_flows(row) if f.get(measure) is not None]


def over_grant(row: dict) -> list[dict]:
    """Flows, binding or not, whose sender got more than the band's top × its grant."""
    return [f for f in row["flows"]
            if f.get("wire_mbps") is not None and f["wire_mbps"] > RATE_BAND[1] * f["rate_mbps"]]


def bottleneck_ratios(row: dict) -> list[float]:
    """Measured / the smallest grant of the job's inter-node flows, for ring jobs: a ring's
    flows advance in lockstep, so none can carry more than its slowest grant. Other
    collectives: `rate_ratios`."""
    top = ring_bottleneck(row)
    if top is None:
        return rate_ratios(row, "measured_mbps")
    return [f["measured_mbps"] / top for f in row["flows"] if f.get("measured_mbps") is not None]


def heavy_job(results: dict) -> str | None:
    """The scenario's most communication-heavy job: the largest model (bytes per iteration)."""
    def size(doc: dict) -> float:
        return float(doc.get("model_bytes") or 4 * doc.get("model_params", 0))
    jobs = results.get("scenario", {}).get("jobs", [])
    return max(jobs, key=size)["name"] if jobs else None


def background_mbps(results: dict, bg: dict) -> float | None:
    """Mean measured rate of a background flow on its first link, over every run's samples."""
    if not bg.get("path"):
        return None
    key = f"{bg['src']}>{bg['path'][0]}"
    xs = [x for run in results.get("runs", []) for x in run["links"]["mbps"].get(key, [])
          if x is not None]
    return statistics.fmean(xs) if xs else None


def mean_std(xs: Iterable[float]) -> tuple[float | None, float | None]:
    xs = list(xs)
    if not xs:
        return None, None
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def tta_censored(row: dict, timeout_s: float) -> float:
    return row["tta_s"] if row["reached_target"] else timeout_s


def write_csv(results: dict, path: Path) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for row in rows(results):
            ratios = rate_ratios(row)
            w.writerow({**row,
                        "placement": ";".join(f"{t}={n}" for t, n in row["placement"].items()),
                        "flows": len(row["flows"]),
                        "min_rate_mbps": min((f["rate_mbps"] for f in row["flows"]), default=""),
                        "rate_ratio_median": round(statistics.median(ratios), 3) if ratios
                        else ""})
    return path


def _band(ratios: list[float]) -> str:
    inside = sum(RATE_BAND[0] <= x <= RATE_BAND[1] for x in ratios)
    return (f"median {statistics.median(ratios):.2f} × granted (min {min(ratios):.2f}, max "
            f"{max(ratios):.2f}); {inside} of {len(ratios)} ({100 * inside / len(ratios):.0f}%) "
            f"within {RATE_BAND[0]}…{RATE_BAND[1]}")


def _f(x: Any, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def summary(results: dict) -> str:
    timeout = results.get("scenario", {}).get("timeout_s", 0.0)
    all_rows = rows(results)
    m = results.get("machine", {})
    lines = [f"# End-to-end run: scenario `{results['scenario']['name']}` on `{results['topology']}`",
             "", results["scenario"].get("description", ""), "",
             f"Machine: {m.get('cpu_model', '?')}, {m.get('cores', '?')} cores, "
             f"{m.get('mem_gb', '?')} GB, kernel {m.get('kernel', '?')}, {m.get('datapath', '?')} "
             f"OVS datapath; load average at start {m.get('loadavg', ['?'])[0]}. "
             f"Wall time {_f(results.get('wall_s'), 0)} s (bring-up {_f(results.get('bringup_s'))} s,"
             f" teardown {_f(results.get('teardown_s'))} s); {len(results.get('runs', []))} runs, "
             f"per-run timeout {timeout:g} s.", ""]
    if results.get("background"):
        lines.append("Background: " + "; ".join(
            f"{b['src']}→{b['dst']} {b['mbps']:g} Mbit/s" + (f" via {'-'.join(b['path'])}"
                                                            if b["path"] else "")
            + (f" (measured {m:.1f} Mbit/s on average)" if (m := background_mbps(results, b))
               is not None else "")
            for b in results["background"]) + "; paced iperf3 TCP, endpoints cordoned.")
        lines.append("")
    jobs = sorted({r["job"] for r in all_rows}, key=[r["job"] for r in all_rows].index)
    schedulers = results.get("schedulers", [])
    for job in jobs:
        lines += [f"## Job `{job}`", "",
                  "| scheduler | reached | TTA s (mean ± sd, reached) | TTA s (unreached = "
                  "timeout) | JCT s | final accuracy | iteration s (measured / predicted) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
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
            pr_m, _ = mean_std(r["predicted_iter_s"] for r in rs
                               if r["predicted_iter_s"] is not None)
            lines.append(f"| {s} | {len(reached)}/{len(rs)} | {_f(tta_m)} ± {_f(tta_s)} | "
                         f"{_f(cen_m)} ± {_f(cen_s)} | {_f(jct_m)} ± {_f(jct_s)} | "
                         f"{_f(acc_m, 3)} | {_f(it_m, 3)} / {_f(pr_m, 3)} |")
        lines.append("")
    heavy = heavy_job(results)
    if heavy and {"ces-ppo", "k8s-spread"} <= set(schedulers):
        def censored(s: str) -> float | None:
            return mean_std(tta_censored(r, timeout) for r in all_rows
                            if r["job"] == heavy and r["scheduler"] == s)[0]
        ppo, spread = censored("ces-ppo"), censored("k8s-spread")
        if ppo is not None and spread:
            lines += [f"**CES-PPO vs k8s-spread on `{heavy}`** (the communication-heavy job): mean "
                      f"time-to-accuracy {ppo:.1f} s vs {spread:.1f} s, "
                      f"{100 * (1 - ppo / spread):.0f}% lower (target ≥ 25%; unreached runs "
                      "counted at the timeout).", ""]
    wire = [x for r in all_rows for x in rate_ratios(r)]
    goodput = [x for r in all_rows for x in rate_ratios(r, "tcp_mbps")]
    ring = [x for r in all_rows for x in bottleneck_ratios(r)]
    if wire or ring:
        lines += ["## Measured vs granted rate per flow", ""]
    if wire:
        measured = sum(f.get("wire_mbps") is not None for r in all_rows for f in r["flows"])
        over = [(r, f) for r in all_rows for f in over_grant(r)]
        over_binding = sum(binds(f, ring_bottleneck(r)) for r, f in over)
        lines += [f"What the network carried on the {len(wire)} flows their grant holds back (a "
                  "ring's flows granted more than its smallest grant wait for data instead), "
                  "from the kernel's tcp_info of the sender's connection, over the time its "
                  "socket had data to send. On the wire (`wire_mbps`: bytes sent, "
                  "retransmissions and headers included — what the shaper and the meter count): "
                  f"{_band(wire)}. Goodput (`tcp_mbps`: bytes acknowledged, ≈ 0.96 × the wire "
                  f"rate at full-size frames): {_band(goodput)}. Above {RATE_BAND[1]} × their "
                  f"grant on the wire: {len(over)} of {measured} measured flows, "
                  f"{over_binding} of them binding" + (
                      "" if not over else
                      " (a flow that idles between small sends goes out in bursts the shaper's "
                      "and the meter's token buckets let through at line rate: "
                      + ", ".join(f"{r['scheduler']} seed {r['seed']} `{r['job']}` "
                                  f"{f['src']}→{f['dst']} {f['wire_mbps']:.1f} on "
                                  f"{f['rate_mbps']:g}" for r, f in over) + ")") + ".", ""]
    if ring:
        lines += ["The application's view (`measured_mbps`: payload / collective time, median "
                  "over iterations, against the ring's bottleneck grant, as a ring's flows "
                  "advance together; it also counts the waits for the slowest rank's compute and "
                  f"CPU): {_band(ring)}.", ""]
    failed = [r for r in all_rows if not r["reached_target"]]
    if failed:
        lines += ["## Runs that did not reach the target", ""]
        lines += [f"- {r['scheduler']} seed {r['seed']} `{r['job']}`: {r['state']}"
                  f"{': ' + r['reason'] if r['reason'] else ''} (final accuracy "
                  f"{_f(r['final_accuracy'], 3)})" for r in failed]
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
    a = p.parse_args(argv)
    results = read_results(a.results)
    if results is None:
        return 2
    paths = write(results, Path(a.out) if a.out else Path(a.results).parent)
    print("wrote", ", ".join(map(str, paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
