"""The emulation testbed: OVS switches, Docker containers as compute nodes, shaped links.

    from testbed import Emulation
    with Emulation(load_topology("campus"), controller=None) as net:
        net.ping_all()
"""
from .cleanup import cleanup, leftovers
from .emulation import Emulation, EmulationError, detect_datapath
from .names import new_prefix
from .node import DockerNode

__all__ = ["DockerNode", "Emulation", "EmulationError", "cleanup", "detect_datapath",
           "leftovers", "new_prefix"]
