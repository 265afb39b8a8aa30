#!/usr/bin/env python3
"""The end-to-end comparison of schedulers on the emulated network, or on real hosts.

    sudo python experiments/run.py --topo campus                 # the default scenario
    sudo python experiments/run.py --quick                       # a small one (CI)
    sudo python experiments/run.py --schedulers ces-ppo,k8s-spread --seeds 3 --out results/e2e
    sudo python experiments/run.py --jobs workloads/jobs/ring-cnn.yaml
    sudo python experiments/run.py --cleanup [--prefix cesXXXX]  # remove what a killed run left
    python experiments/run.py --quick --hosts lab.yaml --topo lab-topo.yaml --token-file F \\
        --pki DIR
    python experiments/run.py --cleanup --hosts lab.yaml --topo lab-topo.yaml --prefix cesXXXX
    python experiments/run.py --quick --cluster cluster.yaml --token-file F --pki DIR
    python experiments/run.py --cleanup --cluster cluster.yaml --prefix cesXXXX

Once: build the testbed (`testbed.Emulation`, switches connected to the SDN app), start the SDN
app, the Master and one edge agent per compute node (real processes), and the scenario's
background traffic. With `--hosts` (docs/lab.md) there is no emulation: the hosts of the
inventory are checked over SSH, the SDN app waits for the lab's switches (configured to connect
to the inventory's `master` address and `openflow_port`), the Master listens there with the
shared secret (--token-file, default $CES_TOKEN_FILE; required) and the lab's certificates
(--pki, default $CES_PKI_DIR; mutual TLS, OpenFlow over TLS; or --insecure), and one agent per
host is deployed over SSH (`lab.deploy`); the background traffic runs in containers on the hosts.
With `--cluster` (docs/cluster.md) the emulated topology is spread over the cluster file's hosts
(`lab.fabric`: bridges, node containers and shaped links on each, tunnels between them), its
budget counting each machine's cores and the capacity crossing hosts, with the SDN app, the
Master, token and certificates as with `--hosts` and one agent per node on its host. Then
per scheduler and seed: submit the scenario's jobs to the Master, follow
them live (jobs, accuracy, link utilisation), collect what the workers measured, and wait until
the testbed is idle again. Finally tear everything down and write DIR/results.json,
DIR/results.csv, DIR/summary.md and the PNG figures (each re-made by experiments/plots.py from
the JSON). Logs of every process are in DIR/logs/, the workers' metric lines in DIR/agents/.

Exit codes: 0 done, 1 the testbed failed, 2 bad input (topology, jobs, scenario, schedulers,
inventory, token, a host refused; nothing is left), 130 interrupted (torn down).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # python experiments/X.py
    import _venv  # noqa: F401  (re-exec under .venv, the repository on sys.path)

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from docker.errors import DockerException
from rich.console import Console

from experiments import plots, report
from experiments.e2e.budget import budget, chosen_dilation
from experiments.e2e.cluster_stack import (
    ClusterStack,
    cleanup_cluster,
    cluster_dilation,
    cluster_results,
)
from experiments.e2e.display import Display, fmt
from experiments.e2e.fidelity import HOST_SATURATED, verdict
from experiments.e2e.lab_stack import HostsRefused, LabStack
from experiments.e2e.rows import job_row, mark_shared_pairs
from experiments.e2e.scenario import (
    Plan,
    Scenario,
    ScenarioError,
    load_scenario,
    plan,
    scenario_path,
    tenant_path,
    traffic_quota,
)
from experiments.e2e.stack import RunError, Stack, StackBase, usage
from experiments.machine import QUIET_S, HostBusy, cpu_stall_us, machine, wait_quiet
from lab import deploy
from lab.cluster import Layout, load_cluster
from lab.fabric import check_cluster
from lab.inventory import Inventory, InventoryError, load_inventory
from lab.pki import PKI_ENV, check_lab, unusable
from master.client import MasterClient
from master.manager import TERMINAL
from master.scheduling import QUEUES
from protocol.dilation import Dilation
from protocol.http import ApiError, TokenError, Unreachable, default_token_file, read_token
from scheduler.jobs import JobError
from scheduler.multi import default_algorithm
from sdn_app.client import SdnError
from testbed import EmulationError, cleanup, hostcost, image
from testbed.image import worker_image_tag
from testbed.names import check_prefix, new_prefix
from topologies import TopologyError, load_topology

log = logging.getLogger("run")
RERUNS = 2  # an unfaithful run is run again at most this many times


def run_once(
    stack: StackBase,
    scenario: Scenario,
    scheduler: str,
    seed: int,
    index: int,
    title: str,
    display: Display,
) -> dict:
    """Submit the scenario's jobs under `scheduler`/`seed`, follow them, collect the results.
    Every time is on the run's emulated clock (`stack.dilation`); `wall_s` is the host's."""
    master, clock = stack.master, stack.dilation
    if scheduler in QUEUES:  # a queue policy (CES-Multi, ...) over its default single-job one
        master.set_scheduler(default_algorithm(), seed, queue=scheduler)
    else:
        master.set_scheduler(scheduler, seed)
    pending = sorted(scenario.jobs, key=lambda d: d.job.submit_time)
    traffic = {i: b for i, b in enumerate(scenario.background) if b.start_s is not None}
    started: dict[str, float] = {}  # background flow -> when it started (epoch s)
    pinned: dict[str, dict] = {}  # background flow along a job -> the path and link it took
    names: dict[str, str] = {}  # submitted name -> base name
    samples: dict[str, Any] = {"t": [], "links": {}}
    before = stack.counters()
    host_busy = HostBusy().__enter__()
    t0, started_at, stall0 = clock.monotonic(), clock.time(), cpu_stall_us()
    host_t0 = time.monotonic()
    deadline = t0 + scenario.timeout_s
    next_links = 0.0
    views: list[dict] = []
    while True:
        now = clock.monotonic()
        for i, b in list(traffic.items()):  # another tenant's transfer starts mid-run
            if b.start_s > now - t0:
                continue
            if b.along is not None:
                job = next((v for v in views if names[v["name"]] == b.along), None)
                if job is None or job["state"] in ("queued", "scheduled") or not job["attempts"]:
                    continue  # not placed yet: the tenant follows it when it is
                crossing = (
                    tenant_path(stack.topo, b, job["attempts"][-1]["flows"])
                    if job["state"] == "running"
                    else None
                )
                if crossing is None:
                    del traffic[i]
                    log.warning(
                        "background %s not started: job %s %s",
                        b.label(),
                        b.along,
                        "crosses no switch-to-switch link the tenant can reach"
                        if job["state"] == "running"
                        else f"is {job['state']}",
                    )
                    continue
                stack.pin_traffic(i, b, crossing[0])
                pinned[b.label()] = {"path": crossing[0], "link": list(crossing[1])}
            stack.start_traffic(i, b, wait=False)
            started[b.label()] = clock.time()
            del traffic[i]
        while pending and pending[0].job.submit_time <= now - t0:
            doc = pending.pop(0)
            name = f"{doc.job.name}.r{index}"  # unique per run: worker containers are named by it
            names[name] = doc.job.name
            master.submit({**doc.mapping, "name": name}, source=doc.source)
        views = [v for v in master.jobs() if v["name"] in names]
        if now >= next_links:
            next_links = now + 2.0
            links = master.links()
            samples["t"].append(round(now - t0, 2))
            for lk in links:
                samples["links"].setdefault(f"{lk['src']}>{lk['dst']}", []).append(
                    lk["measured_mbps"]
                )
            display.update(title, now - t0, views, links)
        if not pending and views and all(v["state"] in TERMINAL for v in views):
            break
        if now > deadline:
            break
        stack._check_alive()
        clock.sleep(1.0)
    timed_out = set()
    for v in views:
        if v["state"] not in TERMINAL:
            timed_out.add(v["name"])
            try:
                master.cancel(v["name"])
            except ApiError as e:
                log.warning("cancel %s: %s", v["name"], e.message)
    rows = [
        job_row(scheduler, seed, names[n], master.job(n, records=True), n in timed_out)
        for n in names
    ]
    mark_shared_pairs(rows)
    wall, emulated = time.monotonic() - host_t0, clock.monotonic() - t0
    stall1 = cpu_stall_us()
    after = stack.counters()
    host_busy.__exit__()
    for i, b in enumerate(scenario.background):
        if b.start_s is not None:
            stack.stop_traffic(i)
        if b.label() in pinned:
            stack.unpin_traffic(i)
    _wait_idle(master, clock.host_seconds(120.0))
    capacity = {f"{lk['src']}>{lk['dst']}": lk["capacity_mbps"] for lk in master.links()}
    busy = {k: v for k, v in samples["links"].items() if max((x or 0) for x in v) >= 1.0}
    stalled = None if stall0 is None or stall1 is None else round((stall1 - stall0) / 1e6 / wall, 3)
    return {
        "scheduler": scheduler,
        "seed": seed,
        "wall_s": round(wall, 2),
        "emulated_s": round(emulated, 2),
        "jobs": rows,
        "cpu_stalled_share": stalled,
        **usage(before, after),
        "host_busy": host_busy.summary(HOST_SATURATED),
        "started_at": started_at,
        "background_started_at": started,
        "background_paths": pinned,
        "links": {"t": samples["t"], "mbps": busy, "capacity_mbps": {k: capacity[k] for k in busy}},
    }


def _wait_idle(master: MasterClient, timeout_s: float = 120.0) -> None:
    """Until no node runs a worker or holds an allocation (the next run starts clean)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        nodes = master.nodes()
        if all(not n.get("workers") and n["allocated"]["cpu"] == 0 for n in nodes):
            return
        time.sleep(0.5)
    raise RunError(
        "the testbed did not become idle after a run: "
        f"{[n['node'] for n in master.nodes() if n.get('workers')]} still run workers"
    )


