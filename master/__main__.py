"""The Master's command line.

    python -m master serve --topo campus [--port 7070] [--sdn http://127.0.0.1:8080]
                                      [--algorithm NAME] [--seed N] [--image TAG] [--state FILE]
    python -m master submit JOB.yaml [--algorithm NAME]
    python -m master status [JOB]
    python -m master cancel JOB
    python -m master nodes

`--master URL` (or $CES_MASTER) points the client commands at a Master (default
http://127.0.0.1:7070). `--token-file FILE` (or $CES_TOKEN_FILE) holds the deployment's shared
secret: the Master requires it of its callers and sends it to the agents and the SDN app; it must
be given when the Master listens beyond loopback. `--tls DIR` (or $CES_TLS_DIR) is the control
machine's TLS identity (`python -m lab certs`): the Master serves over mutual TLS with it and
calls the agents and the SDN app with it, and the client commands show it to an https Master.
Beyond loopback the Master refuses to serve plain HTTP unless told `--insecure`. `--state FILE` keeps every job in SQLite: a
Master killed and started again on the same file takes its jobs over. Bad input — a malformed job
file, an unknown topology or scheduler, an unusable state file — is one line on stderr and exit
code 2.
"""

from __future__ import annotations

import argparse
import gc
import logging
import signal
import sys
import threading

from rich.console import Console
from rich.table import Table

from protocol.dilation import Dilation
from protocol.http import (
    ApiError,
    TokenError,
    Unreachable,
    default_token_file,
    listen_tls,
    listen_token,
    read_token,
)
from protocol.tls import TlsError, default_tls_dir, load_tls
from scheduler.jobs import JobError
from sdn_app.client import SdnClient
from topologies import TopologyError, load_topology

from .client import DEFAULT_URL, MasterClient
from .master import Master, MasterConfig
from .scheduling import UnknownAlgorithm
from .store import StateError


def _dilation(text: str) -> str:
    try:
        Dilation.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _serve(a: argparse.Namespace) -> int:
    topo = load_topology(a.topo)
    token = listen_token(a.host, a.token_file)
    tls = listen_tls(a.host, a.tls, a.insecure, "the Master")
    sdn = SdnClient(a.sdn, token=token, tls=tls) if a.sdn else None
    cfg = MasterConfig(
        algorithm=a.algorithm,
        queue=a.queue,
        seed=a.seed,
        image=a.image,
        heartbeat_timeout_s=a.heartbeat_timeout,
        max_attempts=a.max_attempts,
        adjust=a.adjust,
        spare=a.spare,
        dilation=Dilation.parse(a.dilation),
    )
    master = Master(
        topo, cfg, sdn, sdn_job_id=a.sdn_job_id, token=token, state=a.state or None, tls=tls
    ).start(a.host, a.port)
    # What was loaded to start (modules, torch, the topology, the policy: ~190k objects) is
    # never garbage. Kept out of the collector, a full collection scans only what came later:
    # measured after start-up, 66 ms → under 0.1 ms of every thread stopped, which heartbeats
    # waiting behind it would feel (experiments/bench_load.py).
    gc.freeze()
    print(f"master: {topo.name}, scheduler {cfg.algorithm}, listening on {master.url}", flush=True)
    done = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: done.set())
    done.wait()
    master.stop()
    return 0


def _client(a: argparse.Namespace) -> MasterClient:
    return MasterClient(
        a.master,
        token=read_token(a.token_file) if a.token_file else None,
        tls=load_tls(a.tls) if a.tls else None,
    )


def _submit(a: argparse.Namespace) -> int:
    for view in _client(a).submit_file(a.file, a.algorithm):
        print(f"{view['name']}: {view['state']} (scheduler {view['algorithm']})")
    return 0


def _status(a: argparse.Namespace) -> int:
    client = _client(a)
    console = Console()
    if a.job:
        view = client.job(a.job)
        console.print(f"[bold]{view['name']}[/]: {view['state']} {view['reason']}")
        for att in view["attempts"]:
            console.print(
                f"  attempt {att['number']}: {att['placement']} -> {att['outcome'] or 'running'}"
            )
            for f in att["flows"]:
                console.print(
                    f"    {f['src']}->{f['dst']} {' '.join(f['path'])} {f['rate_mbps']:.1f} Mbit/s"
                )
        for ev in view["events"]:
            console.print(f"  {ev['t']:8.1f} s  {ev['event']}")
        if view["result"]:
            console.print(f"  result: {view['result']}")
        return 0
    table = Table("job", "state", "scheduler", "accuracy", "iter", "jct s", "reason")
    for v in client.jobs():
        p = v["progress"]
        table.add_row(
            v["name"],
            v["state"],
            v["algorithm"],
            "" if p["accuracy"] is None else f"{p['accuracy']:.3f}",
            "" if p["iteration"] is None else str(p["iteration"]),
            "" if v["jct_s"] is None else f"{v['jct_s']:.1f}",
            v["reason"],
        )
    console.print(table)
    return 0


