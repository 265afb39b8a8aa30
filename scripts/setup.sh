#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 / Ubuntu 22.04 / 24.04 machine (run as root):
# system packages, Open vSwitch and the Docker engine running, the Python environment in .venv
# with a CPU-only torch, and the worker image. Used by `make`, CI (.ci/run) and the Vagrantfile.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "run as root (sudo make ...): the testbed creates namespaces, bridges and containers"

# --- system packages -------------------------------------------------------------------------
PKGS=(openvswitch-switch openvswitch-testcontroller mininet iproute2 ethtool iperf3 iperf
      iputils-ping net-tools telnet debootstrap python3-venv python3-dev curl ca-certificates
      tcpdump)  # tcpdump: the lab test checks a run's capture holds no secret in clear
command -v dockerd >/dev/null 2>&1 || PKGS+=(docker.io)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" openvswitch-testcontroller "* ]]; then
    # Mininet's reference controller, for Containernet scripts' `Controller` (started by them on
    # loopback). Its Debian service would listen on :6653 on every interface: keep it off.
    if [ -d /run/systemd/system ]; then
      systemctl disable --now openvswitch-testcontroller >/dev/null 2>&1 || true
    else
      /etc/init.d/openvswitch-testcontroller stop >/dev/null 2>&1 || true
    fi
  fi
fi

# --- services ---------------------------------------------------------------------------------
if ! ovs-vsctl --timeout=3 show >/dev/null 2>&1; then
  log "starting Open vSwitch"
  # ovs-ctl works with and without systemd; it skips the kernel module where there is none
  # (the testbed then uses OVS's userspace datapath).
  /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  log "starting the Docker engine"
  if [ -d /run/systemd/system ]; then
    systemctl start docker
  else
    nohup dockerd >/var/log/ces-dockerd.log 2>&1 &
  fi
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || die "the Docker engine did not start (see /var/log/ces-dockerd.log)"
fi

# --- Python environment -----------------------------------------------------------------------
PY=/usr/bin/python3
[ -d .venv ] || { log "creating .venv"; "$PY" -m venv .venv; }
stamp=.venv/.requirements.sha256
want=$(cat pyproject.toml requirements*.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing Python packages (pyproject.toml, requirements*.txt)"
  torch_pin=$(grep -E '^torch==' requirements.txt)
  # A CPU-only torch: from PyTorch's CPU index when it is reachable, else from what pip is
  # configured with (a local wheel here). PyPI's default torch pulls gigabytes of CUDA libraries.
  if curl -fsS --max-time 5 -o /dev/null https://download.pytorch.org/whl/cpu/torch/; then
    .venv/bin/pip install -q "$torch_pin" --index-url https://download.pytorch.org/whl/cpu \
      --extra-index-url https://pypi.org/simple
  else
    .venv/bin/pip install -q "$torch_pin"
  fi
  # The project itself, editable: its packages importable from anywhere with .venv's python
  # (a Containernet user's script outside the checkout), its console scripts in .venv/bin.
  .venv/bin/pip install -q -e '.[testbed,dev]'
  echo "$want" > "$stamp"
fi

# --- worker image (built only when its inputs changed) ----------------------------------------
.venv/bin/python -m testbed.image ensure
log "ready"
