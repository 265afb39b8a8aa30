"""The paper's experiment (§4.3): every algorithm on the same layouts and task streams.

Per seed s (0..seeds-1): the layout from the machine table with default_rng(s); each RL
algorithm trained on task streams SB3 draws with seed s (EADE-DDPG's expert buffer on streams of
its own); then every algorithm deployed deterministically on `eval_episodes` held-out task
streams (default_rng((s, 1, i))) — the same streams for all — and the paper's metrics averaged
over them. The figures are mean ± population std over seeds (`evaluate.mean_std`).
Fixed-stream mode (`fixed_stream`, the paper's "consistent" stream): one 220-task stream per
seed (default_rng((s, 3, 0))) is trained on, validated on and evaluated on; the held-out
streams are still deployed, as the check of generalisation ("held_out" in the results).
Learning curves: every `curve_every` training episodes, the deterministic policy on
`curve_streams` validation streams (default_rng((s, 2, i))), or on the fixed stream. Training
time is wall and CPU seconds of the training process (expert buffer included, learning-curve
validation left out), on the machine `machine_info` records.

Trainings are resumable: every `checkpoint_every` episodes, and when a run's time is up, the
model, its replay buffer and the curve go to a state folder; `resume` goes on from there (a
resumed training draws its next streams from (seed, episodes done), so it is reproducible for a
given split into runs, not bit-for-bit the uninterrupted one). The checkpoint then holds the
best weights so far, with the episodes done and planned.
"""

from __future__ import annotations

import csv
import functools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch as th
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.utils import set_random_seed

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
from .env import SETTINGS, Layout, MultiClusterEnv, Setting
from .heuristics import EXPERTS, HEURISTICS, run_episode

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "scheduler" / "checkpoints" / "eade"
RESULTS = ROOT / "results" / "eade"
STATES = ROOT / "results" / "runs" / "eade"  # training states (not committed)
METRICS = ("N", "F", "load_var", "gpu_load_var")
ALL = ALGORITHMS + tuple(HEURISTICS)
# The experts, reported beside the algorithms: "Expert" asks the member clusters (the policy that
# greedily maximises the reward), "Expert-aggregate" judges by the remaining resources (§3.2).
REFERENCES = {"Expert": "member", "Expert-aggregate": "aggregate"}
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
    setting: Literal["ours", "faithful"] = "ours"  # env.SETTINGS: ours, or closer to the paper's
    fixed_stream: bool = False  # train and evaluate on one stream per seed (the paper's mode)
    checkpoint_every: int = 50  # training episodes between saves of the training state

    @property
    def variant(self) -> str:
        """The sub-folder of results and checkpoints ('' for ours on fresh streams)."""
        name = "" if self.setting == "ours" else self.setting
        if self.fixed_stream:
            return name or "fixed"
        return name and f"{name}-streams"

    def make_setting(self) -> Setting:
        return SETTINGS[self.setting]


Chooser = Callable[[MultiClusterEnv], int]


def streams(setting: Setting, seed: int, kind: int, n: int) -> list[np.ndarray]:
    """n task streams of a seed: kind 1 evaluation, kind 2 learning-curve validation, kind 3 the
    fixed stream."""
    return [
        setting.shapes.sample(
            np.random.default_rng((seed, kind, i)), setting.tasks, setting.card_mem_gb
        )
        for i in range(n)
    ]


def fixed_stream(setting: Setting, seed: int) -> np.ndarray:
    return streams(setting, seed, 3, 1)[0]


def agent_chooser(model) -> Chooser:
    """The deterministic policy as a discrete choice."""
    return lambda env: env.action_index(model.predict(env.observe(), deterministic=True)[0])


