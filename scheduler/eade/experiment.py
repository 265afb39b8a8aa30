"""The paper's experiment (§4.3): every algorithm on the same layouts and task streams.

Per seed s (0..seeds-1): the layout from the machine table with default_rng(s); each RL
algorithm trained on task streams SB3 draws with seed s (EADE-DDPG's expert buffer on streams of
its own); then every algorithm deployed deterministically on `eval_episodes` held-out task
streams (default_rng((s, 1, i))) — the same streams for all nine — and the paper's metrics
averaged over them. The figures are mean ± population std over seeds (`evaluate.mean_std`).
Learning curves: every `curve_every` training episodes, the deterministic policy on
`curve_streams` validation streams (default_rng((s, 2, i))). Training time is wall and CPU
seconds of the training process (expert buffer included, learning-curve validation left out), on
the machine `machine_info` records.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from ..evaluate import machine_info, mean_std
from .agents import (
    ALGORITHMS,
    AgentConfig,
    acting_state,
    build,
    fill_expert,
    load_acting,
    save_acting,
)
from .env import Layout, MultiClusterEnv, Setting
from .heuristics import HEURISTICS, expert, run_episode

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "scheduler" / "checkpoints" / "eade"
RESULTS = ROOT / "results" / "eade"
METRICS = ("N", "F", "load_var", "gpu_load_var")
ALL = ALGORITHMS + tuple(HEURISTICS)
REFERENCE = "Expert"  # the expert scorer, reported beside the nine (it knows the member clusters)
# Tables 7, 8 and 9 of the paper (Table 9 is the cross-cluster *GPU* load variance).
PAPER = {
    "EADE-DDPG": (209, 1.9853, 0.0020),
    "SAC": (195, 2.0907, 0.0050),
    "PPO": (193, 2.2064, 0.0030),
    "TD3": (191, 2.1263, 0.0038),
    "Utilization": (188, 2.1457, 0.0096),
    "DDPG": (185, 2.1466, 0.0179),
    "Random": (184, 2.2553, 0.0111),
    "BestFit": (183, 2.1640, 0.0067),
    "Greedy": (182, 2.3220, 0.0129),
}


@dataclass
class ExperimentConfig:
    seeds: int = 5  # seeds 0..N-1
    episodes: int = 100  # training episodes (the paper's 1000 scaled down: docs/eade.md)
    eval_episodes: int = 10  # held-out task streams per seed
    curve_every: int = 10  # training episodes between learning-curve points
    curve_streams: int = 3  # validation task streams of a learning-curve point
    algorithms: tuple[str, ...] = ALL


Chooser = Callable[[MultiClusterEnv], int]


def streams(setting: Setting, seed: int, kind: int, n: int) -> list[np.ndarray]:
    """n task streams of a seed: kind 1 evaluation, kind 2 learning-curve validation."""
    return [
        setting.shapes.sample(
            np.random.default_rng((seed, kind, i)), setting.tasks, setting.card_mem_gb
        )
        for i in range(n)
    ]


def agent_chooser(model) -> Chooser:
    """The deterministic policy as a discrete choice."""
    return lambda env: env.action_index(model.predict(env.observe(), deterministic=True)[0])


def heuristic_chooser(name: str, seed: int) -> Chooser:
    rng = np.random.default_rng(seed)
    rule = expert if name == REFERENCE else HEURISTICS[name]
    return lambda env: rule(env, rng)


def evaluate(
    choose: Chooser, layout: Layout, setting: Setting, tasks: list[np.ndarray]
) -> dict[str, float]:
    """The paper's metrics (and Table 6's utilisations), averaged over the task streams."""
    env = MultiClusterEnv(layout, setting)
    runs = [run_episode(env, choose, t) for t in tasks]
    return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}


class Curve(BaseCallback):
    """Per training episode: its return and N; every `every` episodes the deterministic
    policy's metrics on the validation streams, keeping the acting weights of the best one so far
    (highest N, then lowest F); `tick(episodes done)` after each episode."""

    def __init__(
        self,
        layout: Layout,
        setting: Setting,
        validation: list[np.ndarray],
        every: int,
        tick: Callable[[int], None],
    ):
        super().__init__()
        self.layout, self.setting, self.validation, self.every = layout, setting, validation, every
        self.tick = tick
        self.rows: list[dict] = []
        self.episode, self.ret = 0, 0.0
        self.spent = [0.0, 0.0]  # wall and CPU seconds of the validation (not training)
        self.best: tuple[tuple[float, float], int, dict] | None = None  # key, episode, weights

    def _on_step(self) -> bool:
        self.ret += float(self.locals["rewards"][0])
        info = self.locals["infos"][0]
        if "metrics" in info:
            self.episode += 1
            row = {"episode": self.episode, "return": self.ret, "train_N": info["metrics"]["N"]}
            if self.every and self.episode % self.every == 0:
                wall, cpu = time.perf_counter(), time.process_time()
                m = evaluate(agent_chooser(self.model), self.layout, self.setting, self.validation)
                row |= {f"val_{k}": m[k] for k in METRICS}
                key = (m["N"], -m["F"])
                if self.best is None or key > self.best[0]:
                    self.best = (
                        key,
                        self.episode,
                        {k: v.clone() for k, v in acting_state(self.model).items()},
                    )
                self.spent[0] += time.perf_counter() - wall
                self.spent[1] += time.process_time() - cpu
            self.rows.append(row)
            self.ret = 0.0
            self.tick(self.episode)
        return True


def train(
    name: str,
    layout: Layout,
    setting: Setting,
    cfg: AgentConfig,
    seed: int,
    episodes: int,
    curve_every: int = 10,
    curve_streams: int = 3,
    tick: Callable[[int], None] = lambda e: None,
):
    """Train one RL algorithm; (model with the best validated weights — the paper reports best
    scores too —, record with wall/cpu seconds, the learning curve and the episode the weights
    come from)."""
    wall, cpu = time.perf_counter(), time.process_time()
    env = MultiClusterEnv(layout, setting)
    model = build(name, env, cfg, seed)
    if name == "EADE-DDPG":
        fill_expert(model.replay_buffer, layout, setting, cfg.expert_episodes, seed=seed + 10_000)
    curve = Curve(layout, setting, streams(setting, seed, 2, curve_streams), curve_every, tick)
    model.learn(episodes * setting.tasks, callback=curve)
    record = {
        "wall_s": time.perf_counter() - wall - curve.spent[0],
        "cpu_s": time.process_time() - cpu - curve.spent[1],
        "episodes": episodes,
        "curve": curve.rows,
        "kept_episode": episodes,
    }
    if curve.best is not None:
        _, record["kept_episode"], weights = curve.best
        model.policy.load_state_dict(weights, strict=False)
    return model, record


def checkpoint_path(directory: Path, name: str, seed: int) -> Path:
    return Path(directory) / f"{name.lower()}_seed{seed}.pt"


def train_all(
    cfg: ExperimentConfig,
    agent: AgentConfig,
    layouts: Callable[[int], Layout],
    setting: Setting,
    checkpoints: Path,
    progress: Callable[[str, float], None] = lambda what, units: None,
) -> dict:
    """Train every RL algorithm of `cfg` on every seed and save its checkpoint (the acting
    weights, the training time and the learning curve); {algorithm: [curve per seed]}.
    `progress(what, units)`: a unit is one episode."""
    curves: dict[str, list[list[dict]]] = {}
    for seed in range(cfg.seeds):
        layout = layouts(seed)
        for name in (a for a in cfg.algorithms if a in ALGORITHMS):
            what = f"seed {seed} · {name} · training"
            model, record = train(
                name,
                layout,
                setting,
                agent,
                seed,
                cfg.episodes,
                cfg.curve_every,
                cfg.curve_streams,
                lambda e, w=what: progress(w, 1),
            )
            path = checkpoint_path(checkpoints, name, seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_acting(
                model,
                name,
                agent,
                path,
                {
                    "seed": seed,
                    "episodes": cfg.episodes,
                    "kept_episode": record["kept_episode"],
                    "wall_s": record["wall_s"],
                    "cpu_s": record["cpu_s"],
                    "machine": machine_info(),
                    "machines": list(layout.machines),
                },
            )
            curves.setdefault(name, []).append(record["curve"])
    return curves


def evaluate_all(
    cfg: ExperimentConfig,
    layouts: Callable[[int], Layout],
    setting: Setting,
    checkpoints: Path,
    progress: Callable[[str, float], None] = lambda what, units: None,
) -> dict:
    """Every algorithm of `cfg` (RL ones from their checkpoints) and the expert on every seed's
    held-out streams; the results document (training times from the checkpoints)."""
    per_seed: dict[str, list[dict]] = {name: [] for name in cfg.algorithms + (REFERENCE,)}
    training: dict[str, list[dict]] = {}
    for seed in range(cfg.seeds):
        layout = layouts(seed)
        tasks = streams(setting, seed, 1, cfg.eval_episodes)
        for name in cfg.algorithms + (REFERENCE,):
            if name in ALGORITHMS:
                _, model, meta = load_acting(
                    checkpoint_path(checkpoints, name, seed), MultiClusterEnv(layout, setting)
                )
                training.setdefault(name, []).append(meta)
                choose = agent_chooser(model)
            else:
                choose = heuristic_chooser(name, seed)
            per_seed[name].append(evaluate(choose, layout, setting, tasks))
            progress(f"seed {seed} · {name} · evaluation", cfg.eval_episodes)
    keys = list(per_seed[REFERENCE][0])
    return {
        "algorithms": {
            name: {k: mean_std([r[k] for r in rows]) for k in keys}
            for name, rows in per_seed.items()
        },
        "per_seed": per_seed,
        "paper": {name: dict(zip(("N", "F", "gpu_load_var"), v)) for name, v in PAPER.items()},
        "training": {
            name: {
                "wall_s": mean_std([m["wall_s"] for m in ms]),
                "cpu_s": mean_std([m["cpu_s"] for m in ms]),
                "kept_episode": [m["kept_episode"] for m in ms],
                "episodes": ms[0]["episodes"],
                "machine": ms[0]["machine"],
            }
            for name, ms in training.items()
        },
        "experiment": asdict(cfg),
        "setting": setting.as_dict(),
        "machine": machine_info(),
    }


# --- reporting ------------------------------------------------------------------------------------
def _cell(m: dict | None, digits: int) -> str:
    if not m or m["mean"] is None:
        return "—"
    return f"{m['mean']:.{digits}f} ± {m['std']:.{digits}f}"


def table(doc: dict) -> str:
    """Markdown: N, F, σ², GPU σ² (mean ± sd over seeds) beside the paper's Tables 7–9, and the
    training time per algorithm."""
    e = doc["experiment"]
    episodes = sorted({t["episodes"] for t in doc["training"].values()})
    lines = [
        f"{e['seeds']} seeds × {e['eval_episodes']} held-out task streams, "
        f"{'/'.join(map(str, episodes)) or 'no'} training episodes; mean ± sd over seeds. "
        "Paper: Tables 7–9 (its σ² column is the GPU load variance). Expert: the expert "
        "scorer that fills EADE-DDPG's buffer (it asks the member clusters).",
        "",
        "| algorithm | N | paper N | F | paper F | σ² (Ū) | GPU σ² | paper GPU σ² | "
        "train wall s | train CPU s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in doc["algorithms"].items():
        paper = doc["paper"].get(name, {})
        t = doc["training"].get(name)
        lines.append(
            f"| {name} | {_cell(m['N'], 1)} | {paper.get('N', '—')} | {_cell(m['F'], 4)} | "
            f"{paper.get('F', '—')} | {_cell(m['load_var'], 4)} | {_cell(m['gpu_load_var'], 4)} | "
            f"{paper.get('gpu_load_var', '—')} | "
            f"{_cell(t['wall_s'], 0) if t else '—'} | {_cell(t['cpu_s'], 0) if t else '—'} |"
        )
    return "\n".join(lines) + "\n"


def write(doc: dict, out: Path) -> None:
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "results.md").write_text(table(doc))


def write_curves(curves: dict[str, list[list[dict]]], out: Path) -> None:
    """curves.csv (algorithm, seed, episode, ...) and curves.png (`plot_curves`)."""
    cols = ["algorithm", "seed", "episode", "return", "train_N"] + [f"val_{k}" for k in METRICS]
    with (out / "curves.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for name, per_seed in curves.items():
            for seed, rows in enumerate(per_seed):
                for r in rows:
                    w.writerow({"algorithm": name, "seed": seed, **r})
    plot_curves(curves, out / "curves.png")


def read_curves(path: Path) -> dict[str, list[list[dict]]]:
    """curves.csv back into `write_curves`' argument (numbers as floats, empty cells left out)."""
    curves: dict[str, list[list[dict]]] = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            per_seed = curves.setdefault(row.pop("algorithm"), [])
            seed = int(row.pop("seed"))
            while len(per_seed) <= seed:
                per_seed.append([])
            per_seed[seed].append({k: float(v) for k, v in row.items() if v != ""})
    return curves


def plot_curves(curves: dict[str, list[list[dict]]], path: Path) -> None:
    """Validation N and training return per algorithm, mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for name, per_seed in curves.items():
        points = [r for r in per_seed[0] if "val_N" in r]
        x = [r["episode"] for r in points]
        val = np.mean([[r["val_N"] for r in rows if "val_N" in r] for rows in per_seed], axis=0)
        axes[0].plot(x, val, label=name)
        ret = np.mean([[r["return"] for r in rows] for rows in per_seed], axis=0)
        k = max(1, len(ret) // 30)
        axes[1].plot(
            np.arange(1, len(ret) + 1)[k - 1 :],
            np.convolve(ret, np.ones(k) / k, mode="valid"),
            label=name,
        )
    axes[0].set(xlabel="training episode", ylabel="N (deterministic, validation streams)")
    axes[1].set(xlabel="training episode", ylabel="episode return (training, smoothed)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"learning curves, mean over {len(next(iter(curves.values())))} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
