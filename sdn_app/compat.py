"""The Ryu API from whichever framework is running the app: os-ken (maintained) or Ryu 4.x.

The app imports every framework name from here and nothing else. Under `ryu-manager`, Ryu's
`app_manager` is already imported when our module loads, so Ryu is chosen even if os-ken is also
installed (an `OSKenApp` subclass would be invisible to Ryu's loader, and vice versa).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Callable
from typing import Any

from protocol.http import Server
from protocol.tls import Tls

if "ryu.base.app_manager" in sys.modules or importlib.util.find_spec("os_ken") is None:
    FRAMEWORK = "ryu"
else:
    FRAMEWORK = "os-ken"

if FRAMEWORK == "os-ken":
    from os_ken import cfg
    from os_ken.base import app_manager
    from os_ken.controller import ofp_event
    from os_ken.controller.handler import (
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from os_ken.lib import hub
    from os_ken.ofproto import ofproto_v1_3
    from os_ken.topology import event as topology_event

    BaseApp = app_manager.OSKenApp
    TOPOLOGY_APP = "os_ken.topology.switches"  # LLDP link discovery
else:
    from ryu import cfg  # type: ignore[no-redef]
    from ryu.base import app_manager  # type: ignore[no-redef]
    from ryu.controller import ofp_event  # type: ignore[no-redef]
    from ryu.controller.handler import (  # type: ignore
        CONFIG_DISPATCHER,
        DEAD_DISPATCHER,
        MAIN_DISPATCHER,
        set_ev_cls,
    )
    from ryu.lib import hub  # type: ignore[no-redef]
    from ryu.ofproto import ofproto_v1_3  # type: ignore[no-redef]
    from ryu.topology import event as topology_event  # type: ignore[no-redef]

    BaseApp = app_manager.RyuApp
    TOPOLOGY_APP = "ryu.topology.switches"

GREEN = hub.HUB_TYPE == "eventlet"

__all__ = [
    "CONFIG_DISPATCHER",
    "DEAD_DISPATCHER",
    "FRAMEWORK",
    "MAIN_DISPATCHER",
    "TOPOLOGY_APP",
    "BaseApp",
    "WsgiServer",
    "app_manager",
    "cfg",
    "hub",
    "lldp_enabled",
    "new_event",
    "new_lock",
    "ofp_event",
    "ofproto_v1_3",
    "set_ev_cls",
    "topology_event",
]


def lldp_enabled() -> bool:
    """Whether LLDP link discovery runs (`--observe-links`, registered by TOPOLOGY_APP)."""
    return bool(getattr(cfg.CONF, "observe_links", False))


def new_event() -> Any:
    """An event one thread waits on (with a timeout) while the app's event loop sets it.

    os-ken's native-hub `hub.Event.wait(timeout)` never times out, so native threads get a plain
    `threading.Event`; under eventlet (Ryu's default hub) a green event is needed instead.
    """
    return hub.Event() if GREEN else threading.Event()


def new_lock() -> Any:
    return hub.Semaphore(1) if GREEN else threading.Lock()


class WsgiServer:
    """A WSGI server in the framework's own threading model, stoppable with `stop()`: Ryu's
    eventlet server under eventlet, else the project's threaded one (`protocol.http.Server`),
    which alone serves TLS."""

    def __init__(self, app: Callable, host: str, port: int, tls: Tls | None = None):
        if GREEN and tls is not None:
            raise RuntimeError(
                "the REST API over TLS needs os-ken's native hub (python -m sdn_app); under "
                "eventlet keep --rest on loopback"
            )
        if GREEN:
            self._server = hub.WSGIServer((host, port), app)
            self.port = self._server.server.getsockname()[1]
            self._thread = hub.spawn(self._server.serve_forever)
        else:
            self._server = Server(app, host, port, tls).start()
            self.port = self._server.port

    def stop(self) -> None:
        if GREEN:
            hub.kill(self._thread)
            self._server.server.close()
        else:
            self._server.stop()
