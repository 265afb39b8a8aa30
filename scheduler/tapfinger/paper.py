"""TapFinger's own setting (arXiv 2302.00571, its synthetic experiments), so its claim can be
checked: six edge servers (agents) with (cpu, gpu) capacities (4, 4) ... (32, 32), time slots,
ML tasks arriving at random and each reachable from a random subset of the servers.

  arrivals   Poisson, `rate` tasks per slot, `tasks` in all; a task is reachable from k servers,
             k uniform in 1..6, chosen at random; it waits in each one's FIFO queue, whose first
             `pending` (K) tasks are the agent's pending slots;
  allocation a task started on a server gets (c, g) cores and GPUs, c, g in 0..16, at least the
             minimum (2, 1) and at most what the server has free, for its whole run (TapFinger,
             Random, Min); the elastic baselines re-allocate every slot;
  speed      progress per slot (a task is done at 1): "vision" tasks are insensitive, 0.25 with
             at least the minimum; "language" tasks speed up with GPUs at a diminishing rate,
             tanh(g / 16) · sqrt(1.2 - progress) — the shapes of the authors' synthetic setting;
  reward     per agent and slot, -(tasks waiting at it + tasks running on it): summed over time,
             the tasks' completion times;
  JCT        slots from arrival to completion.
Within a slot the agents act again and again (multi-task scheduling) until none starts a task.

Baselines (the paper's): Random (random task, random allowed allocation), Min (random task, the
minimum), Optimus-like (every slot: pending tasks start at the minimum while they fit, then the
spare units go one at a time to the task whose estimated remaining time drops most per unit, from
Optimus' speed model 1/f = θ·(1/g, 1, g/c, g, c) fitted by least squares to profiled speeds),
Tiresias (LAS: minimum for every task, spare GPUs one at a time to the task with the least
attained GPU service — two queues split at `LAS_THRESHOLD` GPU-slots, first started first inside
a queue —, spare cores spread evenly; ours, `las`), the paper's elastic Tiresias
(`tiresias-paper`: every slot from nothing, GPUs one at a time to the earliest-started task at or
below the median attained service, cores only to GPU holders; `tiresias_paper_policy`). And a
reference that is not the paper's: Kind-aware, a
fixed rule that knows what TapFinger has to learn — which kind is GPU-sensitive —: tasks in
arrival order, "vision" at the minimum, "language" with every GPU free up to the grid's top
level; what a fixed allocation can reach here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .net import Obs, TapFingerNet, act, allocation_mask

KINDS = ("vision", "language")
MINIMUM = np.array([2, 1])  # (cpu, gpu) of every task
LEVELS = np.arange(17)  # a task gets 0..16 of each resource
GRID = 1 + len(LEVELS) ** 2
LAS_THRESHOLD = 32.0  # GPU-slots of attained service between Tiresias' two queues
DIMS = {"server": 6, "task": 4, "running": 5, "central": 1}


def speed(kind: int, alloc: np.ndarray, progress: float) -> float:
    """Progress per slot of a task of `kind` with `alloc` (cpu, gpu) at `progress`."""
    if (alloc < MINIMUM).any():
        return 0.0
    if kind == 0:
        return 0.25
    return math.tanh(alloc[1] / 16) * math.sqrt(max(1.2 - progress, 0.0))


def cell_alloc(cell: int) -> np.ndarray:
    """The (cpu, gpu) of a grid cell (> 0)."""
    return np.array(divmod(cell - 1, len(LEVELS)))


@dataclass(frozen=True)
class PaperSetting:
    capacities: tuple[tuple[int, int], ...] = (
        (4, 4),
        (8, 8),
        (12, 12),
        (16, 16),
        (24, 24),
        (32, 32),
    )
    tasks: int = 384
    rate: float = 6.0  # tasks per slot
    pending: int = 10  # K: pending slots per agent


@dataclass
class Task:
    id: int
    kind: int
    arrive: int
    agents: tuple[int, ...]
    progress: float = 0.0
    agent: int = -1  # where it runs
    alloc: np.ndarray = field(default_factory=lambda: np.zeros(2, int))
    start: int = -1
    attained: float = 0.0  # GPU-slots (Tiresias)


class PaperEnv:
    """The setting as an environment: `obs`, `start`, `set_alloc`, `advance` (one slot)."""

    def __init__(self, setting: PaperSetting = PaperSetting(), seed: int = 0):
        self.setting = setting
        self.cap = np.array(setting.capacities, int)
        rng = np.random.default_rng(seed)
        a = len(self.cap)
        self.schedule: list[Task] = []
        t = 0
        while len(self.schedule) < setting.tasks:
            for _ in range(min(rng.poisson(setting.rate), setting.tasks - len(self.schedule))):
                k = int(rng.integers(1, a + 1))
                agents = tuple(sorted(rng.choice(a, k, replace=False).tolist()))
                self.schedule.append(Task(len(self.schedule), int(rng.integers(2)), t, agents))
            t += 1
        self.time, self.next = 0, 0
        self.free = self.cap.copy()
        self.waiting: list[list[Task]] = [[] for _ in range(a)]
        self.running: list[dict[int, Task]] = [{} for _ in range(a)]
        self.jct: list[int] = []
        self._arrive()

    @property
    def agents(self) -> int:
        return len(self.cap)

    @property
    def done(self) -> bool:
        return self.next == len(self.schedule) and not any(self.running) and not any(self.waiting)

    def _arrive(self) -> None:
        while self.next < len(self.schedule) and self.schedule[self.next].arrive <= self.time:
            task = self.schedule[self.next]
            for i in task.agents:
                self.waiting[i].append(task)
            self.next += 1

    def pending(self, i: int) -> list[Task]:
        return self.waiting[i][: self.setting.pending]

    def start(self, i: int, task: Task, alloc: np.ndarray) -> None:
        assert (alloc >= MINIMUM).all() and (alloc <= self.free[i]).all() and task.agent < 0
        task.agent, task.alloc, task.start = i, np.array(alloc), self.time
        self.free[i] -= task.alloc
        self.running[i][task.id] = task
        for j in task.agents:
            self.waiting[j].remove(task)

    def set_alloc(self, task: Task, alloc: np.ndarray) -> None:
        """Re-allocate a running task (elastic baselines)."""
        self.free[task.agent] += task.alloc - alloc
        assert (self.free[task.agent] >= 0).all()
        task.alloc = np.array(alloc)

    def advance(self) -> np.ndarray:
        """One slot: every agent's reward -(tasks waiting at it + running on it); progress,
        completions, arrivals."""
        reward = -np.array([len(w) + len(r) for w, r in zip(self.waiting, self.running)], float)
        self.time += 1
        for i, running in enumerate(self.running):
            for task in list(running.values()):
                task.progress += speed(task.kind, task.alloc, task.progress)
                task.attained += task.alloc[1]
                if task.progress >= 1.0 - 1e-9:
                    del running[task.id]
                    self.free[i] += task.alloc
                    self.jct.append(self.time - task.arrive)
        self._arrive()
        return reward

    def obs(self) -> tuple[Obs, list[Task]]:
        """The agents' view, and the pending tasks in the order of `Obs.tasks`."""
        a, k = self.agents, self.setting.pending
        tasks: list[Task] = []
        index: dict[int, int] = {}
        slots = np.full((a, k), -1)
        masks = np.zeros((a, k, GRID), bool)
        masks[..., 0] = True
        ratio = np.zeros((a, k))
        for i in range(a):
            hi = np.minimum(self.free[i], LEVELS[-1])
            for s, task in enumerate(self.pending(i)):
                if task.id not in index:
                    index[task.id] = len(tasks)
                    tasks.append(task)
                slots[i, s] = index[task.id]
                masks[i, s] = allocation_mask([LEVELS, LEVELS], MINIMUM, hi)
                ratio[i, s] = (self.free[i] / MINIMUM).min()
        scale = float(self.cap.max())
        servers = np.column_stack(
            [
                self.free / scale,
                self.cap / scale,
                [len(w) / k for w in self.waiting],
                [len(r) / k for r in self.running],
            ]
        )
        feats = [
            [t.kind == 0, t.kind == 1, (self.time - t.arrive) / 10, len(t.agents) / a]
            for t in tasks
        ]
        run = [t for r in self.running for t in r.values()]
        rfeats = [[*(t.alloc / LEVELS[-1]), t.kind == 0, t.kind == 1, t.progress] for t in run]
        hosts = np.array([[t.agent for t in run], list(range(len(run)))], int).reshape(2, -1)
        return Obs(
            servers.astype(np.float32),
            np.array(feats, np.float32).reshape(-1, 4),
            np.array(rfeats, np.float32).reshape(-1, 5),
            hosts,
            slots,
            masks,
            ratio,
        ), tasks