def heuristic_chooser(name: str, seed: int) -> Chooser:
    rng = np.random.default_rng(seed)
    rule = EXPERTS[REFERENCES[name]] if name in REFERENCES else HEURISTICS[name]
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
    (highest N, then lowest F); `tick(episodes done)` after each episode. `pause(episodes done)`
    is asked at each episode's end: True saves the training state (`save`) at the next step,
    when the episode's last transition is in the buffer, and False there stops the training."""

    def __init__(
        self,
        layout: Layout,
        setting: Setting,
        validation: list[np.ndarray],
        every: int,
        tick: Callable[[int], None],
        pause: Callable[[int], str] = lambda episode: "",
        save: Callable[[], None] = lambda: None,
    ):
        super().__init__()
        self.layout, self.setting, self.validation, self.every = layout, setting, validation, every
        self.tick, self.pause, self.save = tick, pause, save
        self.rows: list[dict] = []
        self.episode, self.ret = 0, 0.0
        self.spent = [0.0, 0.0]  # wall and CPU seconds of the validation (not training)
        self.best: tuple[tuple[float, float], int, dict] | None = None  # key, episode, weights
        self.todo = ""  # "save" or "stop", at the next step
        self.stopped = False

    def state(self) -> dict:
        return {k: getattr(self, k) for k in ("rows", "episode", "spent", "best")}

    def restore(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    def _on_step(self) -> bool:
        if self.todo:  # the previous episode's last transition is stored now
            todo, self.todo = self.todo, ""
            self.save()
            if todo == "stop":
                self.stopped = True
                return False
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
                if self.best is None or key > tuple(self.best[0]):
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
            self.todo = self.pause(self.episode)
        return True


@dataclass
class Run:
    """How one call trains: where the state goes (None: nowhere), whether to go on from it, and
    when to stop (time.perf_counter() deadline)."""

    state: Path | None = None
    resume: bool = False
    deadline: float = math.inf
    checkpoint_every: int = 50


def _state_files(state: Path) -> tuple[Path, Path, Path]:
    return state / "model.zip", state / "replay.pkl", state / "progress.pt"


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
    stream: np.ndarray | None = None,
    run: Run | None = None,
):
    """Train one RL algorithm (on `stream` only, when given); (model with the best validated
    weights — the paper reports best scores too —, record with wall/cpu seconds, the learning
    curve, the episodes done and the episode the weights come from). Stops early when
    `run.deadline` passes (record["episodes"] < episodes)."""
    run = run or Run()
    wall, cpu = time.perf_counter(), time.process_time()
    env = MultiClusterEnv(layout, setting, stream)
    validation = [stream] if stream is not None else streams(setting, seed, 2, curve_streams)
    model_file, replay_file, progress_file = _state_files(run.state) if run.state else (None,) * 3
    spent = [0.0, 0.0]  # training seconds of earlier runs

    def save() -> None:
        if run.state is None:
            return
        run.state.mkdir(parents=True, exist_ok=True)
        model.save(model_file)
        if isinstance(model, OffPolicyAlgorithm):
            model.save_replay_buffer(replay_file)
        th.save(
            curve.state()
            | {
                "wall_s": spent[0] + time.perf_counter() - wall - curve.spent[0],
                "cpu_s": spent[1] + time.process_time() - cpu - curve.spent[1],
            },
            progress_file,
        )

    def pause(episode: int) -> str:
        # PPO collects whole rollouts of 10 episodes: a resumed one would overshoot
        if episode >= episodes or time.perf_counter() >= run.deadline:
            return "stop"
        return "save" if episode % run.checkpoint_every == 0 else ""

    curve = Curve(layout, setting, validation, curve_every, tick, pause, save)
    resumed = run.resume and progress_file is not None and progress_file.exists()
    if resumed:
        model = _load_model(name, model_file, replay_file, env, cfg)
        progress = th.load(progress_file, weights_only=False)
        spent = [progress.pop("wall_s"), progress.pop("cpu_s")]
        curve.restore(progress)
        # The run stopped at an episode's first step: start the next episode afresh, its
        # stream drawn from (seed, episodes done).
        set_random_seed(seed * 100_003 + curve.episode)
        model.env.seed(seed * 100_003 + curve.episode)
        model._last_obs = None
    else:
        model = build(name, env, cfg, seed)
        if name == "EADE-DDPG":
            fill_expert(
                model.replay_buffer,
                layout,
                setting,
                cfg.expert_episodes,
                seed=seed + 10_000,
                stream=stream,
            )
    left = (episodes - curve.episode) * setting.tasks
    if left > 0:
        model.learn(left, callback=curve, reset_num_timesteps=not resumed)
    if not curve.stopped:
        save()
    record = {
        "wall_s": spent[0] + time.perf_counter() - wall - curve.spent[0],
        "cpu_s": spent[1] + time.process_time() - cpu - curve.spent[1],
        "episodes": curve.episode,
        "planned": episodes,
        "curve": curve.rows,
        "kept_episode": curve.episode,
    }
    if curve.best is not None:
        _, record["kept_episode"], weights = curve.best
        model.policy.load_state_dict(weights, strict=False)
    return model, record


