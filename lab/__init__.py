"""Real edge hosts: the inventory of a lab and the deployment of CES's edge agents to it over SSH
(`python -m lab`, `experiments/run.py --hosts`). See docs/lab.md."""