# --- main --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--topo", help="topology name or file (default: the scenario's, campus)")
    p.add_argument(
        "--schedulers",
        help="comma-separated single-job algorithms or queue "
        "policies (ces-multi, ...) (default: the scenario's)",
    )
    p.add_argument("--jobs", help="a job YAML file or folder instead of the scenario's jobs")
    p.add_argument("--seeds", type=int, help="runs per scheduler, seeds 0..N-1")
    p.add_argument(
        "--background-seed",
        type=int,
        help="the seed of the scenario's background_load draw (default: the scenario's)",
    )
    p.add_argument("--quick", action="store_true", help="the small scenario (a few minutes)")
    p.add_argument("--scenario", help="a scenario YAML (default: scenarios/contention.yaml)")
    p.add_argument(
        "--out",
        help="results folder (default: a new results/runs/SCENARIO-TOPO-TIME;"
        " results/e2e/... holds the committed ones)",
    )
    p.add_argument(
        "--cleanup",
        action="store_true",
        help="remove what killed runs left (all runs, or --prefix; with --hosts, "
        "the run --prefix on every host)",
    )
    p.add_argument("--prefix", help="run prefix: 'ces' + 4 hex digits")
    p.add_argument(
        "--dilation",
        default="auto",
        type=_dilation_arg,
        help="time dilation K >= 1 of the emulation, or 'auto' (default): the least K at which "
        'the scenario\'s CPU budget fits this host (docs/testbed.md, "Time dilation")',
    )
    p.add_argument(
        "--over-budget",
        action="store_true",
        help="run at a --dilation below what the budget needs (its runs will say they were "
        "not faithful) instead of refusing",
    )
    p.add_argument(
        "--reruns",
        type=int,
        default=RERUNS,
        help=f"times an unfaithful run is run again (default {RERUNS})",
    )
    p.add_argument(
        "--hosts",
        help="an inventory (docs/lab.md): run on its real hosts and "
        "OpenFlow switches instead of the emulation",
    )
    p.add_argument(
        "--cluster",
        help="a cluster file (docs/cluster.md): the emulated topology spread over its hosts, "
        "linked by tunnels",
    )
    p.add_argument(
        "--token-file",
        default=default_token_file(),
        help="with --hosts/--cluster: the shared secret of the Master and the agents "
        "(default $CES_TOKEN_FILE)",
    )
    p.add_argument(
        "--pki",
        default=os.environ.get(PKI_ENV, ""),
        help="with --hosts/--cluster: the lab's certificates (python -m lab certs; default "
        f"${PKI_ENV}): mutual TLS between the Master, the agents and run.py, OpenFlow over TLS",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="with --hosts/--cluster and no --pki: plain HTTP and OpenFlow (the token and jobs "
        "in clear)",
    )
    p.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="with --hosts/--cluster: add unknown host keys to known_hosts (a changed key is "
        "always refused)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    console = Console()
    if args.prefix:
        try:
            check_prefix(args.prefix)
        except ValueError as e:
            build_parser().error(str(e))  # exit code 2
    if args.hosts and args.cluster:
        build_parser().error("--hosts and --cluster: give one")
    if args.cluster:
        return cluster_main(args, console)
    if args.hosts:
        return hosts_main(args, console)
    if os.geteuid() != 0:
        print(
            "error: run as root (sudo): the testbed creates bridges, veths and containers",
            file=sys.stderr,
        )
        return 2
    if args.cleanup:
        removed = cleanup(args.prefix)
        print(f"cleanup{f' of {args.prefix}' if args.prefix else ''}: removed {removed.summary()}")
        return 0
    try:
        p = plan(args)
    except (ScenarioError, TopologyError, JobError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in p.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    try:
        # the worker image of the code as it is (a no-op unless workloads/, protocol/ or edge/
        # changed since it was built: then ~10 s)
        image.ensure()
        dilation, chosen = choose_dilation(p, args.dilation, args.over_budget, console)
    except ScenarioError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except image.ImageError as e:
        print(f"error: the worker image: {e}", file=sys.stderr)
        return 1
    except DockerException as e:  # no engine: `make setup` (scripts/setup.sh) starts it
        print(
            f"error: the Docker engine is not reachable ({e}); `make setup` starts it",
            file=sys.stderr,
        )
        return 1
    except EmulationError as e:
        print(f"error: measuring this host's forwarding cost: {e}", file=sys.stderr)
        return 1
    prefix = args.prefix or new_prefix()
    return execute(
        p,
        prefix,
        console,
        lambda: Stack(p.topo, prefix, p.out, console, dilation),
        chosen,
        max(args.reruns, 0),
    )


def choose_dilation(
    p: Plan, asked: float | None, over_budget: bool, console: Console
) -> tuple[Dilation, dict]:
    """The run's time dilation: `asked` (a number), or the least K at which the scenario's CPU
    budget (`budget.budget`) fits this host when None ("auto"); and what results.json records of
    the choice. A ScenarioError (one line) when no K fits, or when `asked` is below what the
    budget needs and not `over_budget`."""
    cost = hostcost.ensure(worker_image_tag(), log=lambda m: console.print(f"[bold]budget[/] {m}"))
    jobs = [d.job for d in p.scenario.jobs]
    cordoned = {v for b in p.scenario.background if b.cordon for v in (b.src, b.dst)}
    need = budget(
        p.topo,
        [t.demand.cpu for job in jobs for t in job.tasks],
        [traffic_quota(p.topo.node(v))[0] for b in p.scenario.background for v in (b.src, b.dst)],
        [f.demand_mbps for job in jobs for f in job.flows]
        + [b.mbps for b in p.scenario.background],
        {n.name for n in p.topo.nodes} - cordoned,
        cost,
    )
    unfit = f"{p.scenario.source}: does not fit this host even at dilation K_MAX"
    return chosen_dilation(need, cost, asked, over_budget, console, "this host", unfit)


def _dilation_arg(text: str) -> float | None:
    """`--dilation`: 'auto' (None) or a number >= 1."""
    if text == "auto":
        return None
    try:
        return Dilation(float(text)).factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or a number >= 1, got {text!r}"
        ) from None


