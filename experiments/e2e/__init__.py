"""The parts of the end-to-end run (`experiments/run.py`):

scenario  the scenario file and the plan: every input checked before anything is created
stack     the live system: SDN app, emulated network, Master, agents, background traffic
rows      one result row per job, from what the Master and the workers measured
display   the live view of a run
"""