def _load_model(name: str, model_file: Path, replay_file: Path, env, cfg: AgentConfig):
    """A model saved by `train`'s state, on `env`, with its replay buffer."""
    cls = type(build(name, env, cfg, seed=0, buffer=1))
    model: BaseAlgorithm = cls.load(model_file, env=env, device="cpu")
    fresh = build(name, env, cfg, seed=0, buffer=1)
    model.set_logger(fresh.logger)
    if isinstance(model, OffPolicyAlgorithm):
        model.load_replay_buffer(replay_file)
    return model


def checkpoint_path(directory: Path, name: str, seed: int) -> Path:
    return Path(directory) / f"{name.lower()}_seed{seed}.pt"


def train_all(
    cfg: ExperimentConfig,
    agent: AgentConfig,
    layouts: Callable[[int], Layout],
    setting: Setting,
    checkpoints: Path,
    progress: Callable[[str, float], None] = lambda what, units: None,
    states: Path | None = None,
    resume: bool = False,
    stop_after_s: float = math.inf,
    only_seed: int | None = None,
) -> bool:
    """Train every RL algorithm of `cfg` on every seed (or on `only_seed` alone: seeds train
    independently, so processes can share them out) and save its checkpoint (the acting
    weights, the training time, the learning curve, the episodes done and planned). With
    `states`: the training states go there, `resume` goes on from them (a checkpoint already
    at `cfg.episodes` is kept), and after `stop_after_s` seconds the training under way stops at
    its next episode (so each call trains at least one), saving its state and checkpoint, and
    the call returns; True when every training is done.
    `progress(what, units)`: a unit is one episode."""
    deadline = time.perf_counter() + stop_after_s
    for seed in range(cfg.seeds) if only_seed is None else (only_seed,):
        layout = layouts(seed)
        stream = fixed_stream(setting, seed) if cfg.fixed_stream else None
        for name in (a for a in cfg.algorithms if a in ALGORITHMS):
            what = f"seed {seed} · {name} · training"
            path = checkpoint_path(checkpoints, name, seed)
            if resume and path.exists():
                meta = th.load(path, weights_only=True)["meta"]
                if meta["episodes"] >= cfg.episodes:
                    progress(what, cfg.episodes)
                    continue
            run = Run(
                states / f"{name.lower()}_seed{seed}" if states else None,
                resume,
                deadline,
                cfg.checkpoint_every,
            )
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
                stream,
                run,
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            save_acting(
                model,
                name,
                agent,
                path,
                {
                    "seed": seed,
                    "episodes": record["episodes"],
                    "planned": record["planned"],
                    "kept_episode": record["kept_episode"],
                    "wall_s": record["wall_s"],
                    "cpu_s": record["cpu_s"],
                    "machine": machine_info(),
                    "machines": list(layout.machines),
                    "curve": record["curve"],
                },
            )
            if record["episodes"] < cfg.episodes:
                return False
    return True


def curves_of(cfg: ExperimentConfig, checkpoints: Path) -> dict[str, list[list[dict]]]:
    """The learning curves the checkpoints of `cfg` hold: {algorithm: [curve per seed]}."""
    return {
        name: [
            th.load(checkpoint_path(checkpoints, name, seed), weights_only=True)["meta"]["curve"]
            for seed in range(cfg.seeds)
        ]
        for name in cfg.algorithms
        if name in ALGORITHMS
    }


