"""Deploy CES's edge agents to the real hosts of an inventory.

    python -m lab certs   --hosts lab.yaml --topo lab-topo.yaml --pki DIR [--days 365]
    python -m lab certs   --cluster cluster.yaml --topo T --pki DIR   # a cluster (docs/cluster.md)
    python -m lab check   --hosts lab.yaml --topo lab-topo.yaml [--pki DIR] [--accept-new-host-keys]
    python -m lab install --hosts lab.yaml --topo lab-topo.yaml [--force-copy]
    python -m lab start   --hosts lab.yaml --topo lab-topo.yaml --master URL --token-file F \\
                          --pki DIR [--prefix cesXXXX]
    python -m lab stop    --hosts lab.yaml --topo lab-topo.yaml --prefix cesXXXX
    python -m lab cleanup --hosts lab.yaml --topo lab-topo.yaml --prefix cesXXXX

`certs` makes the lab's CA and a TLS identity for the control machine, every host's agent and every
switch (`lab.pki`), keeping those still good; `check` connects to every host and checks its Docker
engine, data interface and address, clock and capacity against the topology, and with `--pki` the
certificates' expiry and names; `install` copies the worker image (which holds the agent) to
hosts that lack it; `start` checks, installs and starts one agent per host with its identity
(mutual TLS with the Master at URL, an https URL; without `--pki` only with `--insecure`); `stop` stops them (they stop their workers); `cleanup` removes every container of
the run on every host. `experiments/run.py --hosts` does all of this around a scenario.

A problem with the inventory or a host is one line naming the host and the problem, exit code 2;
`start` then removes what it started on every host.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import docker
import docker.errors

from protocol.http import TokenError, default_token_file, read_token
from protocol.tls import CONTROL, agent_identity
from testbed.image import worker_image_tag
from testbed.names import check_prefix, new_prefix
from topologies import TopologyError, load_topology

from .cluster import Layout, load_cluster
from .deploy import check_hosts, cleanup, deploy_agents, each_host, install, stop_agent
from .inventory import InventoryError, load_inventory
from .pki import LEAF_DAYS, PKI_ENV, PkiError, check_lab, make_lab, unusable
from .ssh import HostError


def _report(errors: list[HostError]) -> int:
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 2 if errors else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__.split("\n")[0])
    p.add_argument("action", choices=["certs", "check", "install", "start", "stop", "cleanup"])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="the inventory (YAML)")
    where.add_argument(
        "--cluster",
        help="certs: a cluster file (docs/cluster.md) instead of an inventory; run.py --cluster "
        "checks, starts and cleans its hosts",
    )
    p.add_argument("--topo", required=True, help="the topology the hosts are nodes of")
    p.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="add unknown host keys to known_hosts (a changed key is always refused)",
    )
    p.add_argument("--force-copy", action="store_true", help="copy the image even if present")
    p.add_argument("--master", default="", help="start: the Master's URL the agents register at")
    p.add_argument(
        "--token-file",
        default=default_token_file(),
        help="start: the deployment's shared secret (default $CES_TOKEN_FILE)",
    )
    p.add_argument("--prefix", default="", help="the run's prefix (start: default a new one)")
    p.add_argument(
        "--pki",
        default=os.environ.get(PKI_ENV, ""),
        help=f"the lab's certificates (made by `certs`; default ${PKI_ENV})",
    )
    p.add_argument("--days", type=int, default=LEAF_DAYS, help="certs: validity of new ones")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="start: agents in plain HTTP (the token and jobs cross the network in clear)",
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s lab %(message)s")
    try:
        topo = load_topology(a.topo)
        if a.cluster:
            if a.action != "certs":
                raise ValueError(
                    f"{a.action} --cluster: only certs (experiments/run.py --cluster checks, "
                    "starts and cleans the cluster's hosts)"
                )
            if not a.pki:
                raise ValueError(f"certs: give --pki DIR (or ${PKI_ENV}): where they are kept")
            pki = Path(a.pki).expanduser()
            done = make_lab(pki, Layout.make(load_cluster(a.cluster), topo), topo, a.days)
            for identity, what in done.items():
                print(f"{pki / identity}: {what}")
            return 0
        inv = load_inventory(a.hosts, topo)
        prefix = check_prefix(a.prefix) if a.prefix else ""
        if a.action in ("stop", "cleanup") and not prefix:
            raise ValueError(f"{a.action}: give the run's --prefix")
        pki = Path(a.pki).expanduser() if a.pki else None
        if a.action == "certs":
            if pki is None:
                raise ValueError(f"certs: give --pki DIR (or ${PKI_ENV}): where they are kept")
            if a.days < 1:
                raise ValueError(f"--days: expected at least 1, got {a.days}")
        if a.action == "start":
            if not a.master or not a.token_file:
                raise ValueError("start: give --master URL and --token-file (or $CES_TOKEN_FILE)")
            token = read_token(a.token_file)
            if pki is None and not a.insecure:
                raise ValueError(
                    f"start: give --pki DIR (or ${PKI_ENV}; python -m lab certs makes it) or "
                    "--insecure (the token and jobs would cross the network in clear)"
                )
            if pki is not None and not a.master.startswith("https://"):
                raise ValueError(f"start: --master {a.master}: with --pki, an https:// URL")
            if pki is not None:
                _, problems = check_lab(pki, inv, topo)
                bad = unusable(problems)
                if bad:
                    raise ValueError(f"start: {bad[0]}")
    except (TopologyError, InventoryError, TokenError, PkiError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    if a.action == "certs":
        try:
            done = make_lab(pki, inv, topo, a.days)
        except (PkiError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for identity, what in done.items():
            print(f"{pki / identity}: {what}")
        return 0
    if a.action == "check":
        facts, errors = check_hosts(inv, topo, a.accept_new_host_keys)
        good, problems = check_lab(pki, inv, topo) if pki else ({}, [])
        for node, f in facts.items():
            cert = good.get(agent_identity(node))
            print(
                f"{inv.host(node).label()}: ok (docker {f.docker}, {f.cpu:g} CPUs, "
                f"{f.mem_mb:.0f} MB, clock {f.clock_offset_s * 1000:+.0f} ms"
                + (f", certificate until {cert}" if cert else "")
                + ")"
            )
        if CONTROL in good:
            print(f"control ({inv.master}): certificate until {good[CONTROL]}")
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return max(_report(errors), 2 if problems else 0)
    if a.action in ("stop", "cleanup"):
        fn = (
            (lambda r: stop_agent(r, prefix, r.host.node))
            if a.action == "stop"
            else (lambda r: cleanup(r, prefix))
        )
        done, errors = each_host(inv, a.accept_new_host_keys, fn)
        for node, names in done.items():
            print(
                f"{inv.host(node).label()}: {a.action} done"
                + (f" ({len(names)} containers removed)" if isinstance(names, list) else "")
            )
        return _report(errors)
    try:
        client, tag = docker.from_env(), worker_image_tag()
        client.images.get(tag)
    except docker.errors.DockerException as e:
        print(
            f"error: the worker image {worker_image_tag()} is not on this machine ({e}); "
            f"run `python -m testbed.image ensure`",
            file=sys.stderr,
        )
        return 2
    if a.action == "install":
        copied, errors = each_host(
            inv, a.accept_new_host_keys, lambda r: install(r, client, tag, a.force_copy)
        )
        for node, n in copied.items():
            print(
                f"{inv.host(node).label()}: {tag} "
                + (f"copied ({n / 2**20:.0f} MB)" if n else "already there")
            )
        print(f"{time.monotonic() - t0:.1f} s")
        return _report(errors)
    prefix = prefix or new_prefix()
    names, errors = deploy_agents(
        inv, topo, a.accept_new_host_keys, client, tag, prefix, a.master, token, pki=pki
    )
    if errors:
        return _report(errors)
    for node, name in names.items():
        print(f"{inv.host(node).label()}: agent {name}")
    print(
        f"run prefix {prefix}; {time.monotonic() - t0:.1f} s "
        f"(stop: python -m lab stop --hosts {a.hosts} --topo {a.topo} --prefix {prefix})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
