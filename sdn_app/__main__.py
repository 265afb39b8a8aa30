"""Launcher: `python -m sdn_app --topo campus [--of-port 6653] [--rest 127.0.0.1:8080] ...`.

os-ken ships no `osken-manager`, so this starts the app the way `ryu-manager` does: load the apps
through `AppManager`, instantiate them, serve until SIGINT/SIGTERM. Every input is checked before
anything starts; a bad one is a one-line error and exit code 2.

With `--tls DIR` (an identity of `python -m lab certs`) the switches connect over TLS (os-ken's
ctl_privkey / ctl_cert / ca_certs: a switch must show a certificate of the lab's CA) and the REST
API serves mutual TLS; plain HTTP on a REST address beyond loopback is refused unless
`--insecure`, plain OpenFlow beyond loopback is warned about at every start.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from protocol.dilation import Dilation
from protocol.http import default_token_file, is_loopback, listen_tls, listen_token
from protocol.tls import TlsError, default_tls_dir, identity_files
from topologies import TopologyError, load_topology

from .flows import MeterPolicy
from .jobs import JobTable, StateError
from .settings import parse_address


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sdn_app", description=__doc__.split("\n")[0])
    p.add_argument("--topo", default="campus", help="topology name or file (default: campus)")
    p.add_argument("--of-port", type=int, default=6653, help="OpenFlow listen port (6653)")
    p.add_argument(
        "--of-host",
        default="0.0.0.0",
        help="OpenFlow listen address (default 0.0.0.0: physical switches connect "
        "from other hosts)",
    )
    p.add_argument("--rest", default="127.0.0.1:8080", help="REST listen HOST:PORT")
    p.add_argument(
        "--stats-interval",
        type=float,
        default=1.0,
        help="statistics polling interval in seconds (1.0)",
    )
    p.add_argument(
        "--state",
        default="",
        help="job state file: jobs survive a controller restart (default: none; the "
        "client then re-PUTs its jobs)",
    )
    p.add_argument(
        "--burst-s",
        type=float,
        default=MeterPolicy.burst_s,
        help=f"meter burst in seconds of traffic at the granted rate ({MeterPolicy.burst_s})",
    )
    p.add_argument(
        "--barrier-timeout",
        type=float,
        default=5.0,
        help="seconds to wait for a switch to confirm a change (5)",
    )
    p.add_argument(
        "--dilation",
        default="",
        help="the emulation's time dilation K@ORIGIN: meters at rate ÷ K, statistics and "
        '--stats-interval in emulated seconds (docs/testbed.md, "Time dilation")',
    )
    p.add_argument(
        "--lldp",
        action="store_true",
        help="discover links with LLDP and check them against the topology (GET /switches → lldp)",
    )
    p.add_argument(
        "--token-file",
        default=default_token_file(),
        help="the shared secret the REST API requires (default $CES_TOKEN_FILE; "
        "needed when --rest is beyond loopback)",
    )
    p.add_argument(
        "--tls",
        default=default_tls_dir(),
        help="TLS identity folder (cert.pem, key.pem, ca.pem; default $CES_TLS_DIR): OpenFlow "
        "over TLS, the REST API over mutual TLS",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve the REST API in plain HTTP beyond loopback (the token in clear)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def check(args: argparse.Namespace) -> None:
    """Raise ValueError/TopologyError/StateError/OSError for any input that cannot work."""
    topo = load_topology(args.topo)
    for name in ("stats_interval", "burst_s", "barrier_timeout"):
        if not getattr(args, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0")
    Dilation.parse(args.dilation)
    rest = parse_address(args.rest)
    listen_token(rest[0], args.token_file)
    if args.tls or not args.insecure:  # the identity loads, or plain HTTP stays on loopback
        listen_tls(rest[0], args.tls, False, "the SDN app's REST API")
    of = parse_address(f"{args.of_host}:{args.of_port}")
    if args.state:
        JobTable(topo).load(Path(args.state))
    for what, addr in (("--of-port", of), ("--rest", rest)):
        _check_free(what, addr)


def _check_free(what: str, addr: tuple[str, int]) -> None:
    family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise OSError(f"{what}: cannot listen on {addr[0]}:{addr[1]}: {e.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        check(args)
    except (TopologyError, StateError, ValueError, OSError, TlsError) as e:
        print(f"sdn_app: error: {e}", file=sys.stderr)
        return 2

    from . import app  # noqa: F401  (registers the app's options before the configuration is read)
    from .compat import TOPOLOGY_APP, app_manager, cfg

    apps = ["sdn_app.app"]
    if args.lldp:
        importlib.import_module(TOPOLOGY_APP)  # registers --observe-links
        apps += ["sdn_app.discovery", TOPOLOGY_APP]
    conf = cfg.CONF
    conf(args=[], project="ces-sdn", default_config_files=[])
    conf.set_override("ofp_tcp_listen_port", args.of_port)
    conf.set_override("ofp_listen_host", args.of_host)
    if args.tls:  # os-ken then listens on the SSL port only, a switch's certificate required
        cert, key, ca = identity_files(args.tls)
        for name, value in (
            ("ofp_ssl_listen_port", args.of_port),
            ("ctl_privkey", str(key)),
            ("ctl_cert", str(cert)),
            ("ca_certs", str(ca)),
        ):
            conf.set_override(name, value)
    elif not is_loopback(args.of_host):
        logging.getLogger("sdn_app").warning(
            "OpenFlow listens on %s:%d in PLAIN TCP: anyone on that network can act as a "
            "switch or read the flows (give --tls DIR)",
            args.of_host,
            args.of_port,
        )
    for name, value in (
        ("topo", args.topo),
        ("rest", args.rest),
        ("stats_interval", args.stats_interval),
        ("state", args.state),
        ("burst_s", args.burst_s),
        ("barrier_timeout", args.barrier_timeout),
        ("token_file", args.token_file),
        ("tls", args.tls),
        ("insecure", args.insecure),
        ("dilation", args.dilation),
    ):
        conf.set_override(name, value, group="ces_sdn")
    if args.lldp:
        conf.set_override("observe_links", True)
        conf.set_override("install_lldp_flow", False)  # our resync installs it (after its wipe)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    manager = app_manager.AppManager.get_instance()
    try:
        manager.load_apps(apps)
        manager.instantiate_apps(**manager.create_contexts())
        while not stop.wait(3600):
            pass
    except Exception as e:
        logging.getLogger("sdn_app").exception("controller failed")
        print(f"sdn_app: error: {e}", file=sys.stderr)
        _exit(1)
    _exit(0)
    return 0


def _exit(code: int) -> None:
    """Exit now, without `AppManager.close()`: os-ken's native-hub threads (switch connections,
    the OpenFlow listener) cannot be stopped from outside, and closing its LLDP app deadlocks
    (it joins threads that wait on a `hub.Event` whose timeout never fires on the native hub).
    The state file is written after every change, so nothing is lost; the switches keep their
    entries (fail-mode secure) until the next controller resynchronises them."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
