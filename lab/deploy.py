"""Deploying CES's edge agents to real hosts over SSH: check, install, start, stop, clean up.

Each host runs its agent in a container of the worker image (which carries `edge/`), so a host
needs only a Docker engine and sshd. The agent container shares the host's network namespace
(`--network host`; when the "host" is itself a container on the engine it talks to, that
container's namespace) and PID namespace (tc runs there), and drives the host's engine through
its socket; its workers join the same namespace, and so do the tools a run starts there
(`start_tool`: a scenario's background traffic). Everything a run creates on a host — the agent,
its workers, its tools — is a container named `<prefix>-...`, which is what `cleanup` removes.

The shared secret and the agent's TLS identity (`lab.pki`: its certificate, its private key and
the lab's CA) reach the agent as files copied into its container before it starts (a tar stream
over SSH to `docker cp -`, the key 0600): never on a command line nor on the host's disk.
"""

from __future__ import annotations

import io
import shlex
import tarfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import docker

from protocol.tls import agent_identity, identity_files
from topologies import Topology

from .inventory import Host, Inventory
from .ssh import HostError, Remote

MAX_CLOCK_OFFSET_S = 0.5  # job timings (JCT, TTA) are taken on several hosts' clocks
TOKEN_PATH = "/run/ces-token"
TLS_PATH = "/run/ces-tls"  # the agent's identity folder in its container


@dataclass(frozen=True)
class Facts:
    """What `check` found on a host."""

    docker: str  # the engine's version
    netns: str  # "host", or the container whose namespace is the host's
    cpu: float
    mem_mb: float
    clock_offset_s: float


def probe(remote: Remote, topo: Topology) -> Facts:
    """Check `remote`'s host against its inventory entry and its topology node; a HostError names
    the first problem."""
    h = remote.host
    version = remote.ok(
        "docker version --format '{{.Server.Version}}'",
        "no Docker engine answers to `docker version`",
    ).strip()
    status, out, _ = remote.run(f"ip -4 -o addr show dev {shlex.quote(h.iface)}")
    if status != 0:
        raise HostError(h, f"data interface {h.iface} does not exist")
    addresses = [w.split("/")[0] for prev, w in zip(out.split(), out.split()[1:]) if prev == "inet"]
    if h.ip not in addresses:
        raise HostError(
            h, f"data interface {h.iface} has {', '.join(addresses) or 'no IPv4'}, not {h.ip}"
        )
    offset = check_clock(remote)
    cpu, mem = capacity(remote)
    node = topo.node(h.node)
    if cpu + 1e-9 < node.cpu or mem + 1e-9 < node.mem_mb:
        raise HostError(
            h,
            f"too small for node {h.node}: {cpu:g} CPUs and {mem:.0f} MB free, "
            f"the topology gives it {node.cpu:g} CPUs and {node.mem_mb} MB",
        )
    return Facts(version, netns(remote), cpu, mem, offset)


def check_clock(remote: Remote) -> float:
    """The host's clock offset from this machine's, s; a HostError beyond MAX_CLOCK_OFFSET_S."""
    t0 = time.time()
    remote_t = float(remote.ok("date +%s.%N", "cannot read the clock"))
    offset = remote_t - (t0 + time.time()) / 2
    if abs(offset) > MAX_CLOCK_OFFSET_S:
        raise HostError(
            remote.host,
            f"clock is {offset:+.2f} s off this machine's (more than "
            f"{MAX_CLOCK_OFFSET_S} s: sync it with NTP)",
        )
    return offset


def capacity(remote: Remote) -> tuple[float, float]:
    """(CPUs, MB of available memory), within the cgroup limits the host's shell lives under."""
    out = remote.ok(
        "echo cpus=$(nproc); "
        "echo quota=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo max); "
        "echo avail_kb=$(awk '/MemAvailable/ {print $2}' /proc/meminfo); "
        "echo mem_max=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo max)",
        "cannot read CPU and memory",
    )
    facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    cpu, mem = float(facts["cpus"]), float(facts["avail_kb"]) / 1024
    quota = facts["quota"].split()
    if len(quota) == 2 and quota[0] != "max":  # cgroup v2 cpu.max: "QUOTA PERIOD"
        cpu = min(cpu, int(quota[0]) / int(quota[1]))
    if facts["mem_max"].isdigit():
        mem = min(mem, int(facts["mem_max"]) / 2**20)
    return cpu, mem


def netns(remote: Remote) -> str:
    """The network namespace of the host's own shell, as `docker run --network` names it: a
    container whose engine is the one the host's CLI talks to (Docker mounts its hostname file
    from /var/lib/docker/containers/<id>/) is named by its id; anything else is "host"."""
    out = remote.ok(
        "id=$(grep -o 'containers/[0-9a-f]\\{64\\}/hostname' /proc/self/mountinfo "
        '| head -1 | cut -d/ -f2); if [ -n "$id" ] && docker inspect --format '
        "'{{.Id}}' \"$id\" 2>/dev/null; then :; else echo host; fi",
        "cannot tell the host's network namespace",
    )
    return out.strip()


