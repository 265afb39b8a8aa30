"""Which documented figure comes from which results file (experiments/doc_figures.py checks them).

Per doc: the generated tables (`Table(name, doc, sources, render)`: the block between
`<!-- table: name -->` and `<!-- end -->`) and the figures quoted in prose (`Q(doc, source,
phrase, **values)`: each `{field:format}` of the phrase is `values[field]`, a key path into the
results file or a function of it). A phrase is the doc's text, figures and all, as it reads once
whitespace is squeezed; keep it short enough to say which figure it is and long enough to be
found once. When a doc's wording changes, change the phrase here; when a results file is
re-made, `python experiments/doc_figures.py` says which figures moved.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable
from typing import Any

from experiments.doc_figures import Q, Quote, Table, at
from experiments.stats import mean_interval
from scheduler.eade.experiment import episodes_trained


# --- helpers -----------------------------------------------------------------------------------
def md_table(header: Iterable[str], rows: Iterable[Iterable[Any]], align: str = "") -> str:
    """A markdown table; `align` one letter per column (l or r), default left."""
    header = list(header)
    marks = [("---:" if a == "r" else "---") for a in (align or "l" * len(header))]
    lines = [header, marks, *([str(c) for c in row] for row in rows)]
    return "".join(re.sub(r"\| (?= \|)", "|", "| " + " | ".join(cells) + " |\n") for cells in lines)


def pm(cell: dict, digits: int, sd: str = "std") -> str:
    """'mean ± sd' of a {mean, std} cell."""
    return f"{cell['mean']:.{digits}f} ± {cell[sd]:.{digits}f}"


def f(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def same(digits: int, *xs: float) -> float:
    """The one figure a doc gives for several values: they must agree to `digits`."""
    if len({round(x, digits) for x in xs}) != 1:
        raise ValueError(f"{xs} differ at {digits} digits")
    return xs[0]


def comparison_cell(md: str, scheduler: str, column: int) -> str:
    """A cell of an end-to-end summary.md's comparison table (`experiments/report.py`: scheduler,
    network, mean TTA over jobs, mean JCT over jobs, makespan, targets reached)."""
    part = md.split("## The comparison", 1)[1].split("\n## ", 1)[0]
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == scheduler:
            return cells[column]
    raise KeyError(f"no comparison row for {scheduler}")


# --- docs/eade.md ------------------------------------------------------------------------------
EADE = "docs/eade.md"
EADE_RESULTS = "results/eade/results.json"
EADE_CURVES = "results/eade/curves.csv"
EADE_CES = "results/eade/ces.json"
RL = ("EADE-DDPG", "DDPG", "TD3", "SAC", "PPO")


def _cpu_per_episode(doc: dict, name: str) -> float:
    t = doc["training"][name]
    return t["cpu_s"]["mean"] / t["episodes"]


def _eade_training_cost(doc: dict) -> str:
    rows = [
        (name, f(_cpu_per_episode(doc, name), 2), pm(doc["training"][name]["cpu_s"], 0))
        for name in RL
    ]
    rows.append(("all five", f(sum(_cpu_per_episode(doc, n) for n in RL), 1), ""))
    return md_table(
        ("algorithm", "CPU s / episode", "train CPU s, 100 episodes (mean ± sd over seeds)"),
        rows,
        "lrr",
    )


def _val_n(rows: list[dict], algorithm: str) -> list[float]:
    """Validation N per checkpoint episode, mean over seeds (results/eade/curves.csv)."""
    points: dict[int, list[float]] = {}
    for r in rows:
        if r["algorithm"] == algorithm and r["val_N"]:
            points.setdefault(int(r["episode"]), []).append(float(r["val_N"]))
    return [statistics.fmean(v) for _, v in sorted(points.items())]


def _eade_ces(doc: dict) -> str:
    rows = []
    for topo, c in doc["comparison"].items():
        a = c["algorithms"]
        e, p, n = a["eade-ddpg"], a["ces-ppo"], a["network-aware"]
        rows.append(
            (
                topo,
                pm(c["eade_vs_ces_ppo_iteration"], 3),
                " / ".join(f(x["balance_std"]["mean"], 3) for x in (e, p, n)),
                " / ".join(f(x["placed_fraction"]["mean"], 3) for x in (e, p)),
                " / ".join(f(x["decision_ms"]["mean"], 1) for x in (e, p)),
            )
        )
    return md_table(
        (
            "topology",
            "eade-ddpg / ces-ppo iteration time (jobs both placed)",
            "balance std eade-ddpg / ces-ppo / network-aware",
            "placed eade-ddpg / ces-ppo",
            "decision ms eade-ddpg / ces-ppo",
        ),
        rows,
    )


def _n(name: str, key: str = "N", stat: str = "mean") -> tuple:
    return ("algorithms", name, key, stat)


EADE_DIAG = "results/eade/diagnostics.json"
RULES = ("BestFit", "Greedy", "Random", "Utilization", "WorstFit-GPU", "Expert", "Expert-aggregate")
UTIL = (
    ("gpu_mem_gb", "GPU memory"),
    ("gpu_core", "GPU core"),
    ("cpu", "CPU"),
    ("mem_gb", "memory"),
)


def _eade_diagnostics(doc: dict) -> str:
    """N ± sd and the failures split (aggregate-infeasible / fragmentation) of every rule that
    needs no training, per setting (results/eade/diagnostics.json)."""
    settings = doc["settings"]

    def cell(m: dict) -> str:
        return (
            f"{pm(m['N'], 1)} ({m['failed_aggregate']['mean']:.1f} / "
            f"{m['failed_fragmented']['mean']:.1f})"
        )

    rows = [
        (name, doc["paper"].get(name, {}).get("N", "—"))
        + tuple(cell(settings[label]["algorithms"][name]) for label in settings)
        for name in RULES
    ]
    return md_table(("rule", "paper N", *settings), rows)


def _eade_table6(doc: dict) -> str:
    """Random's utilisation per resource (mean / std over clusters) in each setting beside the
    paper's Table 6."""
    rows = [
        ("paper (Table 6)",)
        + tuple(
            f"{doc['paper_table6']['Random'][f'util_{r}_mean']:.2f} / "
            f"{doc['paper_table6']['Random'][f'util_{r}_std']:.2f}"
            for r, _ in UTIL
        )
    ]
    for label, part in doc["settings"].items():
        m = part["algorithms"]["Random"]
        rows.append(
            (label,)
            + tuple(
                f"{m[f'util_{r}_mean']['mean']:.2f} / {m[f'util_{r}_std']['mean']:.2f}"
                for r, _ in UTIL
            )
        )
    return md_table(("Random's utilisation: mean / std over clusters", *(n for _, n in UTIL)), rows)


# The paper's mode (one stream per seed) in our setting and in the faithful one (issue 52).
EADE_VARIANTS = {"fixed": "results/eade/fixed", "faithful": "results/eade/faithful"}
# Every algorithm on seven seeds of the faithful setting; EADE-DDPG's seeds from 3 on (trained
# after results/eade/faithful's three) ran the paper's 1000 episodes.
EADE_FAITHFUL_7 = "results/eade/faithful-7seeds"
EADE_NEW_SEEDS = 3

EADE_TABLES = [
    Table("eade-training-cost", EADE, (EADE_RESULTS,), _eade_training_cost),
    Table("eade-paper", EADE, ("results/eade/results.md",), lambda md: md),
    *(
        Table(f"eade-{name}", EADE, (f"{folder}/results.md",), lambda md: md)
        for name, folder in EADE_VARIANTS.items()
    ),
    Table("eade-faithful-7seeds", EADE, (f"{EADE_FAITHFUL_7}/results.md",), lambda md: md),
    Table("eade-ces", EADE, (EADE_CES,), _eade_ces),
    Table("eade-diagnostics", EADE, (EADE_DIAG,), _eade_diagnostics),
    Table("eade-table6", EADE, (EADE_DIAG,), _eade_table6),
]


def _ranked(doc: dict) -> list[str]:
    """The algorithms (not the experts) by mean N, most first."""
    names = [n for n in doc["algorithms"] if n not in ("Expert", "Expert-aggregate")]
    return sorted(names, key=lambda n: -doc["algorithms"][n]["N"]["mean"])


ORDINAL = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth")


def _best_val_n(rows: list[dict], algorithm: str, upto: float) -> float:
    """The best validation N within the first `upto` training episodes, mean over seeds."""
    best: dict[str, float] = {}
    for r in rows:
        if r["algorithm"] == algorithm and r["val_N"] and float(r["episode"]) <= upto:
            best[r["seed"]] = max(best.get(r["seed"], 0.0), float(r["val_N"]))
    return statistics.fmean(best.values())


def _variant_quotes(folder: str, where: str) -> list[Quote]:
    """What docs/eade.md says of one fixed-stream variant's results ("On its fixed stream" and
    "In the faithful setting" open the sentences)."""
    results = f"{folder}/results.json"
    return [
        Q(
            EADE,
            results,
            where + " EADE-DDPG places {n} of the 220 tasks, {rank} of the ten algorithms on N "
            "(first: {first}, {fn:.1f}); on the held-out streams {h}",
            n=lambda d: pm(d["algorithms"]["EADE-DDPG"]["N"], 1),
            rank=lambda d: ORDINAL[_ranked(d).index("EADE-DDPG")],
            first=lambda d: _ranked(d)[0],
            fn=lambda d: d["algorithms"][_ranked(d)[0]]["N"]["mean"],
            h=lambda d: pm(d["held_out"]["EADE-DDPG"]["N"], 1),
        ),
        Q(
            EADE,
            results,
            where + ", training took EADE-DDPG {e} s of CPU per seed for {ee} episodes and SAC "
            "{s} s for {se}",
            e=lambda d: pm(d["training"]["EADE-DDPG"]["cpu_s"], 0),
            ee=lambda d: episodes_trained(d["training"]["EADE-DDPG"]),
            s=lambda d: pm(d["training"]["SAC"]["cpu_s"], 0),
            se=lambda d: episodes_trained(d["training"]["SAC"]),
        ),
        Q(
            EADE,
            results,
            where + ", all the trainings together took {h:.1f} h of CPU",
            h=lambda d: (
                sum(t["cpu_s"]["mean"] for t in d["training"].values())
                * d["experiment"]["seeds"]
                / 3600
            ),
        ),
        Q(
            EADE,
            results,
            where + " EADE-DDPG's failures: {a:.1f} choices of a cluster whose remaining resources "
            "did not cover the task and {fr:.1f} that fragmentation failed; Utilization's {u:.1f}, "
            "{ua}",
            a=_n("EADE-DDPG", "failed_aggregate"),
            fr=_n("EADE-DDPG", "failed_fragmented"),
            u=_n("Utilization", "failed_fragmented"),
            ua=lambda d: (
                "all fragmentation"
                if d["algorithms"]["Utilization"]["failed_aggregate"]["mean"] == 0
                else "NOT all fragmentation"
            ),
        ),
    ]


def _diag(setting: str, rule: str, key: str = "N", stat: str = "mean") -> tuple:
    return ("settings", setting, "algorithms", rule, key, stat)


