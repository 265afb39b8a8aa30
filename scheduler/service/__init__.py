"""The CES control plane (the Master): Manager, Scheduler, Compute and Network Controllers behind
a small HTTP/JSON API, and the protocol the edge agents speak (`protocol`). Run it with
`python -m scheduler.service serve ...`; submit with `python -m scheduler.service submit JOB.yaml`.
"""
from .master import Master, MasterConfig

__all__ = ["Master", "MasterConfig"]
