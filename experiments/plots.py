#!/usr/bin/env python3
"""The figures of an end-to-end run, each re-made from its results.json.

  python experiments/plots.py results/e2e/contention-campus/results.json [--out DIR] [--only tta]
  python experiments/plots.py --all     # every committed results file's figures (`make figures`)

--all re-makes, from the committed JSON and CSV under results/ and next to them, every PNG the
runs and benchmarks drew (git ignores them): each end-to-end folder's four figures below and its
results.csv (`experiments/report.py`), and the benchmarks' plots (`BENCH_FIGURES`). Nothing is
run or measured.

tta.png      time-to-accuracy per scheduler and job: every seed as a point (hollow at the
             timeout when the target was not reached), mean ± sd of the reached ones as a bar
curves.png   accuracy vs training time, per job, one colour per scheduler, one line per seed
links.png    link utilisation heat-map (measured / capacity) over time, one panel per
             scheduler (its first seed), the links that carried traffic
rates.png    measured vs granted rate of every inter-node flow, with the 0.85…1.05 band
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import csv
import json
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from experiments.e2e.fidelity import WIRE_BAND
from experiments.report import mean_std, read_results, rows


def _jobs(results: dict) -> list[str]:
    seen: list[str] = []
    for r in rows(results):
        if r["job"] not in seen:
            seen.append(r["job"])
    return seen


def _colours(schedulers: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab10")
    return {s: cmap(i % 10) for i, s in enumerate(schedulers)}


def tta(results: dict, path: Path) -> Path:
    jobs, schedulers = _jobs(results), results["schedulers"]
    timeout = results["scenario"]["timeout_s"]
    fig, axes = plt.subplots(
        1, len(jobs), figsize=(1.2 + 1.1 * len(schedulers) * len(jobs), 4), squeeze=False
    )
    rng = np.random.default_rng(0)  # jitter only
    for ax, job in zip(axes[0], jobs):
        for x, s in enumerate(schedulers):
            rs = [r for r in rows(results) if r["job"] == job and r["scheduler"] == s]
            reached = [r["tta_s"] for r in rs if r["reached_target"]]
            if reached:
                mean, sd = mean_std(reached)
                ax.bar(x, mean, yerr=sd, color="0.85", capsize=3)
            for r in rs:
                jitter = rng.uniform(-0.15, 0.15)
                if r["reached_target"]:
                    ax.plot(x + jitter, r["tta_s"], "o", color="C0", ms=5)
                else:
                    ax.plot(x + jitter, timeout, "o", mfc="none", color="C3", ms=6)
        ax.set_xticks(range(len(schedulers)), schedulers, rotation=35, ha="right")
        ax.set_title(f"{job}")
        ax.set_ylabel("time to accuracy (s)")
        ax.axhline(timeout, color="C3", lw=0.6, ls=":")
    fig.suptitle(
        f"time to accuracy on {results['topology']} (hollow red: target not reached by "
        f"the {timeout:g} s timeout)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def curves(results: dict, path: Path) -> Path:
    jobs, schedulers = _jobs(results), results["schedulers"]
    colours = _colours(schedulers)
    targets = {d["name"]: d.get("target_accuracy") for d in results["scenario"]["jobs"]}
    fig, axes = plt.subplots(1, len(jobs), figsize=(5 * len(jobs), 3.8), squeeze=False)
    for ax, job in zip(axes[0], jobs):
        for s in schedulers:
            for i, r in enumerate(
                r for r in rows(results) if r["job"] == job and r["scheduler"] == s
            ):
                if r["curve"]:
                    t, acc = zip(*r["curve"])
                    ax.plot(t, acc, color=colours[s], lw=1, alpha=0.8, label=s if i == 0 else None)
        if targets.get(job):
            ax.axhline(targets[job], color="k", lw=0.7, ls="--")
        ax.set_title(job)
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("held-out accuracy")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def links(results: dict, path: Path) -> Path:
    firsts: dict[str, dict] = {}
    for run in results.get("runs", []):
        firsts.setdefault(run["scheduler"], run)
    names = sorted({k for run in firsts.values() for k in run["links"]["mbps"]})
    rows_ = max(len(names), 1)
    fig, axes = plt.subplots(
        max(len(firsts), 1),
        1,
        squeeze=False,
        sharex=True,
        figsize=(10, 0.8 + (0.35 + 0.16 * rows_) * max(len(firsts), 1)),
    )
    image = None
    for ax, (s, run) in zip(axes[:, 0], firsts.items()):
        t = run["links"]["t"] or [0.0]
        grid = np.zeros((rows_, len(t)))  # a link this run did not list stayed quiet
        for i, name in enumerate(names):
            series = run["links"]["mbps"].get(name)
            if series:
                cap = run["links"]["capacity_mbps"][name]
                grid[i] = [np.nan if x is None else x / cap for x in series]
        image = ax.imshow(
            grid,
            aspect="auto",
            cmap="viridis",
            vmin=0,
            vmax=1,
            interpolation="nearest",
            extent=(t[0], t[-1], rows_ - 0.5, -0.5),
        )
        ax.set_yticks(range(len(names)), [n.replace(">", "→") for n in names], fontsize=6)
        ax.set_title(f"{s} (seed {run['seed']})", fontsize=8, loc="left")
    axes[-1, 0].set_xlabel("time since the jobs were submitted (s)")
    if image is not None:
        fig.colorbar(image, ax=axes[:, 0].tolist(), label="utilisation (measured / capacity)")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def rates(results: dict, path: Path) -> Path:
    colours = _colours(results["schedulers"])
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    top = 1.0
    for s in results["schedulers"]:
        pts = [
            (f["rate_mbps"], f["wire_mbps"])
            for r in rows(results)
            if r["scheduler"] == s
            for f in r["flows"]
            if f.get("wire_mbps") is not None and f["rate_mbps"]
        ]
        if pts:
            x, y = zip(*pts)
            ax.plot(x, y, "o", color=colours[s], ms=4, alpha=0.8, label=s)
            top = max(top, *x, *y)
    line = np.array([0, top * 1.05])
    ax.plot(line, line, "k-", lw=0.7)
    ax.fill_between(
        line,
        WIRE_BAND[0] * line,
        WIRE_BAND[1] * line,
        color="0.9",
        label=f"{WIRE_BAND[0]}…{WIRE_BAND[1]} × granted",
    )
    ax.set_xlabel("granted rate (Mbit/s)")
    ax.set_ylabel("sent on the wire while the sender was busy (Mbit/s)")
    ax.set_xlim(0, line[-1])
    ax.set_ylim(0, line[-1])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


FIGURES: dict[str, Callable[[dict, Path], Path]] = {
    "tta": tta,
    "curves": curves,
    "links": links,
    "rates": rates,
}


def make_all(results: dict, out: Path, only: list[str] | None = None) -> list[Path]:
    """The run's figures, of its faithful runs (`report.rows`): none when no run was faithful."""
    if not rows(results):
        return []
    return [
        fn(results, out / f"{name}.png") for name, fn in FIGURES.items() if not only or name in only
    ]