def image_id(remote: Remote, tag: str) -> str:
    status, out, _ = remote.run(f"docker image inspect --format '{{{{.Id}}}}' {shlex.quote(tag)}")
    return out.strip() if status == 0 else ""


def install(remote: Remote, client: docker.DockerClient, tag: str, force: bool = False) -> int:
    """Make the host's engine hold the worker image `tag` as this machine has it: `docker save |
    docker load` over SSH, only when the host lacks it or its id differs. Bytes copied."""
    local = client.images.get(tag)
    if not force and image_id(remote, tag) == local.id:
        return 0
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        for chunk in local.save(named=True):
            sent += len(chunk)
            yield chunk

    status, out, err = remote.run("docker load", timeout_s=1800, stdin=chunks())
    if status != 0 or image_id(remote, tag) != local.id:
        raise HostError(remote.host, f"docker load of {tag} failed ({(err or out).strip()})")
    return sent


def agent_name(prefix: str, node: str) -> str:
    return f"{prefix}-agent-{node}"


def _network(facts: Facts) -> str:
    """`docker run --network` for the host's own namespace."""
    return "host" if facts.netns == "host" else f"container:{facts.netns}"


def start_agent(
    remote: Remote,
    inv: Inventory,
    topo: Topology,
    facts: Facts,
    prefix: str,
    tag: str,
    master_url: str,
    token: str,
    pki: Path | None = None,
) -> str:
    """Start the host's agent (its container name is returned); it registers with the Master.
    With `pki` (a folder of `lab.pki`) it serves and calls over TLS with its host's identity;
    without, in plain HTTP (`--insecure`: its command channel listens beyond loopback)."""
    h = remote.host
    name = agent_name(prefix, h.node)
    agent = [
        "python3",
        "-m",
        "edge",
        "--node",
        h.node,
        "--master",
        master_url,
        "--listen",
        f"{h.address}:{inv.agent_port}",
        "--iface",
        h.iface,
        "--ip",
        h.ip,
        "--name-prefix",
        f"{prefix}-{h.node}-",
        "--line-mbps",
        f"{topo.access_link(h.node).bw_mbps:g}",
        "--token-file",
        TOKEN_PATH,
        *(["--tls", TLS_PATH] if pki else ["--insecure"]),
        "--workdir",
        "/var/lib/ces-agent",
    ]
    if facts.netns != "host":
        agent += ["--node-container", facts.netns]
    return run_agent(
        remote,
        facts,
        name,
        prefix,
        tag,
        agent,
        token,
        pki / agent_identity(h.node) if pki else None,
    )


def run_agent(
    remote: Remote,
    facts: Facts,
    name: str,
    prefix: str,
    tag: str,
    agent: list[str],
    token: str,
    identity: Path | None,
) -> str:
    """Create the agent container `name` on the host (its command line `agent`), give it the
    token and the TLS `identity` folder's files (none: plain HTTP), start it; its name."""
    h = remote.host
    create = [
        "docker",
        "create",
        "--name",
        name,
        "--label",
        f"ces.run={prefix}",
        # tc (NET_ADMIN) in the host's namespace, entered with nsenter (SYS_ADMIN)
        "--cap-add",
        "NET_ADMIN",
        "--cap-add",
        "SYS_ADMIN",
        "--pid",
        "host",
        "--network",
        _network(facts),
        "-v",
        "/var/run/docker.sock:/var/run/docker.sock",
        tag,
        *agent,
    ]
    try:
        secrets = _secrets_tar(token, identity)
    except ValueError as e:
        raise HostError(h, str(e)) from None
    remote.ok(shlex.join(create), f"cannot create the agent container {name}")
    status, _, err = remote.run(f"docker cp - {name}:/run", stdin=[secrets])
    if status != 0:
        raise HostError(h, f"cannot give the agent its token and certificate ({err.strip()})")
    remote.ok(f"docker start {name}", f"cannot start the agent container {name}")
    return name