# --- schedulers: one call per slot, before `advance` --------------------------------------------
Scheduler = Callable[[PaperEnv], None]


def tapfinger(
    net: TapFingerNet,
    greedy: bool = True,
    rng: np.random.Generator | None = None,
    record: Callable | None = None,
) -> Scheduler:
    """TapFinger's multi-task scheduling: the agents act until none starts a task (`record`
    sees every step: obs, step)."""

    def schedule(env: PaperEnv) -> None:
        while True:
            obs, tasks = env.obs()
            if not (obs.slots >= 0).any():
                return
            step = act(net, obs, greedy, rng)
            if record:
                record(obs, step)
            if not step.winners:
                return
            for t, i in step.winners.items():
                env.start(i, tasks[t], cell_alloc(int(step.cell[i])))

    return schedule


def random_policy(minimum: bool, seed: int = 0) -> Scheduler:
    """Random (random task, random allowed allocation) or Min (random task, the minimum)."""
    rng = np.random.default_rng(seed)

    def schedule(env: PaperEnv) -> None:
        started = True
        while started:
            started = False
            for i in range(env.agents):
                pending = env.pending(i)
                if not pending or not (env.free[i] >= MINIMUM).all():
                    continue
                task = pending[int(rng.integers(len(pending)))]
                if minimum:
                    alloc = MINIMUM
                else:
                    cells = np.flatnonzero(
                        allocation_mask(
                            [LEVELS, LEVELS], MINIMUM, np.minimum(env.free[i], LEVELS[-1])
                        )[1:]
                    )
                    alloc = cell_alloc(1 + int(cells[rng.integers(len(cells))]))
                env.start(i, task, alloc)
                started = True

    return schedule


