"""TapFinger (seed 002: INFOCOM'23, arXiv 2302.00571), a clean-room implementation.

net.py     the heterogeneous graph attention encoder, pointer network, masked allocation head,
           per-agent critic; the allocation masks and the Bayes arbiter;
paper.py   TapFinger's own setting (six heterogeneous agents, time slots) and its baselines
           (Tiresias, Optimus-like, Random, Min), to check its claim;
policy.py  TapFinger as a CES queue policy (one agent per compute node);
mappo.py   MAPPO training in both settings (`python -m scheduler.train_tapfinger`).
"""
