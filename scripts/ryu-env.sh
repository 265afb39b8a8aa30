#!/usr/bin/env bash
# A Ryu 4.34 environment of its own (.venv-ryu) to run the SDN app under `ryu-manager`
# (docs/sdn_app.md, "Framework"). Idempotent; `make ryu`.
#
# Ryu is unmaintained since 2022: it builds only with setuptools<68, imports distutils and
# ssl.wrap_socket (gone in Python 3.12), and its ryu.app.wsgi imports eventlet.wsgi.ALREADY_HANDLED,
# which today's eventlet no longer has (no eventlet pin fixes that on 3.11). The shim below
# gives eventlet.wsgi that name back before Ryu imports it.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(pwd)/.venv-ryu
PY=${RYU_PYTHON:-/usr/bin/python3}
log() { printf '\033[1m[ryu]\033[0m %s\n' "$*"; }

if [ -x "$VENV/bin/ryu-manager" ] && "$VENV/bin/python" -c 'import ryu.app.wsgi' 2>/dev/null; then
  exit 0
fi
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] > (3, 11))' 2>/dev/null; then
  echo "ryu-env: Ryu 4.34 needs Python 3.8-3.11; $PY is $("$PY" -V 2>&1). Set RYU_PYTHON to one." >&2
  exit 2
fi
log "building $VENV (Ryu 4.34 on $("$PY" -V))"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
echo 'setuptools<68' > "$VENV/constraints.txt"
# The app's own dependencies, at the versions requirements.txt pins.
pins=$(grep -iE '^(networkx|pyyaml)==' requirements.txt)
# shellcheck disable=SC2086
PIP_CONSTRAINT="$VENV/constraints.txt" "$VENV/bin/pip" install -q ryu==4.34 $pins
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# A .pth line runs at every start of this environment's Python (a sitecustomize.py would be
# shadowed by Debian's own in the standard library).
cat > "$site/ryu_eventlet_shim.py" <<'PY'
"""Ryu 4.34 on Python 3.11 (scripts/ryu-env.sh): ryu.app.wsgi imports a name today's eventlet
dropped; Ryu only compares against it, so any unique object serves."""
import eventlet.wsgi

if not hasattr(eventlet.wsgi, "ALREADY_HANDLED"):
    eventlet.wsgi.ALREADY_HANDLED = object()
PY
echo "import ryu_eventlet_shim" > "$site/ryu_eventlet_shim.pth"
"$VENV/bin/python" -c 'import ryu.app.wsgi, ryu.base.app_manager'
log "ready: $VENV/bin/ryu-manager"
