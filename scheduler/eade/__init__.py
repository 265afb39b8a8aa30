"""Seed 004 (EADE-DDPG, Hu Yahui et al., Journal on Communications 2025) in one harness.

  env.py         the paper's setting: 16 clusters × 4 GPU hosts, 220 FIFO tasks per episode, its
                 state, its action (a cluster or wait), its reward and its metrics N, F, σ²
  heuristics.py  BestFit, Greedy, Random, Utilization at cluster level, and the expert scorer
  agents.py      EADE-DDPG as stable-baselines3 customisations; DDPG, TD3, SAC, PPO
  experiment.py  training, evaluation, the comparison with the paper's Tables 7–9
  __main__.py    `python -m scheduler.eade train|evaluate|all`
  ces.py         `eade-ddpg`: EADE's ideas as a single-job placement algorithm of CES

docs/eade.md says what the paper leaves open and what we chose.
"""