def _secrets_tar(token: str, identity: Path | None) -> bytes:
    """A tar of the token file and, if given, the identity folder's three files (as
    `TLS_PATH`), each readable by its owner only."""
    files = {TOKEN_PATH: token.encode() + b"\n"}
    if identity is not None:
        for path in identity_files(identity):
            try:
                files[f"{TLS_PATH}/{path.name}"] = path.read_bytes()
            except OSError as e:
                raise ValueError(
                    f"{path}: cannot read it ({e.strerror}); python -m lab certs"
                ) from None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if identity is not None:
            folder = tarfile.TarInfo(TLS_PATH.removeprefix("/run/"))
            folder.type, folder.mode = tarfile.DIRTYPE, 0o700
            tar.addfile(folder)
        for path, data in files.items():
            info = tarfile.TarInfo(path.removeprefix("/run/"))
            info.size, info.mode = len(data), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def start_tool(
    remote: Remote,
    facts: Facts,
    prefix: str,
    name: str,
    tag: str,
    argv: list[str],
    cpu: float,
    mem_mb: int,
) -> str:
    """Run `argv` in a container `<prefix>-<name>` of image `tag` in the host's network
    namespace, within `cpu` and `mem_mb` (not named like the agent's workers, whom it would take
    for its own); the container's name."""
    container = f"{prefix}-{name}"
    remote.ok(
        shlex.join(
            [
                "docker",
                "run",
                "-d",
                "--init",
                "--name",
                container,
                "--label",
                f"ces.run={prefix}",
                "--network",
                _network(facts),
                "--cpus",
                f"{cpu:g}",
                "--memory",
                f"{mem_mb}m",
                tag,
                *argv,
            ]
        ),
        f"cannot start {container}",
    )
    return container


def remove(remote: Remote, names: list[str]) -> None:
    """Remove containers `names` (absent ones are fine)."""
    remote.run("docker rm -f " + " ".join(map(shlex.quote, names)))


def stop_agent(remote: Remote, prefix: str, node: str) -> None:
    """SIGTERM: the agent stops its workers and removes its tc classes, then its container."""
    name = agent_name(prefix, node)
    remote.run(f"docker stop -t 20 {name}; docker rm -f {name}", timeout_s=60)


def run_containers(remote: Remote, prefix: str) -> list[str]:
    """The names of run `prefix`'s containers on the host."""
    out = remote.ok(
        f"docker ps -a --filter name=^{prefix}- --format '{{{{.Names}}}}'", "cannot list containers"
    )
    return [n for n in out.split() if n.startswith(f"{prefix}-")]


def cleanup(remote: Remote, prefix: str, timeout_s: float = 30.0) -> list[str]:
    """Remove every container of run `prefix` on the host (the agent, its workers, its tools);
    their names. One that goes meanwhile (its agent removed it, or another cleanup of a host on
    the same engine) is not an error; one still there after `timeout_s` is."""
    names = run_containers(remote, prefix)
    deadline = time.monotonic() + timeout_s
    left = names
    while left:
        remote.run("docker rm -f " + " ".join(map(shlex.quote, left)), timeout_s=timeout_s)
        left = run_containers(remote, prefix)
        if left and time.monotonic() > deadline:
            raise HostError(remote.host, f"cannot remove the run's containers {', '.join(left)}")
        if left:
            time.sleep(0.5)
    return names


def each_host(
    inv: Inventory, accept_new: bool, fn: Callable[[Remote], object]
) -> tuple[dict[str, object], list[HostError]]:
    """`fn` over an SSH connection to every host, all at once: (results by node, the hosts'
    errors in inventory order)."""

    def one(h: Host) -> object:
        with Remote(h, inv.known_hosts, accept_new) as remote:
            return fn(remote)

    results: dict[str, object] = {}
    errors: list[HostError] = []
    with ThreadPoolExecutor(max_workers=min(16, len(inv.hosts))) as pool:
        futures = [(h, pool.submit(one, h)) for h in inv.hosts]
    for h, future in futures:
        try:
            results[h.node] = future.result()
        except HostError as e:
            errors.append(e)
    return results, errors


def check_hosts(
    inv: Inventory, topo: Topology, accept_new: bool
) -> tuple[dict[str, Facts], list[HostError]]:
    """`probe` every host: (facts by node, the hosts' errors)."""
    return each_host(inv, accept_new, lambda r: probe(r, topo))  # type: ignore[return-value]


def deploy_agents(
    inv: Inventory,
    topo: Topology,
    accept_new: bool,
    client: docker.DockerClient,
    tag: str,
    prefix: str,
    master_url: str,
    token: str,
    facts: dict[str, Facts] | None = None,
    force_copy: bool = False,
    pki: Path | None = None,
) -> tuple[dict[str, object], list[HostError]]:
    """Check every host (unless its `facts` are given: checked already), then install the image
    and start the agents; on any host's problem, remove what was started everywhere. (agent
    container by node, the hosts' errors)."""
    if facts is None:
        facts, errors = check_hosts(inv, topo, accept_new)
        if errors:
            return {}, errors

    def up(r: Remote) -> str:
        install(r, client, tag, force_copy)
        return start_agent(r, inv, topo, facts[r.host.node], prefix, tag, master_url, token, pki)

    names, errors = each_host(inv, accept_new, up)
    if errors:
        each_host(inv, accept_new, lambda r: cleanup(r, prefix))
    return names, errors