def hosts_main(args: argparse.Namespace, console: Console) -> int:
    """`--hosts`: every input checked (scenario, inventory against its topology, token) before
    anything is created, then the run on the hosts; or `--cleanup` of a run on every host."""
    try:
        if args.cleanup:
            if not args.prefix:
                raise ValueError(
                    "--cleanup --hosts: give the run's --prefix (run.py printed it at bring-up)"
                )
            topo = args.topo or load_scenario(scenario_path(args)).topology
            inv = load_inventory(args.hosts, load_topology(topo))  # the hosts it names
            return cleanup_hosts(inv, args.prefix, args.accept_new_host_keys)
        if not args.token_file:
            raise ValueError(
                "--hosts: the Master and the agents need the shared secret: give "
                "--token-file or set $CES_TOKEN_FILE (docs/lab.md)"
            )
        token = read_token(args.token_file)
        if not args.pki and not args.insecure:
            raise ValueError(
                f"--hosts: give --pki DIR (or ${PKI_ENV}; python -m lab certs makes it) or "
                "--insecure (the token and jobs would cross the network in clear)"
            )
        p = plan(args)
        pki = Path(args.pki).expanduser() if args.pki else None
        if pki is not None:
            bad = unusable(check_lab(pki, p.inventory, p.topo)[1])
            if bad:
                raise ValueError(bad[0])
    except (ScenarioError, TopologyError, JobError, InventoryError, TokenError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in p.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    prefix = args.prefix or new_prefix()
    return execute(
        p,
        prefix,
        console,
        lambda: LabStack(
            p.topo,
            prefix,
            p.out,
            console,
            p.inventory,
            args.token_file,
            token,
            worker_image_tag(),
            args.accept_new_host_keys,
            pki=pki,
        ),
    )


def cluster_main(args: argparse.Namespace, console: Console) -> int:
    """`--cluster`: every input checked (scenario, cluster file against the topology, token,
    certificates), then every host (one line each, exit 2), the budget of each machine and of
    the capacity crossing hosts, then the run over the hosts; or `--cleanup` of a run on every
    host."""
    try:
        if args.cleanup:
            if not args.prefix:
                raise ValueError(
                    "--cleanup --cluster: give the run's --prefix (run.py printed it at bring-up)"
                )
            return cleanup_cluster(
                load_cluster(args.cluster), args.prefix, args.accept_new_host_keys
            )
        if not args.token_file:
            raise ValueError(
                "--cluster: the Master and the agents need the shared secret: give "
                "--token-file or set $CES_TOKEN_FILE (docs/cluster.md)"
            )
        token = read_token(args.token_file)
        if not args.pki and not args.insecure:
            raise ValueError(
                f"--cluster: give --pki DIR (or ${PKI_ENV}; python -m lab certs --cluster makes "
                "it) or --insecure (the token and jobs would cross the network in clear)"
            )
        p = plan(args)
        layout = Layout.make(load_cluster(args.cluster), p.topo)
        pki = Path(args.pki).expanduser() if args.pki else None
        if pki is not None:
            bad = unusable(check_lab(pki, layout, p.topo)[1])
            if bad:
                raise ValueError(bad[0])
    except (ScenarioError, TopologyError, JobError, InventoryError, TokenError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in p.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    facts, errors = check_cluster(layout, args.accept_new_host_keys)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if errors:
        return 2
    try:
        tag = image.ensure()  # copied to the hosts that lack it
        dilation, chosen = cluster_dilation(
            p, layout, facts, args.dilation, args.over_budget, console
        )
    except ScenarioError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (image.ImageError, EmulationError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    prefix = args.prefix or new_prefix()
    return execute(
        p,
        prefix,
        console,
        lambda: ClusterStack(
            p.topo,
            prefix,
            p.out,
            console,
            layout,
            facts,
            args.token_file,
            token,
            tag,
            dilation,
            pki,
            args.accept_new_host_keys,
        ),
        chosen,
        max(args.reruns, 0),
        {"mode": "cluster", "cluster": cluster_results(layout, facts)},
    )


def cleanup_hosts(inv: Inventory, prefix: str, accept_new: bool) -> int:
    """What run `prefix` left on this machine (its SDN app and Master survive run.py's kill -9:
    sessions of their own) and on every host of `inv`."""
    removed = cleanup(prefix)
    print(f"cleanup of {prefix} here: removed {removed.summary()}")
    done, errors = deploy.each_host(inv, accept_new, lambda r: deploy.cleanup(r, prefix))
    for node, names in done.items():
        print(f"{inv.host(node).label()}: removed {len(names)} containers")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 2 if errors else 0


def execute(
    p: Plan,
    prefix: str,
    console: Console,
    make_stack: Callable[[], StackBase],
    dilation: dict | None = None,
    reruns: int = 0,
    extra: dict | None = None,
) -> int:
    """Bring the stack up, run every scheduler and seed (an unfaithful run again, up to `reruns`
    times: `fidelity.verdict`), tear down, write the results. `dilation`: the choice
    `choose_dilation` made, recorded; `extra`: more of results.json (a cluster's mode and
    hosts)."""
    p.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "version": 1,
        "scenario": {
            "name": p.scenario.name,
            "source": p.scenario.source,
            "description": p.scenario.description,
            "jobs": [d.mapping for d in p.scenario.jobs],
            "timeout_s": p.scenario.timeout_s,
            "link_scale": p.scenario.link_scale,
            "background_load": p.scenario.background_load and p.scenario.background_load._asdict(),
        },
        "topology": p.topo.name,
        "schedulers": p.schedulers,
        "seeds": p.seeds,
        "mode": "hosts" if p.inventory else "emulation",
        **({"inventory": str(p.inventory.path)} if p.inventory else {}),
        "machine": machine(),
        **({"dilation": dilation} if dilation else {}),
        "started_at": time.time(),
        "runs": [],
        **(extra or {}),
    }
    t0 = time.monotonic()
    total = len(p.schedulers) * p.seeds
    try:
        with make_stack() as stack:
            stack.prepare_background(p.scenario.background)
            for i, b in enumerate(p.scenario.background):
                if b.start_s is None:  # the whole session long
                    stack.start_traffic(i, b)
            results["background"] = [
                {**asdict(b), "path": list(b.path)} for b in p.scenario.background
            ]
            results["bringup_s"] = round(stack.timings["up_s"], 2)
            if "network_s" in stack.timings:  # a cluster: its network built and forwarding
                results["network_s"] = round(stack.timings["network_s"], 2)
            if "deploy_s" in stack.timings:  # hosts: the agents deployed over SSH
                results["deploy_s"] = round(stack.timings["deploy_s"], 2)
            with Display(console, total) as display:
                for i, (scheduler, seed) in enumerate(run_order(p.schedulers, p.seeds)):
                    for attempt in range(1, reruns + 2):
                        title = f"run {i + 1}/{total}: {scheduler}, seed {seed}" + (
                            f" (attempt {attempt})" if attempt > 1 else ""
                        )
                        console.print(f"[bold]{title}[/]")
                        # the emulation's host (a cluster's too: it emulates its share); real
                        # hosts' cores are theirs, this machine only runs the control plane
                        before = wait_quiet() if results["mode"] != "hosts" else None
                        if before and not before["quiet"]:
                            console.print(
                                "  [yellow]the host stayed busy[/] "
                                f"({max(before['busy'][-QUIET_S:]):.0%}"
                                f" of its cores) for {before['waited_s']:.0f} s: running anyway"
                            )
                        index = len(results["runs"])  # names the run's jobs: unique per run
                        run = run_once(stack, p.scenario, scheduler, seed, index, title, display)
                        if before:
                            run["host_before"] = before
                        run["attempt"], run["fidelity"] = attempt, verdict(run)
                        results["runs"].append(run)
                        for row in run["jobs"]:
                            console.print(
                                f"  {row['job']}: {row['state']}, tta "
                                f"{fmt(row['tta_s'])} s, accuracy "
                                f"{fmt(row['final_accuracy'])}, on "
                                f"{' '.join(sorted(row['placement'].values()))} "
                                f"({row['network']})"
                            )
                        _write(p.out, results, t0)
                        if run["fidelity"]["faithful"]:
                            break
                        console.print(
                            "  [yellow]not faithful:[/] "
                            + "; ".join(run["fidelity"]["reasons"])
                            + ("; running it again" if attempt <= reruns else "")
                        )
                    display.run_done(i + 1)
        results["teardown_s"] = round(stack.timings["down_s"], 2)
        if "teardown_fabric_s" in stack.timings:
            results["teardown_network_s"] = round(stack.timings["teardown_fabric_s"], 2)
    except HostsRefused as e:
        for error in e.errors:
            print(f"error: {error}", file=sys.stderr)
        return 2
    except (RunError, EmulationError, DockerException, ApiError, Unreachable, SdnError) as e:
        print(f"error: {e}", file=sys.stderr)
        _write(p.out, results, t0)
        return 1
    except KeyboardInterrupt:
        print("interrupted: torn down", file=sys.stderr)
        _write(p.out, results, t0)
        return 130
    results["comparisons"] = report.comparisons_json(results, p.scenario.timeout_s)
    _write(p.out, results, t0)
    figures = plots.make_all(results, p.out)
    report.write(results, p.out)
    console.print(
        f"[bold]done[/] in {results['wall_s']:.0f} s: {p.out}/results.json, "
        f"results.csv, summary.md, {', '.join(f.name for f in figures)}"
    )
    return 0


def run_order(schedulers: list[str], seeds: int) -> list[tuple[str, int]]:
    """Every (scheduler, seed), seed by seed, each seed's schedulers in the order of the last
    rotated by one: the runs a comparison pairs come minutes apart rather than a set's length
    apart, and what the host does early in a set or drifts through weighs on every scheduler,
    not on the seeds of the one that ran first. On the ring, in a set made scheduler by
    scheduler (git history of results/e2e/contention-ring), the 4 unfaithful runs were its
    first 4, all CES-PPO's, the host's other load highest in the first two."""
    n = len(schedulers)
    return [(schedulers[(seed + k) % n], seed) for seed in range(seeds) for k in range(n)]


def _write(out: Path, results: dict, t0: float) -> None:
    results["wall_s"] = round(time.monotonic() - t0, 2)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out / "results.json")


if __name__ == "__main__":
    sys.exit(main())
