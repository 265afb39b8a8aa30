"""The CES control plane (the Master), DESIGN §1:

manager     the job table and every job's life cycle (Manager)
scheduling  which queued jobs start and the joint decision for each (Scheduler)
compute     the agents, their heartbeats and workers (Compute Controller)
network     the network view and the enforcement of flows (Network Controller)
master      the control loop that ties them together (Master)
api         its HTTP face; client: a typed client of it

  python -m master serve --topo campus [--sdn http://127.0.0.1:8080]
  python -m master submit JOB.yaml
"""

from .master import Master, MasterConfig

__all__ = ["Master", "MasterConfig"]
