"""The paper's heuristic baselines at cluster level, and the experts that fill EADE's buffer.

The baselines are the cluster-level forms of `scheduler.baselines`' host-level rules. They see
what the RL agents see — each cluster's aggregate remaining resources (`MultiCluster.free`) and
the task — and consider the clusters whose aggregate covers the request (`aggregate_fit`); with
none, they wait. Whether the chosen cluster can really host the task (its hosts and cards) only
the member cluster knows: a fragmented cluster fails the deployment.
  random       uniform among those clusters (seed 004's Random; `random`).
  greedy       the first of them in cluster order (Greedy; `first-fit`).
  bestfit      the one left with the least free resources: min Σ_r (free_r - d_r) / max_r, max_r
               the largest cluster capacity of r (BestFit; `best-fit`).
  utilization  the one whose free resources are most proportional to the request:
               max cosine(d_r / cap_r, free_r / cap_r) (Utilization; `utilization`).
  worstfit-gpu not the paper's: the one with the most free GPU memory and cores (each over the
               largest cluster's), which spreads the scarce resource (issue 52's diagnostic).
The experts (§3.2, "expert demonstrations"): for every cluster that can host the task, the
reward the deployment would earn by eqs. (15)–(17); the best one, else wait. `expert` asks the
member clusters whether they can host the task — historical deployment records know which
deployments succeeded — so it never fails; with that knowledge it is the policy that greedily
maximises the reward (a failure or a wrong wait earns −50, below every deployment's [−10, 0]).
`aggregate_expert` is the paper's as §3.2 describes it: it judges by the remaining resources,
among the clusters whose aggregate covers the request. Either fills EADE-DDPG's buffer
(`Setting.expert`); both are reported for reference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .env import MultiClusterEnv, deployment_reward


def _candidates(env: MultiClusterEnv) -> np.ndarray:
    return np.flatnonzero(env.cluster.aggregate_fit(env.task))


def greedy(env: MultiClusterEnv, rng: np.random.Generator) -> int:
    fits = _candidates(env)
    return int(fits[0]) if len(fits) else env.setting.wait


def random_choice(env: MultiClusterEnv, rng: np.random.Generator) -> int:
    fits = _candidates(env)
    return int(rng.choice(fits)) if len(fits) else env.setting.wait


def bestfit(env: MultiClusterEnv, rng: np.random.Generator) -> int:
    fits = _candidates(env)
    if not len(fits):
        return env.setting.wait
    c = env.cluster
    leftover = (c.free()[fits] - env.task) / c.capacity.max(axis=0)
    return int(fits[np.argmin(leftover.sum(axis=1))])


def utilization(env: MultiClusterEnv, rng: np.random.Generator) -> int:
    fits = _candidates(env)
    if not len(fits):
        return env.setting.wait
    cap = env.cluster.capacity[fits]
    want = env.task / cap
    have = env.cluster.free()[fits] / cap
    norm = np.linalg.norm(want, axis=1) * np.linalg.norm(have, axis=1)
    cosine = np.divide((want * have).sum(axis=1), norm, out=np.zeros(len(fits)), where=norm > 0)
    return int(fits[np.argmax(cosine)])


def worstfit_gpu(env: MultiClusterEnv, rng: np.random.Generator) -> int:
    fits = _candidates(env)
    if not len(fits):
        return env.setting.wait
    c = env.cluster
    gpu_free = (c.free()[fits, 2:] / c.capacity.max(axis=0)[2:]).sum(axis=1)
    return int(fits[np.argmax(gpu_free)])


def _best_scored(env: MultiClusterEnv, clusters: np.ndarray) -> int:
    """Among `clusters`, the one whose deployment eqs. (15)–(17) score best; none: wait."""
    c, task = env.cluster, env.task
    best, best_reward = env.setting.wait, -np.inf
    used = c.used()
    for n in clusters:  # as if deployed; aggregate use is all the score needs
        after = used.copy()
        after[n] += task
        r = deployment_reward(after / c.capacity, int(n), env.setting.tau)
        if r > best_reward:
            best, best_reward = int(n), r
    return best


def expert(env: MultiClusterEnv, rng: np.random.Generator) -> int:
    return _best_scored(env, np.flatnonzero(env.cluster.true_fit(env.task)))


def aggregate_expert(env: MultiClusterEnv, rng: np.random.Generator) -> int:
    return _best_scored(env, _candidates(env))


Rule = Callable[[MultiClusterEnv, np.random.Generator], int]
HEURISTICS: dict[str, Rule] = {
    "BestFit": bestfit,
    "Greedy": greedy,
    "Random": random_choice,
    "Utilization": utilization,
    "WorstFit-GPU": worstfit_gpu,
}
EXPERTS: dict[str, Rule] = {"member": expert, "aggregate": aggregate_expert}


def run_episode(
    env: MultiClusterEnv,
    choose: Callable[[MultiClusterEnv], int],
    tasks: np.ndarray | None = None,
    seed: int | None = None,
) -> dict[str, float]:
    """One episode with a discrete chooser; the episode's metrics."""
    env.reset(seed=seed, options=None if tasks is None else {"tasks": tasks})
    while True:
        _, _, done, _, info = env.choose(choose(env))
        if done:
            return info["metrics"]