def evaluate_all(
    cfg: ExperimentConfig,
    layouts: Callable[[int], Layout],
    setting: Setting,
    checkpoints: Path,
    progress: Callable[[str, float], None] = lambda what, units: None,
) -> dict:
    """Every algorithm of `cfg` (RL ones from their checkpoints) and the experts on every seed's
    held-out streams — and, in the fixed-stream mode, first on its fixed stream, which is then
    the figure ("algorithms") while the held-out streams give "held_out"; the results document
    (training times from the checkpoints)."""
    names = cfg.algorithms + tuple(REFERENCES)
    per_seed: dict[str, list[dict]] = {name: [] for name in names}
    held_out: dict[str, list[dict]] = {name: [] for name in names}
    training: dict[str, list[dict]] = {}
    for seed in range(cfg.seeds):
        layout = layouts(seed)
        tasks = streams(setting, seed, 1, cfg.eval_episodes)
        for name in names:
            if name in ALGORITHMS:
                _, model, meta = load_acting(
                    checkpoint_path(checkpoints, name, seed), MultiClusterEnv(layout, setting)
                )
                training.setdefault(name, []).append(meta)
                chooser = functools.partial(agent_chooser, model)  # deterministic
            else:  # a fresh one per evaluation: Random's draws restart
                chooser = functools.partial(heuristic_chooser, name, seed)
            held = evaluate(chooser(), layout, setting, tasks)
            if cfg.fixed_stream:
                per_seed[name].append(
                    evaluate(chooser(), layout, setting, [fixed_stream(setting, seed)])
                )
                held_out[name].append(held)
            else:
                per_seed[name].append(held)
            progress(f"seed {seed} · {name} · evaluation", cfg.eval_episodes)

    def summary(rows: dict[str, list[dict]]) -> dict:
        keys = list(rows["Expert"][0])
        return {name: {k: mean_std([r[k] for r in rs]) for k in keys} for name, rs in rows.items()}

    doc = {
        "algorithms": summary(per_seed),
        "per_seed": per_seed,
        "paper": {name: dict(zip(("N", "F", "gpu_load_var"), v)) for name, v in PAPER.items()},
        "training": {
            name: {
                "wall_s": mean_std([m["wall_s"] for m in ms]),
                "cpu_s": mean_std([m["cpu_s"] for m in ms]),
                "kept_episode": [m["kept_episode"] for m in ms],
                "episodes": ms[0]["episodes"],
                "episodes_per_seed": [m["episodes"] for m in ms],
                "planned": ms[0].get("planned", ms[0]["episodes"]),
                "machine": ms[0]["machine"],
            }
            for name, ms in training.items()
        },
        "experiment": asdict(cfg),
        "setting": setting.as_dict(),
        "machine": machine_info(),
    }
    if cfg.fixed_stream:
        doc["held_out"] = summary(held_out)
    return doc


# The paper's Table 6: per algorithm, each resource's utilisation, mean and std over clusters.
PAPER_TABLE6_KEYS = tuple(
    f"util_{r}_{s}" for r in ("gpu_mem_gb", "gpu_core", "cpu", "mem_gb") for s in ("mean", "std")
)
PAPER_TABLE6 = {
    "EADE-DDPG": (0.9537, 0.0251, 0.8350, 0.0953, 0.4724, 0.2437, 0.5166, 0.2617),
    "DDPG": (0.8959, 0.1366, 0.7784, 0.1437, 0.4298, 0.2499, 0.4789, 0.2629),
    "TD3": (0.9209, 0.0064, 0.8035, 0.0710, 0.4547, 0.2522, 0.5081, 0.2861),
    "SAC": (0.9251, 0.0603, 0.8136, 0.1097, 0.4980, 0.3132, 0.5504, 0.3344),
    "PPO": (0.9119, 0.0592, 0.8010, 0.0800, 0.4943, 0.3223, 0.5466, 0.3366),
    "BestFit": (0.9146, 0.0897, 0.8086, 0.0931, 0.4636, 0.2905, 0.5209, 0.3178),
    "Greedy": (0.8997, 0.1164, 0.7996, 0.1219, 0.4579, 0.2892, 0.5261, 0.3471),
    "Random": (0.8901, 0.1021, 0.7946, 0.1317, 0.4729, 0.2967, 0.5387, 0.3514),
    "Utilization": (0.9050, 0.1034, 0.8019, 0.1153, 0.4668, 0.2860, 0.5059, 0.2783),
}
# The settings the diagnostics compare: ours, each of the faithful setting's changes alone, the
# faithful one, and the faithful one with other shares of 8-card hosts (the one knob we set).
_OURS, _FAITHFUL = SETTINGS["ours"], SETTINGS["faithful"]
DIAGNOSED = {
    "ours": _OURS,
    "ours, mixed hosts (1/16 with 8 cards)": replace(_OURS, eight_card_share=1 / 16),
    "ours, the trace's tails": replace(_OURS, shapes=_FAITHFUL.shapes),
    "faithful": _FAITHFUL,
    "faithful, no 8-card hosts": replace(_FAITHFUL, eight_card_share=0.0),
    "faithful, the table's share of 8-card hosts (29 %)": replace(_FAITHFUL, eight_card_share=0.29),
}


