#!/usr/bin/env bash
# What only the tests need, on top of scripts/setup.sh (run as root; idempotent; `make test`):
# Debian's vagrant, for `vagrant validate` of the Vagrantfile, and the Ryu 4.34 environment the
# SDN app is tested under `ryu-manager` with (scripts/ryu-env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v vagrant >/dev/null 2>&1; then
  printf '\033[1m[setup]\033[0m installing vagrant\n'
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends vagrant >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends vagrant >/dev/null; }
fi
# Ryu cannot run on Python 3.12+ (Ubuntu 24.04's): its test is then skipped (outside CI).
bash scripts/ryu-env.sh || echo "[setup] no Ryu environment (see above): tests/integration/test_ryu.py will be skipped"
