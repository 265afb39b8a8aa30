"""bench_spread (issue 20's figures), smoke-sized: every variant of CES-PPO and every baseline
on one held-out network, and the decoding never slower than network-aware's placement with
CES's paths and rates (one of its candidates)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, str(REPO / "experiments" / "bench_spread.py")]


def test_one_network_one_seed_gives_every_figure(tmp_path: Path):
    out = tmp_path / "spread.json"
    done = subprocess.run(BENCH + ["--seeds", "1", "--random-jobs", "1", "--reps", "0",
                                   "--topologies", "topozoo/Abilene", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(out.read_text())
    s = doc["all"]
    assert s["jobs"] == 4 and set(s["placed"]) >= {"ces-ppo", "ces-ppo:greedy", "ces-ppo:own",
                                                    "network-aware/ces", "network-aware"}
    for ours in ("ces-ppo", "ces-ppo:greedy", "ces-ppo:own"):
        assert s[ours]["network-aware"]["jobs"] >= 1
    assert s["ces-ppo"]["network-aware/ces"]["worst"] <= 1 + 1e-9
    # the policy's own decoding has the greedy rollout among its candidates
    assert s["ces-ppo:own"]["ces-ppo:greedy"]["worst"] <= 1 + 1e-9
    assert "own decoding" in done.stdout and out.with_suffix(".png").is_file()