def kind_aware_policy() -> Scheduler:
    def schedule(env: PaperEnv) -> None:
        for i in range(env.agents):
            for task in list(env.pending(i)):
                if not (env.free[i] >= MINIMUM).all():
                    break
                gpus = MINIMUM[1] if task.kind == 0 else min(env.free[i][1], LEVELS[-1])
                env.start(i, task, np.array([MINIMUM[0], gpus]))

    return schedule


def _admit_minimum(env: PaperEnv) -> None:
    """Pending tasks start at the minimum in arrival order while it fits; every running task
    falls back to the minimum (the elastic baselines then hand out the spare units)."""
    for i in range(env.agents):
        for task in list(env.running[i].values()):
            env.set_alloc(task, MINIMUM)
        for task in list(env.pending(i)):
            if (env.free[i] >= MINIMUM).all():
                env.start(i, task, MINIMUM)


def optimus_fit() -> np.ndarray:
    """θ per kind of Optimus' speed model 1/f = θ·(1/g, 1, g/c, g, c), least squares over the
    speeds profiled at progress 0 for every allowed (c, g)."""
    cg = [(c, g) for c in LEVELS[2:] for g in LEVELS[1:]]
    x = np.array([[1 / g, 1, g / c, g, c] for c, g in cg], float)
    return np.array(
        [
            np.linalg.lstsq(x, [1 / speed(k, np.array(a), 0.0) for a in cg], rcond=None)[0]
            for k in range(len(KINDS))
        ]
    )


def optimus_policy() -> Scheduler:
    theta = optimus_fit()

    def remaining(task: Task, alloc: np.ndarray) -> float:
        c, g = alloc
        return (1 - task.progress) * max(theta[task.kind] @ [1 / g, 1, g / c, g, c], 1e-6)

    def schedule(env: PaperEnv) -> None:
        _admit_minimum(env)
        for i in range(env.agents):
            tasks = list(env.running[i].values())
            while tasks:
                gains = []
                for task in tasks:
                    for r in (0, 1):
                        step = np.eye(2, dtype=int)[r]
                        new = task.alloc + step
                        if env.free[i][r] >= 1 and new[r] <= LEVELS[-1]:
                            gains.append(
                                (
                                    remaining(task, task.alloc) - remaining(task, new),
                                    -task.id,
                                    r,
                                    task,
                                )
                            )
                best = max(gains, default=None, key=lambda x: x[:3])
                if best is None or best[0] <= 0:
                    break
                env.set_alloc(best[3], best[3].alloc + np.eye(2, dtype=int)[best[2]])

    return schedule


def tiresias_policy() -> Scheduler:
    def schedule(env: PaperEnv) -> None:
        _admit_minimum(env)
        for i in range(env.agents):
            tasks = sorted(
                env.running[i].values(), key=lambda t: (t.attained >= LAS_THRESHOLD, t.start, t.id)
            )
            while env.free[i][1] > 0:
                grow = next(
                    (
                        t
                        for t in sorted(
                            tasks,
                            key=lambda t: (
                                t.attained + t.alloc[1] >= LAS_THRESHOLD,
                                t.attained + t.alloc[1],
                                t.start,
                            ),
                        )
                        if t.alloc[1] < LEVELS[-1]
                    ),
                    None,
                )
                if grow is None:
                    break
                env.set_alloc(grow, grow.alloc + [0, 1])
            while tasks and env.free[i][0] > 0:
                open_ = [t for t in tasks if t.alloc[0] < LEVELS[-1]]
                if not open_:
                    break
                for t in open_[: env.free[i][0]]:
                    env.set_alloc(t, t.alloc + [1, 0])

    return schedule