def _cancel(a: argparse.Namespace) -> int:
    view = _client(a).cancel(a.job)
    print(f"{view['name']}: {view['state']}")
    return 0


def _nodes(a: argparse.Namespace) -> int:
    table = Table(
        "node", "online", "cpu alloc/cap", "cpu used", "mem MB", "tx Mbit/s", "rx Mbit/s", "workers"
    )
    for n in _client(a).nodes():
        u = n.get("usage", {})
        table.add_row(
            n["node"],
            "cordoned" if n["cordoned"] else str(n["online"]),
            f"{n['allocated']['cpu']}/{n['capacity']['cpu']}",
            str(u.get("cpu_cores", "")),
            str(u.get("mem_mb", "")),
            str(u.get("tx_mbps", "")),
            str(u.get("rx_mbps", "")),
            " ".join(n.get("workers", [])),
        )
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m master", description="The CES Master (control plane) and its client."
    )
    secret = argparse.ArgumentParser(add_help=False)
    secret.add_argument(
        "--token-file",
        default=default_token_file(),
        help="the deployment's shared secret (default $CES_TOKEN_FILE)",
    )
    secret.add_argument(
        "--tls",
        default=default_tls_dir(),
        help="the control machine's TLS identity: cert.pem, key.pem, ca.pem ($CES_TLS_DIR)",
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the Master", parents=[secret])
    s.add_argument(
        "--insecure",
        action="store_true",
        help="serve plain HTTP beyond loopback (the token and jobs cross the network in clear)",
    )
    s.add_argument("--topo", default="campus", help="topology name or file")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=7070)
    s.add_argument("--sdn", default="", help="the SDN app's REST URL (none: tc shaping only)")
    s.add_argument("--sdn-job-id", default="ces", help="the SDN job that holds our flows")
    s.add_argument(
        "--state",
        default="",
        help="SQLite file keeping every job: a Master restarted on it takes its jobs "
        "over (default: none, jobs live in memory)",
    )
    s.add_argument(
        "--algorithm",
        default=MasterConfig.algorithm,
        help="default scheduler (a name of the scheduler registry)",
    )
    s.add_argument(
        "--queue",
        default=MasterConfig.queue,
        help="queue policy: fifo-backfill, ces-multi, sjf, edf, fifo",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--image", default="", help="worker image for jobs that name none")
    s.add_argument("--heartbeat-timeout", type=float, default=MasterConfig.heartbeat_timeout_s)
    s.add_argument("--max-attempts", type=int, default=MasterConfig.max_attempts)
    s.add_argument(
        "--no-adjust",
        dest="adjust",
        action="store_false",
        help="no runtime adjustment: enforced jobs keep their paths and rates",
    )
    s.add_argument(
        "--no-spare",
        dest="spare",
        action="store_false",
        help="rates capped at the grants: the capacity nobody is granted stays idle "
        "(default: enforced pairs share it, weighted by their grants)",
    )
    s.add_argument(
        "--dilation",
        default="",
        type=_dilation,
        help="the emulation's time dilation K@ORIGIN: the Master's clock runs K times slower, its "
        "periods and --heartbeat-timeout are emulated seconds (docs/testbed.md)",
    )
    s.set_defaults(run=_serve)
    for name, fn, helptext in (
        ("submit", _submit, "submit a job file or folder"),
        ("status", _status, "jobs, or one job in detail"),
        ("cancel", _cancel, "cancel a job"),
        ("nodes", _nodes, "the nodes as the Master sees them"),
    ):
        c = sub.add_parser(name, help=helptext, parents=[secret])
        c.add_argument("--master", default=DEFAULT_URL, help="the Master's URL")
        if name == "submit":
            c.add_argument("file")
            c.add_argument("--algorithm", default=None)
        elif name in ("status", "cancel"):
            c.add_argument("job", nargs="?" if name == "status" else None)
        c.set_defaults(run=fn)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s master %(message)s")
    try:
        return args.run(args)
    except (TopologyError, JobError, UnknownAlgorithm, TokenError, TlsError, StateError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ApiError as e:
        print(f"error: the Master refused: {e.message}", file=sys.stderr)
        return 2 if 400 <= e.status < 500 else 1
    except Unreachable as e:
        print(f"error: no Master answers ({e})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
