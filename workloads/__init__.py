"""What runs inside the worker containers: one task of a PyTorch DDP training job.

`python -m workloads.train ...` (see `workloads.train`) trains one rank over gloo, ring
all-reduce (`ring`) or a parameter server star (`ps`), on real offline data (`workloads.data`),
with models of different communication weight (`workloads.models`), and writes JSON lines with
per-iteration compute/communication time and bytes, evaluations and time-to-accuracy.
`workloads.results` reads those files back for the experiments.
"""
