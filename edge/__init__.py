"""The edge agent: one per compute node, on an emulated node or a real edge host.

    python -m edge --node lab1 --master http://MASTER:7070 [--iface eth0] ...

  messenger  registration, heartbeats, the Master's command channel (Messenger)
  compute    worker containers on the local Docker engine (Compute Manager)
  network    per-destination shaping of the node's flows, resource sensing (Network Manager)
  agent      the agent as a whole: configuration, start, leave
  tc, cgroups, workers   the host parts: HTB classes, cgroup limits, worker containers

It imports only the standard library, docker-py and `protocol`: an edge host needs nothing of
the scheduler or the emulation.
"""
