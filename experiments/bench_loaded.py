#!/usr/bin/env python3
"""Placement, paths and rates decided together against deciding them apart, on the testbed, on
networks other tenants have loaded (experiments/scenarios/loaded.yaml).

    sudo python experiments/bench_loaded.py                    # → results/e2e/loaded/
    sudo python experiments/bench_loaded.py --topologies campus,sndlib/atlanta --draws 5 --out DIR
    python experiments/bench_loaded.py --report          # summarize what is there; run nothing

Per topology and draw S of the background load (`--background-seed S`, S = 0..draws-1): one
`run.py --scenario loaded.yaml` — a fresh emulation of the topology with its nodes' and links'
capacities as the draw leaves them, CES-PPO and network-aware's placement with CES's paths and
rates (`network-aware/ces`: the strongest pipeline that decides placement first and the network
after) each running the three contention jobs (with `--plain`, also plain network-aware: its own
constrained paths and byte-weighted rate split), CES-PPO first in even draws and last in odd ones (the first run after
bring-up tends to be the slower: on campus's draw 2 both took the same placements and the first
ran 13 % longer) — into DIR/<topology>-<S>/. Nothing is chosen:
every draw of every topology named is run and reported. A draw whose scenario cannot run (exit
2: e.g. a job no loaded node set holds) is reported as such. A folder that already holds
results.json is not run again (re-running the command resumes).

Figures (DIR/summary.json, DIR/summary.md): per draw, CES-PPO's mean TTA and mean JCT over the
jobs (unreached targets and unfinished jobs at the scenario's timeout, as experiments/report.py)
over network-aware/ces's (and plain network-aware's), of the runs judged faithful, and what the iteration-time model predicted (the geometric mean over the
jobs of CES-PPO's predicted iteration time over network-aware's, as the Master decided them);
over all draws, the geometric means of those ratios, how many draws each wins, how many take
the same placements, the rank correlation of predicted and measured ratios, and each
scheduler's measured median iteration time over the Master's prediction; and the ratios paired by
draw with their 95 % interval and a verdict against report.TARGET_PARTS (`stats.paired_ratio`).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from scipy.stats import spearmanr

from experiments.common import REPO, RESULTS
from experiments.report import TARGET_PARTS, per_run, read_results, settle
from experiments.stats import Ratio, paired_ratio

SCENARIO = REPO / "experiments" / "scenarios" / "loaded.yaml"
RUN = [sys.executable, str(REPO / "experiments" / "run.py"), "--scenario", str(SCENARIO)]
TOPOLOGIES = "campus,ring,star,fattree,topozoo/Abilene,sndlib/atlanta,sndlib/polska"
# CES-PPO against the strongest "decide apart" pipeline — network-aware's placement with CES's
# paths and rates — and, beside it, network-aware with its own constrained paths and rate split.
OURS, APART, PLAIN = "ces-ppo", "network-aware/ces", "network-aware"


def folder(out: Path, topo: str, draw: int) -> Path:
    return out / f"{topo.replace('/', '-').replace(':', '-')}-{draw}"


def run_draw(out: Path, topo: str, draw: int, run: bool = True, plain: bool = False) -> dict:
    """Run one draw (unless its results are there, or not `run`), with plain network-aware beside
    the two when `plain`; its record for the summary."""
    where = folder(out, topo, draw)
    record = {"topology": topo, "draw": draw, "folder": where.name}
    if not (where / "results.json").exists():
        if not run:
            return record | {"status": "not run", "reason": "no results.json"}
        print(f"== {topo}, draw {draw}", file=sys.stderr, flush=True)
        order = [OURS, APART, *([PLAIN] if plain else [])]
        order = order if draw % 2 == 0 else order[1:] + order[:1]
        done = subprocess.run(
            RUN
            + [
                "--topo",
                topo,
                "--background-seed",
                str(draw),
                "--schedulers",
                ",".join(order),
                "--out",
                str(where),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            return record | {
                "status": "refused" if done.returncode == 2 else "failed",
                "reason": lines[-1] if lines else f"exit {done.returncode}",
            }
    results = read_results(str(where / "results.json"))
    if results is None:
        return record | {"status": "failed", "reason": "no readable results.json"}
    return record | {"status": "ran"} | compare(results)


def compare(results: dict) -> dict:
    """CES-PPO against network-aware in one draw's results."""
    timeout = results["scenario"]["timeout_s"]
    runs = per_run(results, timeout)
    jobs = {(r["scheduler"], r["job"]): r for run in results["runs"] for r in run["jobs"]}
    names = sorted({job for _, job in jobs})
    out: dict = {"jobs": {}}
    for name in names:
        ours, apart = jobs.get((OURS, name)), jobs.get((APART, name))
        out["jobs"][name] = {
            s: {
                k: row.get(k)
                for k in (
                    "state",
                    "tta_s",
                    "jct_s",
                    "median_iter_s",
                    "predicted_iter_s",
                    "placement",
                )
            }
            for s, row in ((OURS, ours), (APART, apart), (PLAIN, jobs.get((PLAIN, name))))
            if row
        }
    for key in ("mean_tta", "mean_jct"):
        a, b, c = (
            statistics.fmean(r[key] for r in runs.get(s, [])) if runs.get(s) else None
            for s in (OURS, APART, PLAIN)
        )
        out[key] = {
            OURS: a,
            APART: b,
            PLAIN: c,
            "ratio": a / b if a and b else None,
            "ratio_plain": a / c if a and c else None,
        }
    predicted = [
        jobs[OURS, n]["predicted_iter_s"] / jobs[APART, n]["predicted_iter_s"]
        for n in names
        if jobs.get((OURS, n), {}).get("predicted_iter_s")
        and jobs.get((APART, n), {}).get("predicted_iter_s")
    ]
    out["predicted_ratio"] = geomean(predicted)
    out["measured_over_predicted"] = {
        s: geomean(
            [
                r["median_iter_s"] / r["predicted_iter_s"]
                for (who, _), r in jobs.items()
                if who == s and r.get("median_iter_s") and r.get("predicted_iter_s")
            ]
        )
        for s in (OURS, APART, PLAIN)
    }
    out["same_placements"] = all(
        (OURS, n) in jobs
        and (APART, n) in jobs
        and sorted((jobs[OURS, n]["placement"] or {}).values())
        == sorted((jobs[APART, n]["placement"] or {}).values())
        for n in names
    )
    return out


