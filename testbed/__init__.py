"""The emulation testbed: OVS switches, Docker containers as compute nodes, shaped links.

from testbed import Emulation
with Emulation(load_topology("campus"), controller=None) as net:
    net.ping_all()
"""

from .cleanup import cleanup, leftovers
from .containernet import Containernet, Docker, detect_datapath
from .emulation import Emulation, EmulationError
from .names import new_prefix

__all__ = [
    "Containernet",
    "Docker",
    "Emulation",
    "EmulationError",
    "cleanup",
    "detect_datapath",
    "leftovers",
    "new_prefix",
]
