"""The training program as real local processes (gloo over loopback, 2-3 ranks, no containers)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from protocol.http import free_port
from workloads.data import SYNTHETIC_TEST
from workloads.launch import PACKAGE_ROOT, LocalJobError, run_local, train_argv
from workloads.results import read_job, read_task_log
from workloads.train import main

FAST = {"threads": 1, "dataset": "digits", "eval_every": 10, "timeout_s": 60}


def _logs(paths):
    return [read_task_log(p) for p in paths]


def test_ring_reaches_target_and_measures_the_ring(tmp_path):
    paths = run_local(
        3,
        tmp_path,
        deadline_s=120,
        model="mlp-small",
        collective="ring",
        target_acc=0.9,
        max_iters=400,
        seed=1,
        **FAST,
    )
    logs = _logs(paths)
    ends = [t.end for t in logs]
    assert all(e["reached_target"] and e["stop_reason"] == "target" for e in ends)
    assert len({e["tta_iter"] for e in ends}) == 1  # every rank stops at the same evaluation
    assert len({e["param_sum"] for e in ends}) == 1  # replicas stayed identical
    for t in logs:
        hit = next(ev for ev in t.evals if ev["accuracy"] >= 0.9)
        assert hit["iter"] == t.end["tta_iter"] and hit["elapsed_s"] == t.end["tta_s"]
        assert all(ev["accuracy"] < 0.9 for ev in t.evals[:-1])
        assert [ev["iter"] for ev in t.evals] == list(range(10, t.end["tta_iter"] + 1, 10))
        assert len(t.iters) == t.end["iters"]
        assert 0 < t.end["tta_s"] <= t.end["train_s"] < t.end["jct_s"]
        assert t.end["startup_s"] > 0 and t.end["container_startup_s"] is None
        grad = t.start["gradient_bytes"]
        for r in t.iters:
            # gloo ring all-reduce: each rank sends 2(k-1)/k of the gradient per iteration
            assert r["payload_tx_bytes"] == r["payload_rx_bytes"] == 2 * 2 * grad // 3
            assert r["comm_s"] > 0 and r["compute_s"] > 0
            # mlp-small's 340 KB gradient is one DDP bucket (the first is capped at 1 MB): one
            # all-reduce an iteration, after the first (DDP rebuilds its buckets then)
            assert r["comm_calls"] == 1 or r["iter"] == 1
            # loopback carries all three ranks' traffic, so at least this rank's share
            assert r["tx_bytes"] >= r["payload_tx_bytes"]
    summary = read_job(paths)
    assert summary.reached_target and summary.tta_s == max(e["tta_s"] for e in ends)
    assert summary.parameters == 85002 and summary.gradient_bytes == 4 * 85002


def test_parameter_server_is_a_star(tmp_path):
    paths = run_local(
        3,
        tmp_path,
        deadline_s=120,
        model="cnn",
        collective="ps",
        target_acc=0.85,
        max_iters=400,
        **FAST,
    )
    logs = sorted(_logs(paths), key=lambda t: t.rank)
    assert all(t.end["reached_target"] for t in logs)
    assert len({t.end["param_sum"] for t in logs}) == 1
    grad = logs[0].start["gradient_bytes"]
    assert grad == 4 * 101626
    server, workers = logs[0], logs[1:]
    # The server receives every worker's gradient and sends each the average; workers talk
    # only to the server: M up and M down.
    assert all(r["payload_tx_bytes"] == r["payload_rx_bytes"] == 2 * grad for r in server.iters)
    for w in workers:
        assert all(r["payload_tx_bytes"] == r["payload_rx_bytes"] == grad for r in w.iters)


def test_unreached_target_reports_no_time(tmp_path):
    paths = run_local(
        2, tmp_path, deadline_s=120, model="mlp-small", target_acc=1.0, max_iters=15, **FAST
    )
    for t in _logs(paths):
        assert t.end["reached_target"] is False and t.end["tta_s"] is None
        assert t.end["stop_reason"] == "max_iters" and t.end["iters"] == 15
        assert [ev["iter"] for ev in t.evals] == [10, 15]  # cadence, plus the final one
    assert read_job(paths).tta_s is None


def test_time_limit_stops_every_rank_at_the_same_evaluation(tmp_path):
    paths = run_local(
        2,
        tmp_path,
        deadline_s=120,
        model="mlp-large",
        target_acc=1.0,
        max_iters=10_000,
        max_seconds=0.5,
        **{**FAST, "eval_every": 2},
    )
    ends = [t.end for t in _logs(paths)]
    assert all(e["stop_reason"] == "max_seconds" and not e["reached_target"] for e in ends)
    assert len({e["iters"] for e in ends}) == 1 and ends[0]["iters"] < 10_000
    assert all(e["train_s"] >= 0.5 for e in ends)


def test_absent_dataset_files_give_synthetic_data_and_no_time(tmp_path):
    """CIFAR-10 absent: random images of its shapes, the run says so, and no time-to-accuracy is
    reported even where random labels reach the target (10 % of 10 classes)."""
    paths = run_local(
        1,
        tmp_path,
        deadline_s=120,
        model="cnn",
        data_dir=tmp_path / "nothing-here",
        target_acc=0.01,
        max_iters=4,
        **{**FAST, "dataset": "cifar10", "eval_every": 2},
    )
    log = read_task_log(paths[0])
    assert log.data["synthetic"] and (log.data["train"], log.data["test"]) == (
        50_000,
        SYNTHETIC_TEST,
    )
    assert all(ev["accuracy"] >= 0.01 for ev in log.evals)  # the target, by chance
    assert log.end["synthetic"] and not log.end["reached_target"] and log.end["tta_s"] is None
    assert log.end["stop_reason"] == "max_iters" and log.end["iters"] == 4
    assert "training on synthetic data" in (tmp_path / "rank0.stderr").read_text()
    summary = read_job(paths)
    assert summary.synthetic and summary.tta_s is None


def test_container_start_is_taken_from_the_launcher(tmp_path, monkeypatch):
    launched = time.time() - 5.0
    monkeypatch.setenv("CES_CONTAINER_START", repr(launched))
    paths = run_local(1, tmp_path, deadline_s=60, max_iters=3, target_acc=1.0, **FAST)
    end = read_task_log(paths[0]).end
    assert end["container_startup_s"] >= end["startup_s"] + 4.0
    assert end["jct_s"] >= 5.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "resnet-9000"], "invalid choice: 'resnet-9000'"),
        (["--target-acc", "0"], "target accuracy must be in (0"),
        (["--target-acc", "1.5"], "target accuracy must be in (0"),
        (["--world-size", "0"], "world size must be in [1"),
        (["--rank", "3"], "--rank 3 is outside the job (world size 2)"),
        (["--dataset", "imagenet"], "invalid choice: 'imagenet'"),
        (["--collective", "butterfly"], "invalid choice: 'butterfly'"),
        (["--batch-size", "-4"], "batch size must be in [1"),
        (["--lr", "abc"], "expected float, got 'abc'"),
        (["--master-port", "70000"], "port must be in [1, 65535]"),
        (["--iface", "nosuch0"], "--iface nosuch0: no such network interface"),
        (
            ["--dataset", "mnist", "--data-dir", "/nonexistent", "--require-data", ""],
            "raw MNIST files",
        ),
        (["--flows", "0>1:8"], "--flows: flows are a custom graph's; the ring collective"),
        (["--collective", "custom", "--flows", "0>2:8"], "names a rank outside the job"),
        (["--collective", "custom", "--flows", "0-1:8"], "expected SRC>DST:BYTES"),
        (["--collective", "custom", "--flows", "1>1:8"], "SRC different from DST"),
    ],
)
def test_bad_parameters_exit_2_with_a_clear_message(args, message, capsys):
    base = {"--rank": "0", "--world-size": "2"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    with pytest.raises(SystemExit) as exc:
        main([x for kv in base.items() for x in kv if x])  # "": a bare flag
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_parameters_from_the_command_line_give_no_traceback(tmp_path):
    done = subprocess.run(
        train_argv(0, 0, out=tmp_path / "x.jsonl"),
        capture_output=True,
        text=True,
        cwd=tmp_path.parent,
        timeout=60,
        env={"PYTHONPATH": str(PACKAGE_ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "world size must be in [1" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.jsonl").exists()  # nothing half-built


def test_lost_peer_is_reported_not_hung(tmp_path):
    """Rank 1 is killed mid-training: rank 0 exits 1 with a message well before the timeout."""
    port = free_port()
    common = dict(
        master_port=port,
        model="mlp-large",
        target_acc=1.0,
        max_iters=100_000,
        max_seconds=300,
        threads=1,
        timeout_s=20,
    )
    outs = [tmp_path / f"rank{r}.jsonl" for r in range(2)]
    procs = [
        subprocess.Popen(
            train_argv(r, 2, out=outs[r], **common),
            stderr=subprocess.PIPE,
            text=True,
            cwd=PACKAGE_ROOT,
        )
        for r in range(2)
    ]
    try:
        deadline = time.monotonic() + 90
        while '"type": "iter"' not in (outs[1].read_text() if outs[1].exists() else ""):
            assert time.monotonic() < deadline and procs[0].poll() is None, "never trained"
            time.sleep(0.2)
        t_kill = time.monotonic()
        procs[1].send_signal(signal.SIGKILL)
        err = procs[0].communicate(timeout=60)[1]
        assert procs[0].returncode == 1
        assert "error: rank 0:" in err and "Traceback" not in err
        assert time.monotonic() - t_kill < 30
        assert read_task_log(outs[0]).error is not None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def test_failing_rank_fails_the_local_job(tmp_path):
    with pytest.raises(LocalJobError, match="rank 1"):
        run_local(
            2,
            tmp_path,
            deadline_s=60,
            dataset="mnist",
            data_dir="/nonexistent",
            require_data=True,
            **{k: v for k, v in FAST.items() if k != "dataset"},
        )


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