def geomean(xs: list[float]) -> float | None:
    return statistics.geometric_mean(xs) if xs else None


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties at their mean rank); None for fewer than three pairs or
    a constant side."""
    if len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return float(spearmanr(xs, ys).statistic)


def summarize(records: list[dict]) -> dict:
    ran = [r for r in records if r["status"] == "ran" and r["mean_tta"]["ratio"]]
    out: dict = {
        "draws": len(records),
        "ran": len(ran),
        "same_placements": sum(r["same_placements"] for r in ran),
    }
    differ = [r for r in ran if not r["same_placements"]]
    for key in ("mean_tta", "mean_jct"):
        x, y = ([r[key]["ratio"] for r in rs] for rs in (ran, differ))
        out[key] = {
            "geomean": geomean(x),
            "wins": sum(v < 1 for v in x),
            "worst": max(x, default=None),
            "best": min(x, default=None),
        }
        out[f"{key}_where_placements_differ"] = {
            "geomean": geomean(y),
            "draws": len(y),
            "wins": sum(v < 1 for v in y),
        }
    out["same_placements_tta"] = [r["mean_tta"]["ratio"] for r in ran if r["same_placements"]]
    # paired by draw (each draw a network both ran on): the ratio, its 95 % interval, a verdict
    for key in ("mean_tta", "mean_jct"):
        for other, ratio in ((APART, "ratio"), (PLAIN, "ratio_plain")):
            pairs = [(r[key][OURS], r[key][other]) for r in ran if r[key].get(ratio)]
            if pairs:
                paired = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
                out.setdefault("paired", {})[f"{key} vs {other}"] = {
                    **paired.to_json(),
                    "text": paired.text(),
                    "verdict": paired.judge(TARGET_PARTS),
                }
    out["by_topology"] = {}
    for topo in dict.fromkeys(r["topology"] for r in ran):
        mine = [r for r in ran if r["topology"] == topo]
        out["by_topology"][topo] = {
            "draws": len(mine),
            "same_placements": sum(r["same_placements"] for r in mine),
            "tta_wins": sum(r["mean_tta"]["ratio"] < 1 for r in mine),
            "mean_tta": geomean([r["mean_tta"]["ratio"] for r in mine]),
            "mean_jct": geomean([r["mean_jct"]["ratio"] for r in mine]),
        }
    out["measured_over_predicted"] = {
        s: geomean(
            [r["measured_over_predicted"][s] for r in ran if r["measured_over_predicted"].get(s)]
        )
        for s in (OURS, APART, PLAIN)
    }
    pairs = [(r["predicted_ratio"], r["mean_jct"]["ratio"]) for r in differ if r["predicted_ratio"]]
    out["predicted_ratio"] = geomean([p for p, _ in pairs])
    out["spearman_predicted_jct"] = spearman([p for p, _ in pairs], [m for _, m in pairs])
    return out


def markdown(records: list[dict], s: dict) -> str:
    def f(x, d=2):
        return "—" if x is None else f"{x:.{d}f}"

    lines = [
        "# CES-PPO against network-aware with CES's network (and with its own) on loaded networks",
        "",
        "| topology | draw | same placements | predicted (iteration) | mean TTA s: CES-PPO / "
        "network-aware | ratio | mean JCT s: CES-PPO / network-aware | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in records:
        if r["status"] != "ran":
            lines.append(
                f"| {r['topology']} | {r['draw']} | {r['status']}: {r['reason']} | | | | | |"
            )
            continue
        t, j = r["mean_tta"], r["mean_jct"]
        lines.append(
            f"| {r['topology']} | {r['draw']} | {'yes' if r['same_placements'] else 'no'}"
            f" | {f(r['predicted_ratio'])} | {f(t[OURS], 1)} / {f(t[APART], 1)} | "
            f"{f(t['ratio'])} | {f(j[OURS], 1)} / {f(j[APART], 1)} | {f(j['ratio'])} |"
        )
    lines += [
        "",
        "| topology | draws run | same placements | CES-PPO faster (TTA) | mean TTA "
        "ratio (geomean) | mean JCT ratio (geomean) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += [
        f"| {t} | {b['draws']} | {b['same_placements']} | {b['tta_wins']} | "
        f"{f(b['mean_tta'], 3)} | {f(b['mean_jct'], 3)} |"
        for t, b in s["by_topology"].items()
    ]
    lines += [
        "",
        f"Draws run: {s['ran']} of {s['draws']}; the same placements in "
        f"{s['same_placements']} (their TTA ratios, what runs of the same decisions "
        f"differ by: {', '.join(f(x) for x in s['same_placements_tta']) or '—'}).",
    ]
    for key, label in (("mean_tta", "mean TTA"), ("mean_jct", "mean JCT")):
        a, d = s[key], s[f"{key}_where_placements_differ"]
        lines.append(
            f"- CES-PPO / network-aware, {label}: geometric mean {f(a['geomean'], 3)} "
            f"over every draw (CES-PPO faster in {a['wins']}; best {f(a['best'])}, worst "
            f"{f(a['worst'])}); where the placements differ {f(d['geomean'], 3)} "
            f"({d['wins']} of {d['draws']})."
        )
    for name, p in s.get("paired", {}).items():
        lines.append(
            f"- Paired by draw, CES-PPO / {name.split(' vs ')[1]}, {name.split(' vs ')[0]}: "
            f"{p['text']} (target < {TARGET_PARTS:g}: **{p['verdict']}**"
            f"{settle(Ratio(p['ratio'], p['low'], p['high'], p['n']), TARGET_PARTS, p['verdict'], 'draws')})."
        )
    lines.append(
        f"- Where they differ, the model predicted {f(s['predicted_ratio'], 3)} "
        f"(iteration time); rank correlation of predicted and measured (JCT) "
        f"{f(s['spearman_predicted_jct'])}."
    )
    m = s["measured_over_predicted"]
    lines.append(
        f"- Measured median iteration over the Master's prediction (geometric mean over "
        f"jobs and draws): CES-PPO {f(m[OURS])}, network-aware/ces {f(m[APART])}, "
        f"network-aware {f(m[PLAIN])} (the model "
        "counts a flow at its grant; the network gives it a share of the spare too)."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--topologies", default=TOPOLOGIES, help=f"comma-separated (default {TOPOLOGIES})"
    )
    ap.add_argument("--draws", type=int, default=5, help="background-load draws per topology")
    ap.add_argument("--out", default=str(RESULTS / "e2e" / "loaded"))
    ap.add_argument(
        "--report", action="store_true", help="only summarize the draws DIR holds; run nothing"
    )
    ap.add_argument(
        "--plain",
        action="store_true",
        help="also run network-aware with its own paths and rate split (a third run a draw)",
    )
    args = ap.parse_args(argv)
    if args.draws < 1:
        ap.error("--draws: expected an integer >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = [
        run_draw(out, topo, draw, run=not args.report, plain=args.plain)
        for topo in args.topologies.split(",")
        for draw in range(args.draws)
    ]
    s = summarize(records)
    (out / "summary.json").write_text(
        json.dumps({"command": " ".join(sys.argv), "summary": s, "draws": records}, indent=1) + "\n"
    )
    (out / "summary.md").write_text(markdown(records, s))
    print(markdown(records, s))
    return 0 if all(r["status"] != "failed" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