EADE_QUOTES: list[Quote] = [
    Q(
        EADE,
        EADE_DIAG,
        "it places {a:.1f} ± {asd:.1f} against Random's {r:.1f} ± {rsd:.1f} in our setting and "
        "{fa:.1f} ± {fasd:.1f} against {fr:.1f} ± {frsd:.1f} in the faithful one, every one of its "
        "failures {frag}",
        a=_diag("ours", "Expert-aggregate"),
        asd=_diag("ours", "Expert-aggregate", stat="std"),
        r=_diag("ours", "Random"),
        rsd=_diag("ours", "Random", stat="std"),
        fa=_diag("faithful", "Expert-aggregate"),
        fasd=_diag("faithful", "Expert-aggregate", stat="std"),
        fr=_diag("faithful", "Random"),
        frsd=_diag("faithful", "Random", stat="std"),
        frag=lambda d: (
            "a fragmented cluster"
            if all(
                p["algorithms"]["Expert-aggregate"]["failed_aggregate"]["mean"] == 0
                for p in d["settings"].values()
            )
            else "NOT all fragmentation"
        ),
    ),
    Q(
        EADE,
        EADE_DIAG,
        "The reward's greedy maximiser, seeing what the agent sees, is below Random in {every} "
        "setting measured",
        every=lambda d: (
            "every"
            if all(
                at(p, "algorithms", "Expert-aggregate", "N", "mean")
                < at(p, "algorithms", "Random", "N", "mean")
                for p in d["settings"].values()
            )
            else "NOT every"
        ),
    ),
    Q(
        EADE,
        EADE_DIAG,
        "The heuristics never choose an aggregate-infeasible cluster{never}",
        never=lambda d: (
            ""
            if all(
                p["algorithms"][r]["failed_aggregate"]["mean"] == 0
                for p in d["settings"].values()
                for r in RULES
            )
            else " (NOT TRUE)"
        ),
    ),
    Q(
        EADE,
        EADE_DIAG,
        "WorstFit-GPU, which spreads the GPU alone, places {w:.1f} ± {wsd:.1f} in our setting, the "
        "most of the rules that see the aggregate only (Utilization {u:.1f}), and {fw:.1f} ± "
        "{fwsd:.1f} in the faithful one",
        w=_diag("ours", "WorstFit-GPU"),
        wsd=_diag("ours", "WorstFit-GPU", stat="std"),
        u=_diag("ours", "Utilization"),
        fw=_diag("faithful", "WorstFit-GPU"),
        fwsd=_diag("faithful", "WorstFit-GPU", stat="std"),
    ),
    Q(
        EADE,
        EADE_RESULTS,
        "EADE-DDPG costs {ratio:.1f}× DDPG",
        ratio=lambda d: _cpu_per_episode(d, "EADE-DDPG") / _cpu_per_episode(d, "DDPG"),
    ),
    Q(
        EADE,
        EADE_RESULTS,
        "5 × 1000 × {all:.1f} s ≈ {hours:.0f} h of CPU",
        all=lambda d: sum(_cpu_per_episode(d, n) for n in RL),
        hours=lambda d: 5 * 1000 * sum(_cpu_per_episode(d, n) for n in RL) / 3600,
    ),
    Q(
        EADE,
        EADE_RESULTS,
        "not the paper's 1000 (≈ {hours:.0f} h of CPU here)",
        hours=lambda d: 5 * 1000 * sum(_cpu_per_episode(d, n) for n in RL) / 3600,
    ),
    Q(
        EADE,
        EADE_RESULTS,
        "N {n:.1f} against SAC's {sac:.1f} (the paper: {pn} against {psac}), F {f:.3f} against "
        "{fsac:.3f} (paper {pf:.3f} / {pfsac:.3f}), σ² {v:.3f} against {vsac:.3f}, and the "
        "steadiest across seeds (N ± {sd:.1f}; DDPG ± {sdd:.1f}, TD3 ± {sdt:.1f}). Its F is the "
        "paper's to {gap:.1f} %.",
        n=_n("EADE-DDPG"),
        sac=_n("SAC"),
        pn=("paper", "EADE-DDPG", "N"),
        psac=("paper", "SAC", "N"),
        f=_n("EADE-DDPG", "F"),
        fsac=_n("SAC", "F"),
        pf=("paper", "EADE-DDPG", "F"),
        pfsac=("paper", "SAC", "F"),
        v=_n("EADE-DDPG", "load_var"),
        vsac=_n("SAC", "load_var"),
        sd=_n("EADE-DDPG", stat="std"),
        sdd=_n("DDPG", stat="std"),
        sdt=_n("TD3", stat="std"),
        gap=lambda d: 100 * abs(at(d, *_n("EADE-DDPG", "F")) / d["paper"]["EADE-DDPG"]["F"] - 1),
    ),
    Q(
        EADE,
        EADE_CURVES,
        "EADE-DDPG's validation N is {e:.0f} after 10 episodes, DDPG's {d:.0f}.",
        e=lambda rows: _val_n(rows, "EADE-DDPG")[0],
        d=lambda rows: _val_n(rows, "DDPG")[0],
    ),
    Q(
        EADE,
        EADE_RESULTS,
        "Random (N {rn:.1f}, F {rf:.3f}, σ² {rv:.4f}) and Utilization ({un:.1f}, {uf:.3f}, "
        "{uv:.4f})",
        rn=_n("Random"),
        rf=_n("Random", "F"),
        rv=_n("Random", "load_var"),
        un=_n("Utilization"),
        uf=_n("Utilization", "F"),
        uv=_n("Utilization", "load_var"),
    ),
    Q(
        EADE,
        EADE_RESULTS,
        "BestFit and Greedy ({b:.0f}) pack",
        b=lambda d: same(0, at(d, *_n("BestFit")), at(d, *_n("Greedy"))),
    ),
    Q(
        EADE,
        EADE_CURVES,
        "validation N still rises at the end — {curve} at episodes 10…100",
        curve=lambda rows: ", ".join(f"{x:.0f}" for x in _val_n(rows, "EADE-DDPG")),
    ),
    Q(
        EADE,
        EADE_RESULTS,
        "PPO learns to wait (N {n:.1f};",
        n=_n("PPO"),
    ),
    Q(
        EADE,
        EADE_CURVES,
        "its validation N {a:.0f} → {b:.0f} over the 100 episodes",
        a=lambda rows: _val_n(rows, "PPO")[0],
        b=lambda rows: _val_n(rows, "PPO")[-1],
    ),
    Q(
        EADE,
        EADE_RESULTS,
        "EADE-DDPG {e}, DDPG {d}, TD3 {t}, SAC {s}, PPO {p} — {h:.1f} h of CPU for the whole "
        "experiment",
        e=lambda d: pm(d["training"]["EADE-DDPG"]["cpu_s"], 0),
        d=lambda d: pm(d["training"]["DDPG"]["cpu_s"], 0),
        t=lambda d: pm(d["training"]["TD3"]["cpu_s"], 0),
        s=lambda d: pm(d["training"]["SAC"]["cpu_s"], 0),
        p=lambda d: pm(d["training"]["PPO"]["cpu_s"], 0),
        h=lambda d: sum(d["training"][n]["cpu_s"]["mean"] for n in RL) * 5 / 3600,
    ),
    Q(
        EADE,
        EADE_CES,
        "# → results/eade/ces.json ({s:.0f} s)",
        s=("seconds",),
    ),
    Q(
        EADE,
        EADE_CES,
        "eade-ddpg p50 {e50:.1f} ms (p99 {e99:.1f}), CES-PPO {c50:.1f} ms ({c99:.1f})",
        e50=("latency", "eade-ddpg", "p50_ms"),
        e99=("latency", "eade-ddpg", "p99_ms"),
        c50=("latency", "ces-ppo", "p50_ms"),
        c99=("latency", "ces-ppo", "p99_ms"),
    ),
]


def _seed_ns(doc: dict, algorithm: str) -> list[float]:
    return [s["N"] for s in doc["per_seed"][algorithm]]