def diagnose(
    seeds: int,
    eval_episodes: int,
    layouts: Callable[[Setting, int], Layout],
    progress: Callable[[str, float], None] = lambda what, units: None,
) -> dict:
    """Every rule that needs no training — the heuristics and both experts — on the held-out
    streams of `DIAGNOSED`'s settings: the paper's metrics, the failures split and Table 6's
    utilisations, mean ± sd over seeds."""
    rules = tuple(HEURISTICS) + tuple(REFERENCES)
    out = {}
    for label, setting in DIAGNOSED.items():
        rows: dict[str, list[dict]] = {name: [] for name in rules}
        for seed in range(seeds):
            layout = layouts(setting, seed)
            tasks = streams(setting, seed, 1, eval_episodes)
            for name in rules:
                rows[name].append(evaluate(heuristic_chooser(name, seed), layout, setting, tasks))
                progress(f"{label} · seed {seed} · {name}", eval_episodes)
        out[label] = {
            "setting": setting.as_dict(),
            "algorithms": {
                name: {k: mean_std([r[k] for r in rs]) for k in rs[0]} for name, rs in rows.items()
            },
        }
    return {
        "settings": out,
        "paper_table6": {n: dict(zip(PAPER_TABLE6_KEYS, v)) for n, v in PAPER_TABLE6.items()},
        "paper": {name: dict(zip(("N", "F", "gpu_load_var"), v)) for name, v in PAPER.items()},
        "seeds": seeds,
        "eval_episodes": eval_episodes,
        "machine": machine_info(),
    }


# --- reporting ------------------------------------------------------------------------------------
def _cell(m: dict | None, digits: int) -> str:
    if not m or m["mean"] is None:
        return "—"
    return f"{m['mean']:.{digits}f} ± {m['std']:.{digits}f}"


def episodes_trained(training: dict) -> str:
    """An algorithm's training episodes, "a" or, where its seeds' trainings stopped at
    different episodes (a run stopped by --stop-after-s), "least–most"."""
    per_seed = training.get("episodes_per_seed") or [training["episodes"]]
    lo, hi = min(per_seed), max(per_seed)
    return str(lo) if lo == hi else f"{lo}–{hi}"


def table(doc: dict) -> str:
    """Markdown: N, F, σ², GPU σ² (mean ± sd over seeds) beside the paper's Tables 7–9, the
    failures split (aggregate-infeasible choices / fragmentation / wrong waits), in the
    fixed-stream mode N on the held-out streams, and the training time per algorithm."""
    e = doc["experiment"]
    fixed = e.get("fixed_stream", False)
    done = sorted(
        {episodes_trained(t) for t in doc["training"].values()},
        key=lambda label: int(label.split("–")[0]),
    )
    planned = [
        str(p) for p in sorted({t.get("planned", t["episodes"]) for t in doc["training"].values()})
    ]
    trained = "/".join(done) or "no"
    if planned != done and planned:
        trained += f" (of {'/'.join(planned)} planned)"
    evaluated = (
        f"the fixed stream of each seed (N on {e['eval_episodes']} held-out streams beside it)"
        if fixed
        else f"{e['eval_episodes']} held-out task streams"
    )
    lines = [
        f"Setting '{e.get('setting', 'ours')}', {e['seeds']} seeds × {evaluated}, {trained} "
        "training episodes; mean ± sd over seeds. Paper: Tables 7–9 (its σ² column is the GPU "
        "load variance). Failures: deployments whose cluster's remaining resources did not "
        "cover the task / that fragmentation failed, then waits while a cluster could host it. "
        "Expert: the reward's greedy maximiser, asking the member clusters; Expert-aggregate: "
        "the paper's expert, judging by the remaining resources.",
        "",
        "| algorithm | N | paper N |"
        + (" N held-out |" if fixed else "")
        + " F | paper F | σ² (Ū) | GPU σ² | paper GPU σ² | failures | train wall s | "
        "train CPU s |",
        "| --- | ---: | ---: |" + (" ---: |" if fixed else "") + " ---: |" * 8,
    ]
    for name, m in doc["algorithms"].items():
        paper = doc["paper"].get(name, {})
        t = doc["training"].get(name)
        fails = " / ".join(
            f"{m[k]['mean']:.1f}" if k in m else "—"
            for k in ("failed_aggregate", "failed_fragmented", "waited_wrong")
        )
        lines.append(
            f"| {name} | {_cell(m['N'], 1)} | {paper.get('N', '—')} |"
            + (f" {_cell(doc['held_out'][name]['N'], 1)} |" if fixed else "")
            + f" {_cell(m['F'], 4)} | {paper.get('F', '—')} | {_cell(m['load_var'], 4)} | "
            f"{_cell(m['gpu_load_var'], 4)} | {paper.get('gpu_load_var', '—')} | {fails} | "
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
        # the episodes every seed reached: a training stopped by --stop-after-s leaves its
        # seeds at different episodes
        reached = min(len(rows) for rows in per_seed)
        per_seed = [rows[:reached] for rows in per_seed]
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