# --- every committed figure ---------------------------------------------------------------------
RESULTS = Path(__file__).resolve().parent.parent / "results"


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _bench_scheduler(src: Path) -> list[Path]:
    from experiments.bench_scheduler import plot

    plot(_json(src), src.with_suffix(".png"))
    return [src.with_suffix(".png")]


def _bench_tta(src: Path) -> list[Path]:
    from experiments.bench_tta import Settings, plot

    doc = _json(src)
    s = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["settings"].items()}
    plot(doc["cells"], Settings(**s), src.with_suffix(".png"))
    return [src.with_suffix(".png")]


def _bench_ppo(src: Path) -> list[Path]:
    from experiments.bench_ppo import plot, plot_tradeoff

    doc = _json(src)
    plot(doc, src.with_suffix(".png"))
    if src.name != "bench.json":  # bench_ppo writes tradeoff.png for its default run
        return [src.with_suffix(".png")]
    plot_tradeoff(doc, src.parent / "tradeoff.png")
    return [src.with_suffix(".png"), src.parent / "tradeoff.png"]


def _bench_spread(src: Path) -> list[Path]:
    from experiments.bench_spread import plot

    plot(_json(src), src.with_suffix(".png"))
    return [src.with_suffix(".png")]


def _learning_curve(src: Path) -> list[Path]:
    from scheduler.train_ppo import plot

    with src.open(newline="") as fh:
        rows = [
            {k: v if k == "phase" else float(v) for k, v in r.items() if v != ""}
            for r in csv.DictReader(fh)
        ]
    minutes = rows[-1]["seconds"] / 60 if rows else 0.0
    plot(rows, src.with_suffix(".png"), f"CES-PPO: {minutes:.1f} min of training ({src.name})")
    return [src.with_suffix(".png")]


def _eade_curves(src: Path) -> list[Path]:
    from scheduler.eade.experiment import plot_curves, read_curves

    plot_curves(read_curves(src), src.with_suffix(".png"))
    return [src.with_suffix(".png")]


# results file (glob under results/) → what draws its figures beside it
BENCH_FIGURES: dict[str, Callable[[Path], list[Path]]] = {
    "bench_scheduler.json": _bench_scheduler,
    "bench_tta.json": _bench_tta,
    "ppo/bench*.json": _bench_ppo,
    "ppo/spread*.json": _bench_spread,
    "ppo/learning_curve.csv": _learning_curve,
    "eade/curves.csv": _eade_curves,
}


def e2e_results(root: Path = RESULTS) -> list[Path]:
    """Every results.json of experiments/run.py under `root` (a scenario and its runs)."""
    found = []
    for path in sorted(root.rglob("results.json")):
        # parsed whole: a scenario's description and jobs put "runs" 4 kB or more into the file
        # (mixed-campus), beyond any fixed sniff of its head
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and "scenario" in doc and "runs" in doc:
            found.append(path)
    return found


def make_everything(root: Path = RESULTS) -> list[Path]:
    from experiments.report import write_csv

    made = []
    for path in e2e_results(root):
        results = read_results(str(path))
        if results is None:
            continue
        made.append(write_csv(results, path.parent / "results.csv"))
        made += make_all(results, path.parent)
        print(f"{path.parent.relative_to(root.parent)}: results.csv and the figures", flush=True)
    for pattern, draw in BENCH_FIGURES.items():
        for src in sorted(root.glob(pattern)):
            made += draw(src)
            print(f"{src.relative_to(root.parent)}: its figures", flush=True)
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="?", help="results.json of experiments/run.py")
    p.add_argument("--out", help="folder for the PNGs (default: beside the JSON)")
    p.add_argument("--only", action="append", choices=sorted(FIGURES), help="one figure")
    p.add_argument(
        "--all", action="store_true", help="every committed results file's figures, beside it"
    )
    a = p.parse_args(argv)
    if a.all:
        if a.results or a.out or a.only:
            p.error("--all takes no results file, --out or --only")
        made = make_everything()
        print(f"{len(made)} files written under {RESULTS}")
        return 0
    if not a.results:
        p.error("a results.json, or --all")
    results = read_results(a.results)
    if results is None:
        return 2
    out = Path(a.out) if a.out else Path(a.results).parent
    out.mkdir(parents=True, exist_ok=True)
    for path in make_all(results, out, a.only):
        print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