def tiresias_paper_policy() -> Scheduler:
    """The elastic Tiresias TapFinger was compared with, as issue 52 describes the authors' rule
    (written from that description, not from their code). Every slot, on every server: the
    running tasks are reset to nothing; the candidates are those tasks and the server's pending
    ones (its K slots, counted as starting now, after every running task, in arrival order);
    the GPUs go one at a time to the earliest-started candidate whose attained GPU service is at
    or below the candidates' median (so a candidate takes GPUs up to the grid's top before the
    next gets one); the cores go only to GPU holders, one at a time to each in turn (the same
    order, up to the grid's top). A pending task that got at least the minimum starts there; a
    running task below it makes no progress this slot. What the description leaves open and we
    chose: "at or below" the median (strictly below, no task qualifies while all have the same
    service, as on an idle server), the pending tasks among the candidates, the cores in turn."""

    def schedule(env: PaperEnv) -> None:
        for i in range(env.agents):
            running = sorted(env.running[i].values(), key=lambda t: (t.start, t.id))
            for task in running:
                env.set_alloc(task, np.zeros(2, int))
            candidates = running + list(env.pending(i))
            if not candidates:
                continue
            median = float(np.median([t.attained for t in candidates]))
            alloc = {t.id: np.zeros(2, int) for t in candidates}
            eligible = [t for t in candidates if t.attained <= median + 1e-9]
            for _ in range(int(env.free[i][1])):
                take = next((t for t in eligible if alloc[t.id][1] < LEVELS[-1]), None)
                if take is None:
                    break
                alloc[take.id][1] += 1
            holders = [t for t in candidates if alloc[t.id][1] > 0]
            cores = int(env.free[i][0])
            while cores and any(alloc[t.id][0] < LEVELS[-1] for t in holders):
                for t in holders:
                    if cores and alloc[t.id][0] < LEVELS[-1]:
                        alloc[t.id][0] += 1
                        cores -= 1
            for task in candidates:
                if task.agent == i:
                    env.set_alloc(task, alloc[task.id])
                elif (alloc[task.id] >= MINIMUM).all():
                    env.start(i, task, alloc[task.id])

    return schedule


def run(env: PaperEnv, schedule: Scheduler, max_slots: int = 100_000) -> float:
    """Average JCT (slots) of one episode."""
    while not env.done and env.time < max_slots:
        schedule(env)
        env.advance()
    return float(np.mean(env.jct))


def allocations(net: TapFingerNet, seed: int, setting: PaperSetting = PaperSetting()) -> dict:
    """What the greedy policy gives each kind of task over episode `seed`: per kind, the
    (cpu, gpu) allocations it started tasks with ("c,g") and how often, the commonest first —
    whether it learned which kind gains from GPUs."""
    counts = {kind: Counter() for kind in KINDS}

    def record(obs: Obs, step) -> None:
        for t, i in step.winners.items():
            c, g = cell_alloc(int(step.cell[i]))
            counts[KINDS[int(obs.tasks[t][1] > 0.5)]][f"{c},{g}"] += 1  # feature 1: "language"

    run(PaperEnv(setting, seed), tapfinger(net, record=record))
    return {kind: dict(c.most_common()) for kind, c in counts.items()}


BASELINES: dict[str, Callable[[int], Scheduler]] = {  # name -> scheduler of seed s
    "las": lambda s: tiresias_policy(),
    "tiresias-paper": lambda s: tiresias_paper_policy(),
    "optimus": lambda s: optimus_policy(),
    "random": lambda s: random_policy(False, s),
    "min": lambda s: random_policy(True, s),
    "kind-aware": lambda s: kind_aware_policy(),
}


def compare(
    net: TapFingerNet,
    episodes: int,
    setting: PaperSetting = PaperSetting(),
    progress: Callable[[str], None] = lambda _: None,
    others: dict[str, TapFingerNet] | None = None,
) -> dict[str, list[float]]:
    """Average JCT per episode (episodes 1000, 1001, ...: never trained on) of TapFinger, greedy
    (the likeliest slot and cell) and sampled (seeded by the episode), of the `BASELINES`, and
    of `others` (name: network, e.g. an earlier checkpoint's) as "tapfinger@name", greedy and
    sampled."""
    nets = {"tapfinger": net} | {f"tapfinger@{k}": v for k, v in (others or {}).items()}
    policies: dict[str, Callable[[int], Scheduler]] = {}
    for name, n in nets.items():
        policies[name] = lambda s, n=n: tapfinger(n)
        policies[f"{name}-sampled"] = lambda s, n=n: tapfinger(
            n, greedy=False, rng=np.random.default_rng(s)
        )
    policies |= BASELINES
    out: dict[str, list[float]] = {}
    for name, make in policies.items():
        out[name] = []
        for s in range(episodes):
            progress(f"paper-like setting: {name}, episode {s + 1}/{episodes}")
            out[name].append(run(PaperEnv(setting, 1000 + s), make(s)))
    return out