def _paired_gap(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """xs − ys paired by seed, as docs/eade.md gives it: the mean gap `d`, its 95 % t-interval
    [`lo`, `hi`], the seeds `n`, whether the interval `holds` zero."""
    mean, half = mean_interval([x - y for x, y in zip(xs, ys, strict=True)])
    lo, hi = mean - half, mean + half
    return {
        "d": _signed(mean, 1),
        "lo": _signed(lo, 1),
        "hi": _signed(hi, 1),
        "n": len(xs),
        "holds": "holds" if lo <= 0 <= hi else "excludes",
    }


def _eade_vs(doc: dict, other: str = "Random", seeds: int | None = None) -> dict[str, Any]:
    """EADE-DDPG's N − `other`'s paired by seed, over the first `seeds` or all."""
    return _paired_gap(_seed_ns(doc, "EADE-DDPG")[:seeds], _seed_ns(doc, other)[:seeds])


def _eade_vs_quote(folder: str, other: str = "Random") -> Quote:
    return Q(
        EADE,
        f"{folder}/results.json",
        f"paired by seed, EADE-DDPG − {other} is {{d}} tasks, 95 % interval [{{lo}}, {{hi}}] "
        "over {n} seeds, which {holds} zero",
        **{k: (lambda doc, k=k: _eade_vs(doc, other)[k]) for k in ("d", "lo", "hi", "n", "holds")},
    )


def _and(xs: list) -> str:
    """1, 2 and 3."""
    return ", ".join(map(str, xs[:-1])) + " and " + str(xs[-1])


def _new_seeds(doc: dict, algorithm: str) -> str:
    return _and([round(n) for n in _seed_ns(doc, algorithm)[EADE_NEW_SEEDS:]])


def _eade_against_random(doc: dict) -> dict[str, int]:
    """On how many seeds EADE-DDPG places more than Random, as many, fewer."""
    gaps = [x - y for x, y in zip(_seed_ns(doc, "EADE-DDPG"), _seed_ns(doc, "Random"), strict=True)]
    return {
        "ahead": sum(g > 0 for g in gaps),
        "level": sum(g == 0 for g in gaps),
        "behind": sum(g < 0 for g in gaps),
    }


EADE_7_RESULTS = f"{EADE_FAITHFUL_7}/results.json"
# SAC, the best RL baseline, trained towards the paper's 1000 episodes on the faithful setting's
# three seeds (checkpoints of its own: the 100-episode ones stay the tables').
EADE_SAC_1000 = "results/eade/faithful-sac1000/results.json"
EADE_FAITHFUL = f"{EADE_VARIANTS['faithful']}/results.json"


def _eade_vs_sac_1000(docs: dict) -> dict[str, Any]:
    return _paired_gap(
        _seed_ns(docs[EADE_FAITHFUL], "EADE-DDPG"), _seed_ns(docs[EADE_SAC_1000], "SAC")
    )


EADE_QUOTES += [
    _eade_vs_quote(EADE_VARIANTS["faithful"]),
    _eade_vs_quote(EADE_FAITHFUL_7),
    _eade_vs_quote(EADE_FAITHFUL_7, "SAC"),
    Q(
        EADE,
        (EADE_FAITHFUL, EADE_SAC_1000),
        "SAC trained {ep} episodes places {n} (held-out {h}); paired by seed, EADE-DDPG − SAC is "
        "{d} tasks, 95 % interval [{lo}, {hi}] over {k} seeds, which {holds} zero. Its training "
        "took {cpu} s of CPU per seed",
        ep=lambda ds: episodes_trained(ds[EADE_SAC_1000]["training"]["SAC"]),
        n=lambda ds: pm(ds[EADE_SAC_1000]["algorithms"]["SAC"]["N"], 1),
        h=lambda ds: pm(ds[EADE_SAC_1000]["held_out"]["SAC"]["N"], 1),
        cpu=lambda ds: pm(ds[EADE_SAC_1000]["training"]["SAC"]["cpu_s"], 0),
        k=lambda ds: _eade_vs_sac_1000(ds)["n"],
        **{k: (lambda ds, k=k: _eade_vs_sac_1000(ds)[k]) for k in ("d", "lo", "hi", "holds")},
    ),
    *_variant_quotes(EADE_FAITHFUL_7, "Over the seven seeds")[:2],
    Q(
        EADE,
        EADE_7_RESULTS,
        "EADE-DDPG places {e} on the new seeds' streams, Random {r}",
        e=lambda d: _new_seeds(d, "EADE-DDPG"),
        r=lambda d: _new_seeds(d, "Random"),
    ),
    Q(
        EADE,
        EADE_7_RESULTS,
        "ahead of Random on {ahead} seeds, level on {level} and behind on {behind}",
        **{k: (lambda d, k=k: _eade_against_random(d)[k]) for k in ("ahead", "level", "behind")},
    ),
    Q(
        EADE,
        EADE_7_RESULTS,
        "Two more seeds moved the gap from {d} [{lo}, {hi}] (five seeds)",
        **{k: (lambda d, k=k: _eade_vs(d, seeds=5)[k]) for k in ("d", "lo", "hi")},
    ),
    Q(
        EADE,
        EADE_7_RESULTS,
        "On the held-out streams it stays behind Random ({e} against {r})",
        e=lambda d: pm(d["held_out"]["EADE-DDPG"]["N"], 1),
        r=lambda d: pm(d["held_out"]["Random"]["N"], 1),
    ),
    Q(
        EADE,
        EADE_7_RESULTS,
        "The kept weights of the new seeds come from episodes {k}",
        k=lambda d: _and(d["training"]["EADE-DDPG"]["kept_episode"][EADE_NEW_SEEDS:]),
    ),
    *_variant_quotes(EADE_VARIANTS["fixed"], "On its fixed stream"),
    *_variant_quotes(EADE_VARIANTS["faithful"], "In the faithful setting"),
    Q(
        EADE,
        f"{EADE_VARIANTS['fixed']}/curves.csv",
        "On its fixed stream, the best validation N within the first 100 episodes, mean over seeds: "
        "EADE-DDPG {e100:.1f}, SAC {s100:.1f}; within all of them: {e:.1f} and {s:.1f}",
        e100=lambda rows: _best_val_n(rows, "EADE-DDPG", 100),
        s100=lambda rows: _best_val_n(rows, "SAC", 100),
        e=lambda rows: _best_val_n(rows, "EADE-DDPG", math.inf),
        s=lambda rows: _best_val_n(rows, "SAC", math.inf),
    ),
]


# --- docs/multi.md and docs/seeds-multi.md: bench_multi -----------------------------------------
MULTI = "docs/multi.md"
SEEDS = "docs/seeds-multi.md"
MULTI_FILES = {
    "campus": "results/multi/campus.json",
    "fattree": "results/multi/fattree.json",
    "Abilene": "results/multi/topozoo-Abilene.json",
}
MULTI_SUMMARY = "results/multi/summary.json"
SEEDS_JSON = "results/multi/seeds.json"
SIX = ("ces-multi", "fifo", "fifo-backfill", "sjf", "las", "edf")
POLICY = {
    "ces-multi": "CES-Multi",
    "fifo": "strict FIFO",
    "fifo-backfill": "fifo-backfill",
    "sjf": "SJF",
    "las": "LAS",
    "edf": "EDF",
    "min": "Min",
    "optimus": "Optimus",
    "edgeflow": "EdgeFlow",
    "elasticflow": "ElasticFlow-like",
    "tapfinger": "TapFinger",
}


def _policies(result: dict, policies: tuple[str, ...] | None) -> dict:
    algos = result["algorithms"]
    return {k: v for k, v in algos.items() if policies is None or k in policies}


def _multi_block(
    result: dict, policies: tuple[str, ...] | None = None, summary: dict | None = None
) -> str:
    """bench_multi's table of one topology (`scheduler.evaluate.multi_table`), with the targets
    line bench_multi prints after it when `summary` is given."""
    from scheduler.evaluate import multi_table

    text = multi_table({**result, "algorithms": _policies(result, policies)})
    if summary is not None:
        s = next(  # summary.json is keyed by the topology's name, its file by the name's form
            v for v in summary["topologies"].values() if v["file"] == f"{result['topology']}.json"
        )
        ratios = ", ".join(
            f"{what} {v['ces_multi'] / v['best']:.2f} × the best"
            for what, v in (
                ("while jobs arrive", s["balance_std_arrivals"]),
                ("while jobs wait", s["balance_std_queued"]),
            )
            if v["ces_multi"] is not None
        )
        text += (
            "\ntargets: "
            + ", ".join(f"{k} {'met' if v['met'] else 'MISSED'}" for k, v in s["targets"].items())
            + f"; util std {ratios}  ({result['wall_s']:.0f} s)"
        )
    return "```\n" + text + "\n```\n"


def _versus(
    algos: dict, metric: str, lower: bool, shown: Callable[[float], str], target: bool = True
) -> str:
    """CES-Multi's figure against the best other policy's: met (best or within 5 %) or missed."""
    mine = algos["ces-multi"][metric]["mean"]
    others = {p: m[metric]["mean"] for p, m in algos.items() if p != "ces-multi"}
    others = {p: v for p, v in others.items() if v is not None}
    best = (min if lower else max)(others, key=others.__getitem__)
    theirs = others[best]
    is_best = mine <= theirs if lower else mine >= theirs
    met = mine <= theirs * 1.05 + 1e-9 if lower else mine >= theirs * 0.95 - 1e-9
    head = ("met: " if met else "**missed**: ") if target else ""
    other = f"{POLICY[best]} {shown(theirs)}"
    if is_best:
        return f"{head}{shown(mine)}, best ({other})"
    if shown(mine) == shown(theirs):  # level to the digits shown
        return f"{head}{shown(mine)} ({other})"
    if lower:
        return f"{head}{shown(mine)} ({other}, {mine / theirs:.2f} ×)"
    return f"{head}{shown(mine)} ({other}, {100 * (1 - mine / theirs):.1f} % lower)"


def _max_wait(algos: dict) -> str:
    mine, fb = (algos[p]["max_wait_s"]["mean"] for p in ("ces-multi", "fifo-backfill"))
    if mine < fb:
        return f"met: {mine:.0f} vs {fb:.0f} s"
    return f"**missed**: {mine:.0f} vs {fb:.0f} s ({mine / fb:.2f} ×)"


def _targets_table(policies: tuple[str, ...] | None, queued_row: bool) -> Callable[..., str]:
    """Issue 24's targets per topology (bench_multi's `targets`, phrased), among `policies`."""

    def render(*results: dict) -> str:
        algos = [_policies(r, policies) for r in results]
        seconds = lambda x: f"{x:.0f} s"
        three = lambda x: f"{x:.3f}"
        rows = [
            ["average wait", *(_versus(a, "avg_wait_s", True, seconds) for a in algos)],
            ["utilisation std", *(_versus(a, "balance_std", True, three) for a in algos)],
        ]
        if queued_row:
            rows.append(
                [
                    "utilisation std while jobs wait (not a target)",
                    *(_versus(a, "balance_std_queued", True, three, target=False) for a in algos),
                ]
            )
        rows += [
            [
                "bandwidth satisfaction",
                *(_versus(a, "bw_satisfaction", False, three) for a in algos),
            ],
            ["max wait < fifo-backfill's", *(_max_wait(a) for a in algos)],
        ]
        return md_table(["", *MULTI_FILES], rows)

    return render


def _who_beats(*results: dict) -> str:
    """Per figure, the policies better than CES-Multi on each topology (none: CES-Multi's is the
    best; the three best named), over every policy of the bench."""
    figures = [
        ("average wait s", "avg_wait_s", True, "{:.0f}"),
        ("max wait s", "max_wait_s", True, "{:.0f}"),
        ("JCT s", "jct_s", True, "{:.0f}"),
        ("deadline hit rate", "deadline_hit_rate", False, "{:.3f}"),
        ("bandwidth satisfaction", "bw_satisfaction", False, "{:.3f}"),
        ("utilisation std", "balance_std", True, "{:.3f}"),
        ("std arriving (not a target)", "balance_std_arrivals", True, "{:.3f}"),
        ("std queued (not a target)", "balance_std_queued", True, "{:.3f}"),
        ("migrations per job", "migrations_per_job", True, "{:.3f}"),
    ]
    rows = []
    for label, key, lower, fmt in figures:
        cells = []
        for r in results:
            a = r["algorithms"]
            mine = a["ces-multi"][key]["mean"]
            better = sorted(
                (
                    (m[key]["mean"], p)
                    for p, m in a.items()
                    if p != "ces-multi"
                    and m[key]["mean"] is not None
                    and (m[key]["mean"] < mine if lower else m[key]["mean"] > mine)
                ),
                reverse=not lower,
            )
            named = ", ".join(f"{POLICY[p]} {fmt.format(v)}" for v, p in better[:3])
            more = f" and {len(better) - 3} more" if len(better) > 3 else ""
            cells.append(f"{fmt.format(mine)}: {named + more if better else 'best'}")
        rows.append([label, *cells])
    return md_table(["CES-Multi's figure: the policies better", *MULTI_FILES], rows)


def _wall(name: str) -> Callable[[dict], float]:
    return lambda d: d[MULTI_FILES[name]]["wall_s"]


def _mean(policy: str, key: str) -> tuple:
    return ("algorithms", policy, key, "mean")


MULTI_TABLES = [
    *(
        Table(f"multi-{name}", MULTI, (path,), lambda r: _multi_block(r, SIX))
        for name, path in MULTI_FILES.items()
    ),
    Table("multi-targets", MULTI, tuple(MULTI_FILES.values()), _targets_table(SIX, False)),
]
SEEDS_TABLES = [
    *(
        Table(
            f"seeds-bench-{name}",
            SEEDS,
            (path, MULTI_SUMMARY),
            lambda r, s: _multi_block(r, None, s),
        )
        for name, path in MULTI_FILES.items()
    ),
    Table("seeds-targets", SEEDS, tuple(MULTI_FILES.values()), _targets_table(None, True)),
    Table("seeds-who-beats", SEEDS, tuple(MULTI_FILES.values()), _who_beats),
]


TAPFINGER_ROWS = {
    "tapfinger": "TapFinger, greedy",
    "tapfinger-sampled": "TapFinger, sampled",
    "las": "Tiresias (LAS, ours)",
    "tiresias-paper": "Tiresias (the paper's elastic rule)",
    "optimus": "Optimus-like",
    "random": "Random",
    "min": "Min",
    "kind-aware": "Kind-aware (a fixed rule, not the paper's)",
}


def _allocations_quote(text: str, checkpoint: str) -> Quote:
    """A quote of a checkpoint's commonest allocations to each kind ({v}: vision, {l}: language)."""
    return Q(
        SEEDS,
        SEEDS_JSON,
        text,
        v=lambda d: _allocations(d, checkpoint, "vision"),
        l=lambda d: _allocations(d, checkpoint, "language"),
    )


SEPARATE = "tapfinger@separate-critic"  # the training with a critic encoder of its own


def _signed_pct(x: float) -> str:
    return f"{'+' if x >= 0 else '−'}{abs(100 * x):.1f} %"


def _paired(r: dict) -> str:
    """A paired ratio with its 95 % interval, as a signed percentage."""
    if r["low"] is None:
        return _signed_pct(r["ratio"] - 1)
    return (
        f"{_signed_pct(r['ratio'] - 1)} [{_signed_pct(r['low'] - 1)}, {_signed_pct(r['high'] - 1)}]"
    )


def _tapfinger_paper(doc: dict) -> str:
    """Every policy's average JCT (mean ± sd over the episodes) and TapFinger, greedy and
    sampled, over it paired by episode; another checkpoint's rows (tapfinger@name) after
    TapFinger's."""
    s = doc["tapfinger_paper_setting"]
    jct, vs = s["avg_jct_slots"], s["tapfinger_vs"]
    labels = dict(list(TAPFINGER_ROWS.items())[:2])
    for k in (k for k in jct if k.startswith("tapfinger@")):
        name, sampled = (
            k.removeprefix("tapfinger@").removesuffix("-sampled"),
            k.endswith("-sampled"),
        )
        labels[k] = f"TapFinger ({name}), {'sampled' if sampled else 'greedy'}"
    labels |= dict(list(TAPFINGER_ROWS.items())[2:])
    rows = [
        (
            label,
            pm(jct[key], 2),
            *(
                _paired(vs[mode][key]) if key in vs[mode] else ""
                for mode in ("tapfinger", "tapfinger-sampled")
            ),
        )
        for key, label in labels.items()
        if key in jct
    ]
    return md_table(
        ("policy", "avg JCT", "TapFinger greedy vs it", "TapFinger sampled vs it"), rows
    )


def _edgeflow(doc: dict) -> str:
    e = doc["edgeflow"]["campus"]
    rows = [
        (
            label,
            pm(e[key]["deadline_satisfaction"], 3),
            pm(e[key]["migrations_per_job"], 3),
            pm(e[key]["avg_wait_s"], 0),
            pm(e[key]["jct_s"], 0),
        )
        for key, label in (
            ("edgeflow", "EdgeFlow"),
            ("edf", "EDF"),
            ("elasticflow", "ElasticFlow-like"),
        )
    ]
    return md_table(
        ("policy", "deadline satisfaction", "migrations per job", "avg wait s", "JCT s"), rows
    )


SEEDS_QUOTES = [
    Q(
        SEEDS,
        (MULTI_FILES["fattree"],),
        "the one policy with a lower utilisation std (TapFinger on the fat-tree) waits {x:.0f} × longer",
        x=lambda d: (
            at(d, MULTI_FILES["fattree"], *_mean("tapfinger", "avg_wait_s"))
            / at(d, MULTI_FILES["fattree"], *_mean("ces-multi", "avg_wait_s"))
        ),
    ),
]

SEEDS_TABLES += [
    Table("seeds-tapfinger-paper", SEEDS, (SEEDS_JSON,), _tapfinger_paper),
    Table("seeds-edgeflow", SEEDS, (SEEDS_JSON,), _edgeflow),
]


def _topo_mean(name: str, policy: str, key: str) -> Callable[[dict], float]:
    """A policy's mean figure on one of bench_multi's topologies (quotes over MULTI_FILES)."""
    return lambda d: d[MULTI_FILES[name]]["algorithms"][policy][key]["mean"]


def _per_topology(policy: str, key: str, fmt: str) -> Callable[[dict], str]:
    """'campus, fattree and Abilene' figures of one policy, as the docs list them."""

    def cells(d: dict) -> str:
        xs = [fmt.format(_topo_mean(n, policy, key)(d)) for n in MULTI_FILES]
        return f"{xs[0]}, {xs[1]} and {xs[2]}"

    return cells


def _wait_ratio(d: dict, policy: str, name: str) -> float:
    return _topo_mean(name, policy, "avg_wait_s")(d) / _topo_mean(name, "ces-multi", "avg_wait_s")(
        d
    )


ALL_TOPOS = tuple(MULTI_FILES.values())
WALLS = Q(
    MULTI,
    ALL_TOPOS,
    "(campus {c:.0f} s, fattree {f:.0f} s, Abilene {a:.0f} s)",
    c=_wall("campus"),
    f=_wall("fattree"),
    a=_wall("Abilene"),
)
MULTI_QUOTES = [
    WALLS,
    Q(
        MULTI,
        ALL_TOPOS,
        "CES-Multi's figures improved on campus and fattree (average wait 2757 → {cw:.0f} s and 663 → "
        "{fw:.0f} s, std 0.168 → {cs:.3f} and 0.169 → {fs:.3f}) and worsened on Abilene (std 0.165 → "
        "{as_:.3f}, maximum wait 50453 → {am:.0f} s, now {r:.2f} × fifo-backfill's)",
        cw=_topo_mean("campus", "ces-multi", "avg_wait_s"),
        fw=_topo_mean("fattree", "ces-multi", "avg_wait_s"),
        cs=_topo_mean("campus", "ces-multi", "balance_std"),
        fs=_topo_mean("fattree", "ces-multi", "balance_std"),
        as_=_topo_mean("Abilene", "ces-multi", "balance_std"),
        am=_topo_mean("Abilene", "ces-multi", "max_wait_s"),
        r=lambda d: (
            _topo_mean("Abilene", "ces-multi", "max_wait_s")(d)
            / _topo_mean("Abilene", "fifo-backfill", "max_wait_s")(d)
        ),
    ),
    Q(
        MULTI,
        ALL_TOPOS,
        "CES-Multi's std is the lowest of the six (now {c:.3f}, fifo-backfill {fb:.3f}); but it keeps a "
        "job waiting a smaller share of the run (now {cq:.0f} % against EDF's {eq:.0f} %)",
        c=_topo_mean("campus", "ces-multi", "balance_std_queued"),
        fb=_topo_mean("campus", "fifo-backfill", "balance_std_queued"),
        cq=lambda d: 100 * _topo_mean("campus", "ces-multi", "queued_share")(d),
        eq=lambda d: 100 * _topo_mean("campus", "edf", "queued_share")(d),
    ),
    Q(
        MULTI,
        ALL_TOPOS,
        "(on fattree strict FIFO's {ff:.0f} s is below its {cf:.0f} s, on Abilene fifo-backfill's "
        "{fa:.0f} below its {ca:.0f}; session 28)",
        ff=_topo_mean("fattree", "fifo", "max_wait_s"),
        cf=_topo_mean("fattree", "ces-multi", "max_wait_s"),
        fa=_topo_mean("Abilene", "fifo-backfill", "max_wait_s"),
        ca=_topo_mean("Abilene", "ces-multi", "max_wait_s"),
    ),
    Q(
        MULTI,
        ALL_TOPOS,
        "CES-Multi is best on Abilene ({a:.3f}); on campus EDF's {e:.3f} is below its {c:.3f}, on "
        "fattree fifo-backfill's {fb:.3f} below its {f:.3f}.",
        a=_topo_mean("Abilene", "ces-multi", "balance_std_arrivals"),
        e=_topo_mean("campus", "edf", "balance_std_arrivals"),
        c=_topo_mean("campus", "ces-multi", "balance_std_arrivals"),
        fb=_topo_mean("fattree", "fifo-backfill", "balance_std_arrivals"),
        f=_topo_mean("fattree", "ces-multi", "balance_std_arrivals"),
    ),
]
SEEDS_QUOTES += [
    Q(SEEDS, WALLS.source, WALLS.text, **WALLS.values),
    Q(
        SEEDS,
        ALL_TOPOS,
        "CES-Multi's own figures improved on campus (average wait 2757 → {cw:.0f} s, max wait 60225 → "
        "{cm:.0f}) and fattree (std 0.169 → {fs:.3f}, average wait 663 → {fw:.0f} s) and worsened on "
        "Abilene (std 0.165 → {as_:.3f}, max wait 50453 → {am:.0f})",
        cw=_topo_mean("campus", "ces-multi", "avg_wait_s"),
        cm=_topo_mean("campus", "ces-multi", "max_wait_s"),
        fs=_topo_mean("fattree", "ces-multi", "balance_std"),
        fw=_topo_mean("fattree", "ces-multi", "avg_wait_s"),
        as_=_topo_mean("Abilene", "ces-multi", "balance_std"),
        am=_topo_mean("Abilene", "ces-multi", "max_wait_s"),
    ),
    Q(
        SEEDS,
        ALL_TOPOS,
        "average wait {w} s, JCT {j} s, utilisation std {s} at a mean utilisation of {u}, bandwidth "
        "satisfaction {b}. It still waits {lo:.0f}–{hi:.0f} × longer than CES-Multi, about as long as "
        "strict FIFO on campus ({fifo:.0f} s).",
        w=_per_topology("tapfinger", "avg_wait_s", "{:.0f}"),
        j=_per_topology("tapfinger", "jct_s", "{:.0f}"),
        s=_per_topology("tapfinger", "balance_std", "{:.3f}"),
        u=_per_topology("tapfinger", "utilisation", "{:.2f}"),
        b=_per_topology("tapfinger", "bw_satisfaction", "{:.3f}"),
        lo=lambda d: min(_wait_ratio(d, "tapfinger", n) for n in MULTI_FILES),
        hi=lambda d: max(_wait_ratio(d, "tapfinger", n) for n in MULTI_FILES),
        fifo=_topo_mean("campus", "fifo", "avg_wait_s"),
    ),
    Q(
        SEEDS,
        ALL_TOPOS,
        "Now TapFinger finishes {every} job on all three",
        every=lambda d: (
            "every"
            if all(
                d[s]["algorithms"]["tapfinger"]["finished"]["mean"] == d[s]["arrivals"]["n"]
                for s in ALL_TOPOS
            )
            else "not every"
        ),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "The run took {t:.0f} s of wall time (TapFinger's setting {p:.0f} s, EdgeFlow {e:.0f} s)",
        t=lambda d: d["tapfinger_paper_setting"]["wall_s"] + d["edgeflow"]["campus"]["wall_s"],
        p=("tapfinger_paper_setting", "wall_s"),
        e=("edgeflow", "campus", "wall_s"),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "TapFinger has the paper's direction, and more: {vs} (the paper: {claim})",
        vs=lambda d: _paired(_vs(d, "tiresias-paper")),
        claim=lambda d: _signed_pct(d["tapfinger_paper_setting"]["paper_claim_vs_tiresias"]),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "scores {j:.2f} slots here where the authors' released",
        j=lambda d: _jct(d, "tiresias-paper"),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "TapFinger is {level}: {vs}, an interval that {holds} zero",
        level=lambda d: _level(_vs(d, "las")),
        vs=lambda d: _paired(_vs(d, "las")),
        holds=lambda d: "holds" if _level(_vs(d, "las")) == "level" else "excludes",
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "it is {than} greedy ({s:.2f} against {g:.2f} slots)",
        than=lambda d: (
            "slower than"
            if _jct(d, "tapfinger-sampled") > _jct(d, "tapfinger")
            else "NOT slower than"
        ),
        s=lambda d: _jct(d, "tapfinger-sampled"),
        g=lambda d: _jct(d, "tapfinger"),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "all {n} of the planned {of} episodes, {cpu:.0f} s of CPU and {wall:.0f} s of wall time",
        n=("tapfinger_paper_setting", "training", "episodes"),
        of=("tapfinger_paper_setting", "training", "of"),
        cpu=("tapfinger_paper_setting", "training", "cpu_s"),
        wall=("tapfinger_paper_setting", "training", "wall_s"),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "validation JCT was {v1:.1f} after\n"
        "the first update, {v176:.1f} after 176 episodes and {last:.1f} at the end; its best, "
        "{best:.2f} slots, after {kept} episodes, is the\ncheckpoint's (the median of the last "
        "half's {n} scores: {median:.1f})",
        v1=lambda d: _validations(d)[0][1],
        v176=lambda d: dict(_validations(d))[176],
        last=lambda d: _validations(d)[-1][1],
        best=lambda d: _trained(d)["validation"],
        kept=lambda d: _trained(d)["kept_after_episodes"],
        n=lambda d: len(_last_half(d)),
        median=lambda d: statistics.median(_last_half(d)),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "went from {r0} (the first four updates) to {r1} (the last four), and its\n"
        "entropy fell from {e0:.2f} to {e1:.2f}",
        r0=lambda d: _minus(statistics.mean(r["return"] for r in _history(d)[:4])),
        r1=lambda d: _minus(statistics.mean(r["return"] for r in _history(d)[-4:])),
        e0=lambda d: _history(d)[0]["entropy"],
        e1=lambda d: _history(d)[-1]["entropy"],
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "the gradient's norm\nbefore clipping was {g0:.1f}–{g1:.1f} against the clip of {clip}, "
        "and the critic's loss ({v:.2f} on\naverage, weighted {vc}) dwarfs the policy's "
        "(|{p:.4f}|) and the entropy term's ({ec} × {e:.2f})",
        g0=lambda d: min(r["grad_norm"] for r in _history(d)),
        g1=lambda d: max(r["grad_norm"] for r in _history(d)),
        clip=lambda d: _trained(d)["hyper"]["max_grad"],
        v=lambda d: statistics.mean(r["value"] for r in _history(d)),
        vc=lambda d: _trained(d)["hyper"]["value_coef"],
        p=lambda d: statistics.mean(abs(r["policy"]) for r in _history(d)),
        ec=lambda d: _trained(d)["hyper"]["entropy"],
        e=lambda d: statistics.mean(r["entropy"] for r in _history(d)),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "(explained variance {e0:.2f} in the first\nupdate, {lo:.2f}–{hi:.2f} from the third on)",
        e0=lambda d: _history(d)[0]["explained_variance"],
        lo=lambda d: min(r["explained_variance"] for r in _history(d)[2:]),
        hi=lambda d: max(r["explained_variance"] for r in _history(d)[2:]),
    ),
    _allocations_quote('"vision" tasks {v}; "language" tasks {l}.', "tapfinger"),
    _allocations_quote(
        'Session 22\'s weights had not learned the kinds apart: "vision" {v}; "language" {l}.',
        "session-22",
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "{n} updates in {h:.2f} CPU h",
        n=lambda d: len(_history(d)),
        h=lambda d: _trained(d)["cpu_s"] / 3600,
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "sampled, on the benchmark episodes below, it is {pct:.0f} % faster\nthan session 22's "
        "weights sampled",
        pct=lambda d: (
            100
            * (
                1
                - d["tapfinger_paper_setting"]["tapfinger_vs"]["tapfinger-sampled"][
                    "tapfinger@session-22-sampled"
                ]["ratio"]
            )
        ),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "It trained all {n} of {of} episodes in {cpu:.0f} s of CPU; its best\nvalidation, "
        "{v:.2f} slots, came after {k} episodes",
        n=("tapfinger_paper_setting", "other_checkpoints", "separate-critic", "episodes"),
        of=("tapfinger_paper_setting", "other_checkpoints", "separate-critic", "of"),
        cpu=("tapfinger_paper_setting", "other_checkpoints", "separate-critic", "cpu_s"),
        v=("tapfinger_paper_setting", "other_checkpoints", "separate-critic", "validation"),
        k=(
            "tapfinger_paper_setting",
            "other_checkpoints",
            "separate-critic",
            "kept_after_episodes",
        ),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "against our\nTiresias (LAS) {las} ({level}), against the paper's elastic rule\n{paper}, "
        "against the shared-encoder checkpoint {shared}, and level with the fixed\nKind-aware "
        "rule ({kind}) and Optimus-like ({opt})",
        las=lambda d: _paired(_vs(d, "las", SEPARATE)),
        level=lambda d: _level(_vs(d, "las", SEPARATE)),
        paper=lambda d: _paired(_vs(d, "tiresias-paper", SEPARATE)),
        shared=lambda d: _paired(_vs(d, "tapfinger", SEPARATE)),
        kind=lambda d: _paired(_vs(d, "kind-aware", SEPARATE)),
        opt=lambda d: _paired(_vs(d, "optimus", SEPARATE)),
    ),
    _allocations_quote(
        'greedy allocations on episode 1000: "vision" tasks {v}; "language" tasks {l}',
        "separate-critic",
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "(session 22's weights: {vs}, also {level})",
        vs=lambda d: _signed_pct(_vs(d, "las", "tapfinger@session-22")["ratio"] - 1),
        level=lambda d: _level(_vs(d, "las", "tapfinger@session-22")),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "is {pct:.0f} % below Tiresias ({k:.2f} vs {l:.2f})",
        pct=lambda d: 100 * (1 - _jct(d, "kind-aware") / _jct(d, "las")),
        k=lambda d: _jct(d, "kind-aware"),
        l=lambda d: _jct(d, "las"),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "their Tiresias's 10.79 is {pct:.0f} % above ours ({l:.2f})",
        pct=lambda d: 100 * (10.79 / _jct(d, "las") - 1),
        l=lambda d: _jct(d, "las"),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "EdgeFlow meets {pts:.1f} points more deadlines than EDF (within one sd), with {mig:.0f} % "
        "fewer migrations and {wait:.0f} % less waiting",
        pts=lambda d: (
            100
            * (_ef(d, "edgeflow", "deadline_satisfaction") - _ef(d, "edf", "deadline_satisfaction"))
        ),
        mig=lambda d: (
            100
            * (1 - _ef(d, "edgeflow", "migrations_per_job") / _ef(d, "edf", "migrations_per_job"))
        ),
        wait=lambda d: 100 * (1 - _ef(d, "edgeflow", "avg_wait_s") / _ef(d, "edf", "avg_wait_s")),
    ),
    Q(
        SEEDS,
        SEEDS_JSON,
        "deadline satisfaction falls to {d:.2f}",
        d=lambda d: _ef(d, "elasticflow", "deadline_satisfaction"),
    ),
]


def _jct(d: dict, policy: str) -> float:
    return d["tapfinger_paper_setting"]["avg_jct_slots"][policy]["mean"]


def _vs(d: dict, policy: str, tapfinger: str = "tapfinger") -> dict:
    """TapFinger (greedy; or another checkpoint's, "tapfinger@name") over `policy`, paired by
    episode."""
    return d["tapfinger_paper_setting"]["tapfinger_vs"][tapfinger][policy]


def _level(r: dict) -> str:
    """A paired ratio's verdict: ahead (interval below 1), behind (above) or level."""
    return "ahead" if r["high"] < 1 else "behind" if r["low"] > 1 else "level"


def _trained(d: dict) -> dict:
    """The TapFinger checkpoint's training record (paper part)."""
    return d["tapfinger_paper_setting"]["training"]


def _history(d: dict) -> list[dict]:
    return _trained(d)["history"]


def _validations(d: dict) -> list[tuple[int, float]]:
    """(episodes, validation score) of every validated update."""
    return [(r["episodes"], r["validation"]) for r in _history(d) if "validation" in r]


def _last_half(d: dict) -> list[float]:
    rows = _validations(d)
    return [v for _, v in rows[len(rows) // 2 :]]


def _minus(x: float) -> str:
    return f"−{-x:,.0f}" if x < 0 else f"{x:,.0f}"


def _allocations(d: dict, checkpoint: str, kind: str, top: int = 3) -> str:
    """A checkpoint's commonest greedy allocations to `kind` on episode 1000: "(c, g) n, ..."."""
    given = d["tapfinger_paper_setting"]["allocations_episode_1000"][checkpoint][kind]
    return ", ".join(f"({cell.replace(',', ', ')}) {n}" for cell, n in list(given.items())[:top])


def _ef(d: dict, policy: str, key: str) -> float:
    return d["edgeflow"]["campus"][policy][key]["mean"]


# --- docs/ppo.md -------------------------------------------------------------------------------
PPO = "docs/ppo.md"
SPREAD = "results/ppo/spread.json"
BENCH = "results/ppo/bench.json"
SCHED = "results/bench_scheduler.json"
CURVE = "results/ppo/learning_curve.csv"


def _gw(cell: dict) -> str:
    """'geomean (worst)' of a spread.json ratio cell."""
    return f"{cell['geomean']:.3f} ({cell['worst']:.2f})"


def _spread_rows(part: dict) -> list[str]:
    bound = part["over_bound"]
    return [
        _gw(part["ces-ppo"]["network-aware"]),
        _gw(part["ces-ppo:greedy"]["network-aware"]),
        _gw(part["ces-ppo:own"]["network-aware"]),
        f"{bound['ces-ppo']['geomean']:.2f} / {bound['network-aware']['geomean']:.2f}",
    ]


def _spread_table(doc: dict) -> str:
    rows = [[topo, *_spread_rows(part)] for topo, part in doc["topologies"].items()]
    total = _spread_rows(doc["all"])
    rows.append(["all", *(f"**{c}**" for c in total[:3]), total[3]])
    return md_table(
        (
            "topology",
            "CES-PPO: geomean (worst)",
            "the policy alone",
            "its own decoding",
            "over the lower bound: CES-PPO / network-aware",
        ),
        rows,
    )


def _ratio(policy: str, other: str, stat: str = "geomean", part: tuple = ("all",)) -> tuple:
    return (*part, policy, other, stat)


def _phase_best(rows: list[dict], phases: tuple[str, ...]) -> float:
    """The best validation figure of the learning curve's `phases` (the weights kept)."""
    return min(
        float(r["vs_network_aware"]) for r in rows if r["phase"] in phases and r["vs_network_aware"]
    )


PPO_TABLES = [Table("ppo-spread", PPO, (SPREAD,), _spread_table)]

BUNDLED = "results/ppo/spread-bundled.json"


def _placed_by_all(doc: dict) -> int:
    return same(0, *doc["all"]["placed"].values())


def _spread_line(prefix: str, source: str) -> Quote:
    """'default G (W), the policy alone G (W), its own decoding G (W)' of a bench_spread run."""
    return Q(
        PPO,
        source,
        prefix + "default {d:.3f} ({dw:.2f}), the policy alone {g:.3f} ({gw:.2f}), its own "
        "decoding {o:.3f} ({ow:.2f})",
        d=_ratio("ces-ppo", "network-aware"),
        dw=_ratio("ces-ppo", "network-aware", "worst"),
        g=_ratio("ces-ppo:greedy", "network-aware"),
        gw=_ratio("ces-ppo:greedy", "network-aware", "worst"),
        o=_ratio("ces-ppo:own", "network-aware"),
        ow=_ratio("ces-ppo:own", "network-aware", "worst"),
    )


def _pairwise_na(topo: str) -> tuple:
    return ("comparison", topo, "ces_ppo_vs_baselines_pairwise", "network-aware")


def _campus_alg(name: str, key: str) -> tuple:
    return ("comparison", "campus", "algorithms", name, key, "mean")


PPO_QUOTES = [
    Q(PPO, SPREAD, "writes results/ppo/spread.json ({s:.0f} s)", s=("wall_s",)),
    Q(PPO, BENCH, "writes results/ppo/bench.json ({s:.0f} s)", s=("seconds",)),
    Q(
        PPO,
        SPREAD,
        "{jobs} jobs, {placed} placed by every algorithm (the same {none} placed by none)",
        jobs=("all", "jobs"),
        placed=_placed_by_all,
        none=lambda d: d["all"]["jobs"] - _placed_by_all(d),
    ),
    Q(
        PPO,
        SPREAD,
        "network-aware's placement with CES's paths and rates {nac:.3f}; k8s-spread {k:.3f}, "
        "first-fit {ff:.3f}, best-fit {bf:.3f}, utilization {u:.3f}, random {r:.3f}. The policy "
        "alone: network-aware/ces {gnac:.3f}, k8s-spread {gk:.3f}, first-fit {gff:.3f}, best-fit "
        "{gbf:.3f}, utilization {gu:.3f}, random {gr:.3f}. The ratio to the lower bound (last "
        "column) bounds the gap to optimal from above; the policy alone's is {gb:.2f}.",
        nac=_ratio("ces-ppo", "network-aware/ces"),
        k=_ratio("ces-ppo", "k8s-spread"),
        ff=_ratio("ces-ppo", "first-fit"),
        bf=_ratio("ces-ppo", "best-fit"),
        u=_ratio("ces-ppo", "utilization"),
        r=_ratio("ces-ppo", "random"),
        gnac=_ratio("ces-ppo:greedy", "network-aware/ces"),
        gk=_ratio("ces-ppo:greedy", "k8s-spread"),
        gff=_ratio("ces-ppo:greedy", "first-fit"),
        gbf=_ratio("ces-ppo:greedy", "best-fit"),
        gu=_ratio("ces-ppo:greedy", "utilization"),
        gr=_ratio("ces-ppo:greedy", "random"),
        gb=("all", "over_bound", "ces-ppo:greedy", "geomean"),
    ),
    Q(
        PPO,
        SPREAD,
        "Targets: geomean ≤ 0.90 **met** ({d:.3f}); worst ≤ 1.10 **met** ({dw:.2f}: no job "
        "slower than network-aware's). The policy alone meets the geomean (**{g:.3f}**; session "
        "24's checkpoint: 0.958) and misses the worst (**{gw:.2f}**; 2.15 before)",
        d=_ratio("ces-ppo", "network-aware"),
        dw=_ratio("ces-ppo", "network-aware", "worst"),
        g=_ratio("ces-ppo:greedy", "network-aware"),
        gw=_ratio("ces-ppo:greedy", "network-aware", "worst"),
    ),
    Q(
        PPO,
        SPREAD,
        "Its own decoding: {o:.3f} (worst {ow:.2f}; 1.86 before)",
        o=_ratio("ces-ppo:own", "network-aware"),
        ow=_ratio("ces-ppo:own", "network-aware", "worst"),
    ),
    Q(
        PPO,
        SPREAD,
        "the default 0.809 → {d:.3f}, the policy alone 0.958 → {g:.3f}, its own decoding 0.810 → "
        "{o:.3f}, the ratio to the lower bound 1.71 → {b:.2f}",
        d=_ratio("ces-ppo", "network-aware"),
        g=_ratio("ces-ppo:greedy", "network-aware"),
        o=_ratio("ces-ppo:own", "network-aware"),
        b=("all", "over_bound", "ces-ppo", "geomean"),
    ),
    _spread_line(
        "`--topologies campus,star,fattree,ring --seeds 5 --reps 0 --out "
        "results/ppo/spread-bundled.json`, 58 jobs): ",
        BUNDLED,
    ),
    Q(
        PPO,
        BUNDLED,
        "--reps 0 --out results/ppo/spread-bundled.json`, {n} jobs)",
        n=_placed_by_all,
    ),
    Q(
        PPO,
        BENCH,
        "the jobs both placed (per seed, mean) {c:.3f}, {a:.3f}, {p:.3f}, {g:.3f} (session 24's",
        c=_pairwise_na("campus"),
        a=_pairwise_na("topozoo/Abilene"),
        p=_pairwise_na("sndlib/polska"),
        g=_pairwise_na("gabriel/100/0"),
    ),
    Q(
        PPO,
        BENCH,
        "ends {fast:.1f} % faster on those jobs ({g:.4f} against {d:.4f} s) and {bal:.1f} % better "
        "balanced (std {gb:.3f} against {db:.3f})",
        fast=lambda d: (
            100
            * (
                1
                - at(d, *_campus_alg("ces-ppo (policy alone)", "iteration_time_s_common_jobs"))
                / at(d, *_campus_alg("ces-ppo", "iteration_time_s_common_jobs"))
            )
        ),
        g=_campus_alg("ces-ppo (policy alone)", "iteration_time_s_common_jobs"),
        d=_campus_alg("ces-ppo", "iteration_time_s_common_jobs"),
        bal=lambda d: (
            100
            * (
                1
                - at(d, *_campus_alg("ces-ppo (policy alone)", "balance_std"))
                / at(d, *_campus_alg("ces-ppo", "balance_std"))
            )
        ),
        gb=_campus_alg("ces-ppo (policy alone)", "balance_std"),
        db=_campus_alg("ces-ppo", "balance_std"),
    ),
    Q(
        PPO,
        BENCH,
        "It is the only point that dominates CES-PPO (`dominated_by`); no other algorithm does on "
        "any of the {n}.",
        n=lambda d: {4: "four"}[
            sum(
                c["dominated_by"]["ces-ppo"] in ([], ["ces-ppo (policy alone)"])
                for c in d["comparison"].values()
            )
        ],
    ),
    Q(
        PPO,
        BENCH,
        "(50 small instances, all proven optimal): mean **{m:.3f}**: CES-PPO finds the optimum on "
        "all {n} (network-aware: {na:.2f}, {w:.0f} % within 1.10)",
        m=("gap_to_exact", "ces-ppo", "mean"),
        n=lambda d: same(
            0, d["gap_to_exact"]["instances"], d["gap_to_exact"]["exact_proven_optimal"]
        ),
        na=("gap_to_exact", "network-aware", "mean"),
        w=lambda d: 100 * d["gap_to_exact"]["network-aware"]["within_1.10"],
    ),
    Q(
        PPO,
        SCHED,
        "results/bench_scheduler.json's 60 instances (seed 0): {m:.3f} ({o:.0f} % optimal;",
        m=("gap", "algorithms", "ces-ppo", "mean_ratio"),
        o=lambda d: 100 * d["gap"]["algorithms"]["ces-ppo"]["optimal_fraction"],
    ),
    Q(
        PPO,
        BENCH,
        "The policy alone: {m:.3f} (session 24's",
        m=("gap_to_exact", "ces-ppo (decode budget 0)", "mean"),
    ),
    Q(
        PPO,
        SPREAD,
        "the 16-GPU ring on gen:internet:100 {a:.1f} / {b:.1f} ms (target ≤ 20;",
        a=("latency", "16 tasks, 100 nodes", "p50_ms"),
        b=("latency", "16 tasks, 100 nodes", "p99_ms"),
    ),
    Q(
        PPO,
        SPREAD,
        "an 8-task ring on gen:internet:1000 {a:.1f} / {b:.1f} ms (target ≤ 30;",
        a=("latency", "8 tasks, 1000 nodes", "p50_ms"),
        b=("latency", "8 tasks, 1000 nodes", "p99_ms"),
    ),
    Q(
        PPO,
        SCHED,
        "aware alone: {na:.2f} against 0.56 ms on gen:internet:16",
        na=("latency", "16", "algorithms", "network-aware", "p50_ms"),
    ),
    Q(
        PPO,
        SCHED,
        "8-task ring (session 28): gen:internet:16 {a:.1f} ms (16 first nodes, each one rollout, "
        "then the local search), gen:internet:100 {b:.1f} ms, gen:internet:1000 {c:.1f} ms",
        a=("latency", "16", "algorithms", "ces-ppo", "p50_ms"),
        b=("latency", "100", "algorithms", "ces-ppo", "p50_ms"),
        c=("latency", "1000", "algorithms", "ces-ppo", "p50_ms"),
    ),
    Q(
        PPO,
        BENCH,
        "8-task ring on gabriel/100/0 {a:.1f} / {b:.1f} ms (results/ppo/bench.json",
        a=("latency", "p50_ms"),
        b=("latency", "p99_ms"),
    ),
    Q(
        PPO,
        CURVE,
        "imitation and PPO end at {a:.3f} of network-aware's time, the first-node phase takes it "
        "to {b:.3f}",
        a=lambda rows: _phase_best(rows, ("imitation", "ppo")),
        b=lambda rows: _phase_best(rows, ("imitation", "ppo", "first node")),
    ),
    Q(
        PPO,
        CURVE,
        "(validation {a:.3f} → {b:.3f} above;",
        a=lambda rows: _phase_best(rows, ("imitation", "ppo")),
        b=lambda rows: _phase_best(rows, ("imitation", "ppo", "first node")),
    ),
    Q(
        PPO,
        SPREAD,
        "bench_spread's policy alone 0.958 → {g:.3f})",
        g=_ratio("ces-ppo:greedy", "network-aware"),
    ),
    Q(
        PPO,
        SPREAD,
        "it is more than 10 % slower than network-aware on {n} of the {jobs} jobs; on {na} of them "
        "its own greedy rollout begun on network-aware's first node is within 1.10 of "
        "network-aware, and on {best} the best of those begun on its 64 highest-rated first nodes "
        "is faster than network-aware (worst {w:.2f})",
        n=("all", "tail", "jobs"),
        jobs=_placed_by_all,
        na=("all", "tail", "from_na_first_within"),
        best=("all", "tail", "best_first_below_1"),
        w=("all", "tail", "best_first_worst"),
    ),
    Q(
        PPO,
        SPREAD,
        "The worst job ({w:.2f}) is a star",
        w=_ratio("ces-ppo:greedy", "network-aware", "worst"),
    ),
    Q(
        PPO,
        SPREAD,
        "The decoding meets both ({d:.3f}, {w:.2f})",
        d=_ratio("ces-ppo", "network-aware"),
        w=_ratio("ces-ppo", "network-aware", "worst"),
    ),
    Q(
        PPO,
        BENCH,
        "bench_ppo's small-instance gap to exact stays {m:.3f} (results/ppo/bench.json), its "
        "sequences move by at most 0.01 (Abilene's balance 0.938 → {a:.3f} × k8s-spread's, "
        "campus's 1.179 → {c:.3f})",
        m=("gap_to_exact", "ces-ppo", "mean"),
        a=("comparison", "topozoo/Abilene", "ces_ppo_balance_vs_k8s_spread"),
        c=("comparison", "campus", "ces_ppo_balance_vs_k8s_spread"),
    ),
    Q(
        PPO,
        "results/e2e/contention-ring/summary.md",
        "(results/e2e/contention-ring/summary.md: mean TTA {c} s against {n} for "
        "network-aware/ces, mean ± sd over its faithful runs, time-dilated;",
        c=lambda md: comparison_cell(md, "ces-ppo", 2),
        n=lambda md: comparison_cell(md, "network-aware/ces", 2),
    ),
]


UNSEEN = {  # bench_spread on networks no benchmark had used: file, session 24's figures
    "results/ppo/spread-unseen1.json": (0.792, 0.796, 1.42, 0.861, 1.42),
    "results/ppo/spread-unseen2.json": (0.765, None, None, 0.848, 3.06),
    "results/ppo/spread-unseen3.json": (0.854, None, None, 0.897, 1.36),
}


def _unseen(source: str) -> Quote:
    d0, o0, ow0, g0, gw0 = UNSEEN[source]
    own_then = f" [{o0:.3f} ({ow0:.2f})]" if o0 else ""
    return Q(
        PPO,
        source,
        f"--out {source}` ({{n}} jobs): default {{d:.3f}} [{d0:.3f}] (worst {{dw:.2f}}), its own "
        f"decoding {{o:.3f}} ({{ow:.2f}}){own_then}, the policy alone {{g:.3f}} ({{gw:.2f}}) "
        f"[{g0:.3f} ({gw0:.2f})]",
        n=_placed_by_all,
        d=_ratio("ces-ppo", "network-aware"),
        dw=_ratio("ces-ppo", "network-aware", "worst"),
        o=_ratio("ces-ppo:own", "network-aware"),
        ow=_ratio("ces-ppo:own", "network-aware", "worst"),
        g=_ratio("ces-ppo:greedy", "network-aware"),
        gw=_ratio("ces-ppo:greedy", "network-aware", "worst"),
    )


def _signed(x: float, digits: int = 3) -> str:
    return f"{'+' if x >= 0 else '−'}{abs(x):.{digits}f}"


PPO_QUOTES += [
    *(_unseen(s) for s in UNSEEN),
    Q(
        PPO,
        tuple(UNSEEN),
        "small or none on these generated ones ({a}, {b}, {c})",
        **{
            k: (
                lambda d, s=s: _signed(
                    at(d, s, *_ratio("ces-ppo:greedy", "network-aware")) - UNSEEN[s][3]
                )
            )
            for k, s in zip("abc", UNSEEN)
        },
    ),
]


DRAWS = ("results/ppo/bench-seed1.json", "results/ppo/bench-seed2.json")


def _gap(source: str, what: str, stat: str = "mean") -> Callable[[dict], float]:
    return lambda d: d[source]["gap_to_exact"][what][stat]


PPO_QUOTES.append(
    Q(
        PPO,
        DRAWS,
        "S = 1 and 2: results/ppo/bench-seed{{1,2}}.json): {a:.3f} and {b:.3f} ({wa:.0f} "
        "and {wb:.0f} % within 1.10; the policy alone {ga:.2f} and {gb:.2f})",
        a=_gap(DRAWS[0], "ces-ppo"),
        b=_gap(DRAWS[1], "ces-ppo"),
        wa=lambda d: 100 * _gap(DRAWS[0], "ces-ppo", "within_1.10")(d),
        wb=lambda d: 100 * _gap(DRAWS[1], "ces-ppo", "within_1.10")(d),
        ga=_gap(DRAWS[0], "ces-ppo (decode budget 0)"),
        gb=_gap(DRAWS[1], "ces-ppo (decode budget 0)"),
    )
)


# --- docs/sdn_app.md ---------------------------------------------------------------------------
SDN = "docs/sdn_app.md"
SDN_JSON = "results/bench_sdn.json"


def _span(lo: float, hi: float, digits: int) -> str:
    a, b = f"{lo:.{digits}f}", f"{hi:.{digits}f}"
    return a if a == b else f"{a}–{b}"


def _sdn_table(doc: dict) -> str:
    rows = []
    rates = sorted({r["rate_mbps"] for r in doc["rate_fidelity"]["rows"]})
    for rate in rates:
        by = {r["method"]: r for r in doc["rate_fidelity"]["rows"] if r["rate_mbps"] == rate}
        free = [x for r in by.values() for x in r["unenforced_mbps"]]
        rows.append(
            [
                f"R = {rate:g}",
                *(
                    _span(by[m]["min_ratio"], by[m]["max_ratio"], 2)
                    for m in ("meter", "tc", "both")
                ),
                f"{_span(min(free), max(free), 0)} Mbit/s",
            ]
        )
    f = doc["rate_fidelity"]
    return md_table(
        (
            f"goodput / R (iperf3 TCP, {f['seconds']:g} s × {f['repeats']})",
            "meter",
            "sender tc",
            "both",
            "path without enforcement",
        ),
        rows,
    )


def _il(*keys: str) -> tuple:
    return ("install_latency", *keys)


SDN_TABLES = [Table("sdn-rate-fidelity", SDN, (SDN_JSON,), _sdn_table)]
SDN_QUOTES = [
    Q(
        SDN,
        SDN_JSON,
        "8-task ring job (8 flows + 8 meters, ~30 entries) p50 **{p50:.1f} ms**, p90 {p90:.1f} ms, "
        "max {mx:.1f} ms (target p50 ≤ 100 ms); re-routing the whole ring p50 {rr:.1f} ms; removing "
        "it p50 {rm:.1f} ms. {n} flows ({e} entries + {n} meters) in one request: **{bi:.0f} ms** "
        "(target ≤ 1 s); deleting them {bd:.0f} ms.",
        p50=_il("ring_install_ms", "p50"),
        p90=_il("ring_install_ms", "p90"),
        mx=_il("ring_install_ms", "max"),
        rr=_il("ring_reroute_ms", "p50"),
        rm=_il("ring_delete_ms", "p50"),
        n=_il("bulk_flows"),
        e=_il("bulk_entries"),
        bi=_il("bulk_install_ms"),
        bd=_il("bulk_delete_ms"),
    ),
    Q(
        SDN,
        SDN_JSON,
        "nothing else running: load average {la:.1f}",
        la=("machine", "loadavg_1_5_15", 0),
    ),
]


# --- docs/workloads.md -------------------------------------------------------------------------
WORK = "docs/workloads.md"
CALIB = "results/calibration.json"
TTA = "results/bench_tta.json"


def _secs(x: float) -> str:
    return f"{x:.2f}" if x >= 10 else f"{x:.3f}"


def _ring_checks(doc: dict) -> list[dict]:
    """The check points of the ring fit's models (runs before the collective checks have no
    `collective`: they were all rings)."""
    models = doc["settings"]["models"]
    return [
        c for c in doc["check"] if c.get("collective", "ring") == "ring" and c["model"] in models
    ]


def _calibration_table(doc: dict) -> str:
    checks = {(c["model"], c["mbps"]): c for c in _ring_checks(doc)}
    mbps = doc["settings"]["check_mbps"]
    rows = []
    for model in doc["settings"]["models"]:
        mb = doc["profiles"][model]["gradient_bytes"] / 1e6
        cells = []
        for b in mbps:
            c = checks[(model, b)]
            err = 100 * c["error"]
            sign = "+" if err >= 0 else "−"
            cells.append(
                f"{_secs(c['measured_iter_s'])} / {_secs(c['predicted_iter_s'])} s "
                f"({sign}{abs(err):.1f} %)"
            )
        rows.append([f"{model} ({mb:.2f} MB)", *cells])
    head = [f"{mbps[0]:g} Mbit/s: measured / predicted", *(f"{b:g} Mbit/s" for b in mbps[1:])]
    return md_table(["model (gradient)", *head], rows)


def _collective_checks(doc: dict) -> str:
    """Every collective on every check model and network (best-effort: TCP shares the links;
    enforced: each flow held to its share): measured / predicted iteration, the collective over
    its bandwidth bound, and each flow's bytes against the model's."""
    rows = []
    for c in doc["check"]:
        if c.get("collective", "ring") == "ring" and c["model"] in doc["settings"]["models"]:
            continue  # the ring fit's own checks: the table above
        err = 100 * c["error"]
        sign = "+" if err >= 0 else "−"
        mark = "" if c["within_tolerance"] else " **out**"
        stray = c.get("unmodelled_flows") or []
        nbytes = (
            "–"
            if c.get("measured_flow_bytes") is None
            else f"{100 * c['flow_bytes_error']:.2f} %"
            + (f" + {', '.join(stray)}" if stray else "")
        )
        rows.append(
            [
                c["collective"],
                c.get("network", "best-effort"),
                f"{c['model']}{' (synthetic)' if c.get('synthetic') else ''}",
                f"{c['mbps']:g}",
                f"{_secs(c['measured_iter_s'])} / {_secs(c['predicted_iter_s'])} s "
                f"({sign}{abs(err):.1f} %){mark}",
                f"{c['comm_over_bound']:.2f}",
                nbytes,
            ]
        )
    return md_table(
        [
            "collective",
            "network",
            "model",
            "Mbit/s",
            "iteration: measured / predicted",
            "collective / bandwidth bound",
            "flow bytes: largest gap to the model",
        ],
        rows,
    )


def _tta_cell(c: dict) -> str:
    t = c["tta_s"]
    d = 0 if t["mean"] >= 100 else 1
    return f"{t['mean']:.{d}f} ± {t['std']:.{d}f} s ({t['min']:.{d}f}–{t['max']:.{d}f})"


def _tta_table(doc: dict) -> str:
    s = doc["settings"]
    cells = {(c["model"], c["mbps"]): c for c in doc["cells"]}
    rows = [[m, *(_tta_cell(cells[(m, b)]) for b in s["mbps"])] for m in s["models"]]
    return md_table(["model", *(f"{b:g} Mbit/s" for b in s["mbps"])], rows)


def _startups(doc: dict) -> list[tuple[str, float, float]]:
    return [(c["model"], c["mbps"], c["container_startup_s"]["mean"]) for c in doc["cells"]]


def _largest_error(doc: dict) -> dict:
    return max(_ring_checks(doc), key=lambda c: abs(c["error"]))


WORK_TABLES = [
    Table("workloads-calibration", WORK, (CALIB,), _calibration_table),
    Table("workloads-collectives", WORK, (CALIB,), _collective_checks),
    Table("workloads-tta", WORK, (TTA,), _tta_table),
]
WORK_QUOTES = [
    Q(
        WORK,
        CALIB,
        "fitted efficiency {e:.3f}, per-message latency {l:.2f} ms, stack-bound rate {r:.0f} Mbit/s "
        "per worker. {within} of {n} check points within ±{tol:.0f} % (largest error {err}, {m} at {b:g} "
        "Mbit/s); measured collective time / the bandwidth bound 2(k−1)/k·M/B = {lo:.2f}–{hi:.2f}.",
        e=("fitted_model", "efficiency"),
        l=lambda d: 1000 * d["fitted_model"]["per_message_latency_s"],
        r=("fitted_model", "max_rate_mbps"),
        within=lambda d: sum(c["within_tolerance"] for c in _ring_checks(d)),
        n=lambda d: len(_ring_checks(d)),
        tol=lambda d: 100 * d["settings"]["tolerance"],
        err=lambda d: (
            ("+" if _largest_error(d)["error"] >= 0 else "−")
            + f"{abs(100 * _largest_error(d)['error']):.1f} %"
        ),
        m=lambda d: _largest_error(d)["model"],
        b=lambda d: _largest_error(d)["mbps"],
        lo=lambda d: min(c["comm_over_bound"] for c in _ring_checks(d)),
        hi=lambda d: max(c["comm_over_bound"] for c in _ring_checks(d)),
    ),
    Q(
        WORK,
        TTA,
        "all {n} runs converged; startup = container start → first iteration, {lo:.1f}–{hi:.1f} s "
        "per cell, {top:.1f} s for {m} at {b:g} Mbit/s; {mins:.0f} min in all",
        n=lambda d: same(0, len(d["runs"]), sum(r["reached_target"] for r in d["runs"])),
        lo=lambda d: min(s for *_, s in sorted(_startups(d), key=lambda x: x[2])[:-1]),
        hi=lambda d: max(s for *_, s in sorted(_startups(d), key=lambda x: x[2])[:-1]),
        top=lambda d: max(_startups(d), key=lambda x: x[2])[2],
        m=lambda d: max(_startups(d), key=lambda x: x[2])[0],
        b=lambda d: max(_startups(d), key=lambda x: x[2])[1],
        mins=("elapsed_min",),
    ),
    Q(
        WORK,
        TTA,
        "The spread within a row comes from the seeds ({lo}–{hi} iterations to the target); the "
        "iteration times themselves vary by ≤ {pct:.0f} % between seeds.",
        lo=lambda d: min(c["tta_iter"]["min"] for c in d["cells"]),
        hi=lambda d: max(c["tta_iter"]["max"] for c in d["cells"]),
        pct=lambda d: (
            -(
                -100
                * max(
                    (c["iter_s"]["max"] - c["iter_s"]["min"]) / c["iter_s"]["mean"]
                    for c in d["cells"]
                )
                // 1
            )
        ),
    ),
]


# --- docs/lab.md -------------------------------------------------------------------------------
LAB = "docs/lab.md"
LAB_JSON = "results/bench_lab.json"


def _msd(cell: dict, digits: int = 1) -> str:
    return f"{cell['mean']:.{digits}f} ± {cell['sd']:.{digits}f}"


def _lab_deploy(doc: dict) -> str:
    n = doc["settings"]["nodes"]
    d = doc["deploy"]
    rows = [
        [
            f"deploy, {n} hosts, {what}",
            f"{_msd(d[key]['deploy_s'])} s (agents registered {_msd(d[key]['register_s'])} s)",
        ]
        for key, what in (
            ("cold", "cold (image forced to every host)"),
            ("warm", "warm (nothing copied)"),
        )
    ]
    return md_table(["", ""], rows)


def _lab_tta(doc: dict) -> str:
    rows = [
        [
            f"{r['scheduler']}, {r['job']}",
            _msd(r["hosts"]),
            _msd(r["emulation"]),
            "within spread" if r["within_spread"] else "**beyond the spread**",
        ]
        for r in doc["tta"]
    ]
    seeds = doc["settings"]["seeds"]
    return md_table(
        [
            f"{doc['settings']['scenario']} scenario, TTA s ({seeds} seeds)",
            "hosts",
            "emulation",
            "",
        ],
        rows,
    )


LAB_TABLES = [
    Table("lab-deploy", LAB, (LAB_JSON,), _lab_deploy),
    Table("lab-tta", LAB, (LAB_JSON,), _lab_tta),
]
LAB_QUOTES = [
    Q(
        LAB,
        LAB_JSON,
        "a {mb} MB worker image; `sudo python experiments/bench_lab.py --nodes {n} --seeds {s}`, "
        "{mins:.0f} min",
        mb=("settings", "image_mb"),
        n=("settings", "nodes"),
        s=("settings", "seeds"),
        mins=lambda d: d["wall_s"] / 60,
    ),
]


# --- docs/e2e.md ---------------------------------------------------------------------------------
E2E = "docs/e2e.md"
LOADED = "results/e2e/loaded/summary.json"


def _loaded_paired(measure: str) -> dict[str, tuple]:
    """bench_loaded's draws, the geometric mean of `measure`'s ratios and its paired interval."""
    paired = ("summary", "paired", f"{measure} vs network-aware/ces")
    return {
        "n": ("summary", "ran"),
        "r": ("summary", measure, "geomean"),
        "lo": (*paired, "low"),
        "hi": (*paired, "high"),
    }


def _loaded_table(doc: dict) -> str:
    """bench_loaded's summary per topology (e2e.md, "On networks other tenants have loaded")."""
    from experiments import report
    from experiments.stats import Ratio

    s = doc["summary"]
    rows = [
        [
            t,
            v["draws"],
            v["same_placements"],
            v["tta_wins"],
            f(v["mean_tta"], 3),
            f(v["mean_jct"], 3),
        ]
        for t, v in s["by_topology"].items()
    ]
    rows.append(
        [
            f"all ({s.get('ran', s['draws'])} of {s['draws']} draws: both runs faithful)",
            s.get("ran", s["draws"]),
            s["same_placements"],
            s["mean_tta"]["wins"],
            f"**{s['mean_tta']['geomean']:.3f}**",
            f"**{s['mean_jct']['geomean']:.3f}**",
        ]
    )
    table = md_table(
        (
            "topology",
            "draws",
            "same placements",
            "CES-PPO faster (TTA)",
            "mean TTA, CES-PPO / network-aware (geomean)",
            "mean JCT (geomean)",
        ),
        rows,
    )
    paired = [
        f"- paired by draw, CES-PPO / {name.split(' vs ')[1]}, {name.split(' vs ')[0]}: "
        f"{p['text']} — **{p['verdict']}**"
        f"{report.settle(Ratio(p['ratio'], p['low'], p['high'], p['n']), 0.9, p['verdict'], 'draws')}"
        " (target < 0.9)"
        for name, p in s.get("paired", {}).items()
    ]
    return table + ("\n" + "\n".join(paired) + "\n" if paired else "")


# --- the end-to-end runs: tables made from their results.json as experiments/report.py reads them
def _mean_ci(xs: list[float], digits: int = 1) -> str:
    """'mean ± half-width of its 95 % interval' ('mean' with one value)."""
    from experiments.stats import mean_interval

    if not xs:
        return "–"
    mean, half = mean_interval(xs)
    return f"{mean:.{digits}f}" if half is None else f"{mean:.{digits}f} ± {half:.{digits}f}"


def _e2e_schedulers(res: dict, judged: dict | None = None) -> str:
    """Per scheduler, over its faithful runs: its network, mean TTA over the jobs and each job's
    TTA (unreached at the timeout), mean JCT, and faithful runs of all its runs (as `judged`
    says, when given: `_e2e_every_run`)."""
    from experiments import report

    timeout = res["scenario"]["timeout_s"]
    runs = report.per_run(res, timeout)
    rows_ = report.rows(res)
    jobs = list(dict.fromkeys(r["job"] for r in rows_))
    out = []
    for s in res["schedulers"]:
        mine = [r for r in rows_ if r["scheduler"] == s]
        every = [r for r in (judged or res)["runs"] if r["scheduler"] == s]
        good = sum(report.faithful(r) for r in every)
        nets = ", ".join(sorted({r["network"] for r in mine if r.get("network")})) or "–"
        out.append(
            [
                s,
                nets,
                _mean_ci([x["mean_tta"] for x in runs.get(s, [])]),
                *(
                    _mean_ci([report.tta_censored(r, timeout) for r in mine if r["job"] == j])
                    for j in jobs
                ),
                _mean_ci([x["mean_jct"] for x in runs.get(s, [])]),
                f"{good}/{len(every)}",
            ]
        )
    return md_table(
        ["scheduler", "network", "mean TTA s", *jobs, "mean JCT s", "faithful runs"], out
    )


def _every_run_counted(res: dict) -> dict:
    """The run set with every run counted as faithful: what its runs measured, verdicts aside."""
    return {
        **res,
        "runs": [
            {**r, "fidelity": {**r.get("fidelity", {}), "faithful": True}} for r in res["runs"]
        ],
    }


def _e2e_every_run(res: dict) -> str:
    """`_e2e_schedulers` over every run, faithful or not (the last column still counts the
    faithful ones): for a run set whose runs of some scheduler were all unfaithful, what they
    measured, to be read with their verdicts."""
    return _e2e_schedulers(_every_run_counted(res), judged=res)


def _tta_ratio(res: dict, other: str) -> str:
    """CES-PPO's mean TTA over `other`'s, paired by seed (report.comparisons): "r [low, high]"."""
    from experiments import report

    (r,) = [
        c["tta"]
        for c in report.comparisons(res, res["scenario"]["timeout_s"])
        if c["other"] == other
    ]
    return f"{r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}]"


def _mixed_ratio_quotes(name: str) -> list[Quote]:
    """docs/workloads.md's comparisons of a mixed run set, over its faithful runs and over every
    run."""
    others = {"k": "k8s-spread", "o": "ces-ppo/best-effort", "n": "network-aware/ces"}
    return [
        Q(
            WORK,
            _e2e(name),
            "against k8s-spread {k}, against its own placement on a best-effort network {o}, "
            "against network-aware/ces {n}",
            **{k: (lambda res, o=o: _tta_ratio(res, o)) for k, o in others.items()},
        ),
        Q(
            WORK,
            _e2e(name),
            "Over every run, the unfaithful one included ({s} seeds; not a verdict): {k}, {o} "
            "and {n}.",
            s=lambda res: len({r["seed"] for r in res["runs"] if r["scheduler"] == "ces-ppo"}),
            **{
                k: (lambda res, o=o: _tta_ratio(_every_run_counted(res), o))
                for k, o in others.items()
            },
        ),
    ]


def _e2e_headline(res: dict) -> str:
    """CES-PPO against the others, paired by seed (report.comparisons)."""
    from experiments import report

    rows_ = []
    for c in report.comparisons(res, res["scenario"]["timeout_s"]):
        blind = report.network_blind_best_effort(c["other"])
        rows_.append(
            [
                f"`{c['other']}`" + (" (network-blind, best-effort)" if blind else ""),
                f"< {c['target']:g}",
                c["tta"].text(),
                f"**{c['verdict']}**{report.settle(c['tta'], c['target'], c['verdict'])}",
                c["jct"].text() if c["jct"] else "–",
            ]
        )
    return md_table(
        [
            "CES-PPO against",
            "target",
            "TTA ratio [95 % interval]",
            "verdict",
            "JCT ratio [95 % interval]",
        ],
        rows_,
    )


def _e2e_fidelity(names: tuple[str, ...], *results: dict) -> str:
    """Per run set (results/e2e/NAME): scenario, topology, dilation, faithful runs, re-runs, the
    invariants' medians and extremes, the flows' TCP retransmission timeouts (reported, not
    judged; – for a set made before they were counted), and the host's wall time."""
    out = []
    for name, res in zip(names, results, strict=True):
        runs = res["runs"]
        v = [r["fidelity"] for r in runs]
        waits = [x["switch_wait_share"] for x in v if x.get("switch_wait_share") is not None]
        sat = [x["host_saturated_share"] for x in v if x.get("host_saturated_share") is not None]
        band = sum(x["binding_in_band"] for x in v), sum(x["binding_flows"] for x in v)
        rto = [x for x in v if x.get("tcp_timeouts") is not None]
        out.append(
            [
                f"{name} ({len(res['schedulers'])} schedulers)",
                res["topology"],
                f"{res['dilation']['factor']:g} ({res['dilation']['chosen']})",
                f"{sum(x['faithful'] for x in v)}/{len(v)}",
                sum(r.get("attempt", 1) > 1 for r in runs),
                f"{100 * statistics.median(waits):.1f} % (max {100 * max(waits):.1f})"
                if waits
                else "–",
                f"{100 * max(sat):.0f} %" if sat else "–",
                f"{band[0]}/{band[1]}",
                f"{sum(x['tcp_timeouts'] for x in rto)} in {sum(x['tcp_timeouts'] > 0 for x in rto)}"
                f"/{len(rto)} runs"
                if rto
                else "–",
                f"{res['wall_s'] / 60:.1f}",
            ]
        )
    return md_table(
        [
            "run set",
            "topology",
            "K",
            "faithful",
            "re-runs",
            "switch wait: median",
            "saturated s: max",
            "binding flows in band",
            "TCP timeouts",
            "wall min",
        ],
        out,
    )


def _e2e_invariance(at_k: dict, at_2k: dict) -> str:
    """Each job's TTA at K and at 2K, per scheduler both ran, mean ± 95 % interval over faithful
    runs, and whether each mean lies in the other's interval (none with a single run)."""
    from experiments import report
    from experiments.stats import mean_interval

    def inside(x: float, xs: list[float]) -> str:
        mean, half = mean_interval(xs)
        return "–" if half is None else ("yes" if abs(x - mean) <= half else "**no**")

    a, b = report.job_ttas(at_k), report.job_ttas(at_2k)
    k, k2 = at_k["dilation"]["factor"], at_2k["dilation"]["factor"]
    out = []
    for key in sorted(set(a) & set(b), key=lambda x: (at_2k["schedulers"].index(x[0]), x[1])):
        out.append(
            [
                key[0],
                key[1],
                f"{_mean_ci(a[key], 2)} ({len(a[key])})",
                f"{_mean_ci(b[key], 2)} ({len(b[key])})",
                inside(statistics.fmean(b[key]), a[key]),
                inside(statistics.fmean(a[key]), b[key]),
            ]
        )
    return md_table(
        [
            "scheduler",
            "job",
            f"TTA s at K = {k:g} (runs)",
            f"TTA s at K = {k2:g} (runs)",
            f"K = {k2:g}'s mean in K = {k:g}'s interval",
            f"K = {k:g}'s mean in K = {k2:g}'s interval",
        ],
        out,
    )


def _e2e(name: str) -> str:
    return f"results/e2e/{name}/results.json"


def _e2e_run_tables(name: str) -> list[Table]:
    """A run set's per-scheduler table and CES-PPO's comparisons (results/e2e/NAME)."""
    return [
        Table(f"e2e-{name}", E2E, (_e2e(name),), _e2e_schedulers),
        Table(f"e2e-{name}-headline", E2E, (_e2e(name),), _e2e_headline),
    ]


# the run sets docs/e2e.md shows, all made with --dilation auto but the invariance check's 2K
E2E_CONTENTION = (
    "default-campus",
    "contention-campus",
    "contention-ring",
    "contention-fattree",
    "contention-star",
)
E2E_SETS = (
    *E2E_CONTENTION,
    "default-campus-2k",
    "contention-campus-2k",
    "quick-campus",
    "reroute-campus",
    "mixed-campus",
    "mixed-ring",
)


def _same_placements(res: dict, a: str, b: str) -> tuple[int, int]:
    """(seeds in which schedulers `a` and `b` placed every job on the same nodes, seeds both ran
    faithfully): a placement is the multiset of its tasks' nodes."""
    from experiments import report

    def placements(s: str) -> dict[int, dict]:
        return {
            r["seed"]: {j["job"]: sorted(j["placement"].values()) for j in r["jobs"]}
            for r in res["runs"]
            if r["scheduler"] == s and report.faithful(r)
        }

    pa, pb = placements(a), placements(b)
    both = set(pa) & set(pb)
    return sum(pa[s] == pb[s] for s in both), len(both)


def _placed_alike(name: str, text: str) -> Quote:
    """A quote of run set NAME's seeds in which CES-PPO and network-aware/ces placed every job
    alike (`{same}`) of those both ran faithfully (`{n}`)."""
    return Q(
        E2E,
        _e2e(name),
        text,
        same=lambda d: _same_placements(d, "ces-ppo", "network-aware/ces")[0],
        n=lambda d: _same_placements(d, "ces-ppo", "network-aware/ces")[1],
    )


def _job_tta(scheduler: str, seed: int, job: str) -> Callable[[dict], float]:
    from experiments import report

    return lambda res: next(
        j["tta_s"]
        for r in res["runs"]
        if r["scheduler"] == scheduler and r["seed"] == seed and report.faithful(r)
        for j in r["jobs"]
        if j["job"] == job
    )


def _reaction(stat: Callable[[list[float]], float]) -> Callable[[dict], float]:
    from experiments import report

    return lambda res: stat(report.reaction_times(res)["ces-ppo"])


def _light_tta(scheduler: str) -> Callable[[dict], float]:
    from experiments import report

    return lambda res: statistics.fmean(
        report.tta_censored(r, res["scenario"]["timeout_s"])
        for r in report.rows(res)
        if r["scheduler"] == scheduler and r["job"] == "light"
    )


E2E_QUOTES = [
    _placed_alike(
        "contention-campus",
        "The two take the same placements in {same} of {n} seeds on campus",
    ),
    Q(
        E2E,
        _e2e("contention-campus"),
        "it trained in {s2:.1f} s against {s0:.1f} and {s1:.1f} s on the other seeds' nodes",
        s2=_job_tta("k8s-spread/ces", 2, "light"),
        s0=_job_tta("k8s-spread/ces", 0, "light"),
        s1=_job_tta("k8s-spread/ces", 1, "light"),
    ),
    Q(
        E2E,
        _e2e("reroute-campus"),
        "moved a job off the tenant's link {mean:.1f} s after the tenant started (the most "
        "{most:.1f} s, over the {n} faithful runs), and `light` trained in {on:.1f} s against "
        "{off:.1f} s with its paths kept",
        mean=_reaction(statistics.fmean),
        most=_reaction(max),
        n=_reaction(len),
        on=_light_tta("ces-ppo"),
        off=_light_tta("ces-ppo/static"),
    ),
    _placed_alike(
        "contention-ring",
        "CES-PPO and network-aware with CES's network take the same placements in {same} of {n} "
        "seeds both ran faithfully",
    ),
    _placed_alike(
        "contention-fattree",
        "CES-PPO and network-aware with CES's network take the same placements in {same} of {n} "
        "seeds on the fat-tree",
    ),
    Q(
        E2E,
        _e2e("contention-fattree"),
        "took {wall:.1f} min at K = {k:g} (auto)",
        wall=lambda d: d["wall_s"] / 60,
        k=("dilation", "factor"),
    ),
    Q(
        E2E,
        _e2e("contention-star"),
        "It took {wall:.1f} min at K = {k:g} (auto) for {runs} runs, {reruns} of them re-runs",
        wall=lambda d: d["wall_s"] / 60,
        k=("dilation", "factor"),
        runs=lambda d: len(d["runs"]),
        reruns=lambda d: sum(r["attempt"] > 1 for r in d["runs"]),
    ),
    Q(
        E2E,
        _e2e("default-campus"),
        "`make run`, set-up done, took {wall:.1f} min at the dilation the budget chose (K = {k:g}) "
        "for its {runs} runs",
        wall=lambda d: d["wall_s"] / 60,
        k=("dilation", "factor"),
        runs=lambda d: len(d["runs"]),
    ),
    _placed_alike(
        "default-campus",
        "here the two take the same placements in {same} of {n} seeds",
    ),
    Q(E2E, LOADED, "All {n} draws have a faithful run of both", n=("summary", "ran")),
    Q(
        E2E,
        LOADED,
        "Over the {n} draws CES-PPO's mean TTA is {r:.2f} of network-aware/ces's, and faster in {w} "
        "of them. Paired by draw, the 95 % interval is [{lo:.2f}, {hi:.2f}]",
        w=("summary", "mean_tta", "wins"),
        **_loaded_paired("mean_tta"),
    ),
    Q(
        PPO,
        LOADED,
        "CES-PPO's mean TTA over {n} draws, every one with both runs faithful, is {r:.2f} "
        "[{lo:.2f}, {hi:.2f}] of network-aware's placement with CES's network",
        **_loaded_paired("mean_tta"),
    ),
    Q(
        E2E,
        LOADED,
        "Mean JCT over the {n} draws is {r:.2f} [{lo:.2f}, {hi:.2f}]",
        **_loaded_paired("mean_jct"),
    ),
]


HEADROOM_JSON = "results/bench_headroom.json"


def _headroom_table(doc: dict) -> str:
    """Per load and case: the lowest and the median wire/grant over flows and repeats, and the
    drops of the links' shaping."""
    cases = ("one", "both", "merge")
    cells: dict[tuple[float, str], list[float]] = {}
    drops: dict[tuple[float, str], int] = {}
    for r in doc["rows"]:
        key = (r["load"], r["case"])
        cells.setdefault(key, []).extend(f["wire_ratio"] for f in r["flows"])
        drops[key] = drops.get(key, 0) + r["switch_drops"]
    rows = [
        [f"{load:.2f}"]
        + [
            f"{min(cells[load, c]):.3f} / {statistics.median(cells[load, c]):.3f} "
            f"({drops[load, c]})"
            for c in cases
        ]
        for load in sorted({load for load, _ in cells})
    ]
    return md_table(["grants / link", "one way", "both ways", "two senders into one link"], rows)


E2E_TABLES = [
    *(t for name in E2E_CONTENTION for t in _e2e_run_tables(name)),
    Table("bench-headroom", E2E, (HEADROOM_JSON,), _headroom_table),
    Table("e2e-reroute-campus", E2E, (_e2e("reroute-campus"),), _e2e_schedulers),
    Table(
        "e2e-invariance",
        E2E,
        (_e2e("default-campus"), _e2e("default-campus-2k")),
        _e2e_invariance,
    ),
    Table(
        "e2e-fidelity",
        E2E,
        tuple(_e2e(n) for n in E2E_SETS),
        lambda *results: _e2e_fidelity(E2E_SETS, *results),
    ),
    Table("e2e-loaded", E2E, (LOADED,), _loaded_table),
    # the mixed scenario (issue 49) is shown in docs/workloads.md
    Table("workloads-mixed-campus", WORK, (_e2e("mixed-campus"),), _e2e_every_run),
    Table("workloads-mixed-ring", WORK, (_e2e("mixed-ring"),), _e2e_every_run),
]

WORK_QUOTES += _mixed_ratio_quotes("mixed-campus")


# --- docs/cluster.md ---------------------------------------------------------------------------
CLUSTER = "docs/cluster.md"
CROSSING = "results/cluster/crossing.json"
TUNNEL = "results/cluster/tunnel.json"
CLUSTER_QUICK = "results/cluster/quick/compare.json"
CLUSTER_CONTENTION = "results/cluster/contention/compare.json"
BRINGUP = "results/cluster/bringup.json"


def _crossing_table(doc: dict) -> str:
    """Capacity crossing hosts under each placement rule (Mbit/s, share, heaviest host/mean)."""
    rows = []
    for name, t in doc["topologies"].items():
        for n in doc["hosts"]:
            cells = []
            for rule in ("block", "round-robin", "metis", "explicit"):
                c = t[f"{n} hosts"].get(rule)
                cells.append(
                    "—"
                    if c is None
                    else f"{c['crossing_mbps']:.0f} ({c['crossing_share']:.0%}), "
                    f"×{c['cpu_imbalance']:.2f}"
                )
            rows.append([f"{name} ({t['switches']}, {t['nodes']})", n, *cells])
    header = ["topology (switches, nodes)", "hosts", "block", "round-robin", "metis"]
    return md_table([*header, "explicit (by zone)"], rows)


def _tunnel_table(doc: dict) -> str:
    """A tunnel link's wire/grant against the same link on one host."""
    one = {r["grant_mbps"]: r for r in doc["one_host"]}
    rows = []
    for r in doc["tunnel_link"]:
        o = one.get(r["grant_mbps"])
        ceiling = r["wire_over_grant"] < 0.5  # the link unshaped: what the datapaths carry
        grant = (
            f"unshaped ({r['grant_mbps']:,.0f})".replace(",", " ")
            if ceiling
            else (f"{r['grant_mbps']:g}")
        )
        tunnel = (
            f"{r['mbps']:.1f} ({r['retransmits']} retransmits): the ceiling"
            if ceiling
            else f"{r['mbps']:.1f} ({r['wire_over_grant']:.3f}, {r['retransmits']})"
        )
        here = (
            "—"
            if o is None
            else (
                f"{o['mbps']:.1f}" if ceiling else f"{o['mbps']:.1f} ({o['wire_over_grant']:.3f})"
            )
        )
        rows.append([grant, tunnel, here])
    table = md_table(
        [
            "grant (Mbit/s)",
            f"{doc['tunnel'].upper()} tunnel between hosts: received (wire/grant, retransmits)",
            "one host: received (wire/grant)",
        ],
        rows,
    )
    mtu = same(0, *(r["inner_mtu"] for r in doc["tunnel_link"]))
    return table + (
        f"\n({doc['seconds']:g} s per transfer after 1 s omitted, inner MTU {mtu}, "
        f"{doc['started']}.)\n"
    )


def _cluster_compare(doc: dict) -> str:
    """Each job's TTA on one host and over 2 and 3 hosts (`bench_cluster.py scenario`)."""
    rows = []
    for label, c in doc["clusters"].items():
        for j in c["jobs"]:
            rows.append(
                [
                    label.replace("-", " "),
                    j["scheduler"],
                    j["job"],
                    _cluster_tta(j["one_host"]),
                    _cluster_tta(j["cluster"]),
                    _inside_cell(j["cluster_mean_in_one_host_interval"]),
                    _inside_cell(j["one_host_mean_in_cluster_interval"]),
                ]
            )
    return md_table(
        [
            "over",
            "scheduler",
            "job",
            "one host: TTA s (runs)",
            "over the hosts: TTA s (runs)",
            "its mean in one host's interval",
            "one host's mean in its interval",
        ],
        rows,
    )


def _cluster_tta(x: dict) -> str:
    half = "–" if x["half_s"] is None else f"{x['half_s']:.2f}"
    return f"{x['mean_s']:.2f} ± {half} ({x['runs']})"


def _inside_cell(x: bool | None) -> str:
    return "–" if x is None else ("yes" if x else "**no**")


def _bringup_table(doc: dict) -> str:
    """Bring-up and teardown seconds per host count (every repeat)."""
    by: dict[int, list[dict]] = {}
    for r in doc["runs"]:
        by.setdefault(r["hosts"], []).append(r)
    rows = [
        [
            n,
            len(rs),
            ", ".join(f"{r['up_s']:.1f}" for r in rs),
            ", ".join(f"{r['built_s']:.1f}" for r in rs),
            ", ".join(f"{r['down_s']:.1f}" for r in rs),
        ]
        for n, rs in sorted(by.items())
    ]
    return md_table(
        [
            "stand-in hosts",
            "repeats",
            "up s (every switch at the SDN app, pings pass)",
            "of which built s",
            "teardown s",
        ],
        rows,
    )


CLUSTER_TABLES = [
    Table("cluster-crossing", CLUSTER, (CROSSING,), _crossing_table),
    Table("cluster-tunnel", CLUSTER, (TUNNEL,), _tunnel_table),
    Table("cluster-quick", CLUSTER, (CLUSTER_QUICK,), _cluster_compare),
    Table("cluster-contention", CLUSTER, (CLUSTER_CONTENTION,), _cluster_compare),
    Table("cluster-bringup", CLUSTER, (BRINGUP,), _bringup_table),
]


# --- everything --------------------------------------------------------------------------------
TABLES: list[Table] = [
    *EADE_TABLES,
    *MULTI_TABLES,
    *SEEDS_TABLES,
    *PPO_TABLES,
    *SDN_TABLES,
    *WORK_TABLES,
    *LAB_TABLES,
    *E2E_TABLES,
    *CLUSTER_TABLES,
]
QUOTES: list[Quote] = [
    *EADE_QUOTES,
    *MULTI_QUOTES,
    *SEEDS_QUOTES,
    *PPO_QUOTES,
    *SDN_QUOTES,
    *WORK_QUOTES,
    *LAB_QUOTES,
    *E2E_QUOTES,
]
