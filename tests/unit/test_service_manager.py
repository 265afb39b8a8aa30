"""The Manager's job life cycle and the Compute Controller's bookkeeping (pure logic, a fake
clock): retries and their limit, non-retryable failures, heartbeat-loss and worker-end detection,
the worker command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from master.compute import ComputeController, worker_command, worker_image
from master.manager import Manager, ManagerError, Phase
from protocol.messages import Heartbeat, Registration, Usage, WorkerState
from scheduler.jobs import load_job_documents, ring_job, star_job
from scheduler.model import Decision, Resources

JOBS = Path(__file__).resolve().parents[2] / "workloads" / "jobs"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def job(name: str = "j1", workers: int = 2):
    return ring_job(
        name,
        workers,
        Resources(0.5, 256),
        4e5,
        50,
        target_accuracy=0.9,
        workload={"model": "mlp-small"},
    )


def decision(j, nodes: list[str]) -> Decision:
    return Decision(j.name, {t.name: n for t, n in zip(j.tasks, nodes)}, [])


def start(m: Manager, rec, nodes: list[str]):
    workers = {t.name: f"{rec.name}-{t.name}-a{len(rec.attempts) + 1}" for t in rec.job.tasks}
    return m.start_attempt(rec, decision(rec.job, nodes), workers, 29500)


def test_life_cycle_to_finished():
    clock = Clock()
    m = Manager(clock=clock)
    rec = m.submit(job(), "k8s-spread")
    assert rec.state == Phase.QUEUED and m.queued() == [rec]
    start(m, rec, ["a", "b"])
    assert rec.state == Phase.SCHEDULED and m.expected_workers("a") == ["j1-w0-a1"]
    assert m.on_node("b") == [rec] and m.on_node("c") == []
    assert m.worker_owner("j1-w1-a1") == (rec, "w1")
    m.mark_running(rec)
    clock.t += 5
    m.finish(rec)
    assert rec.state == Phase.FINISHED and rec.finished_at == 1005.0
    assert rec.attempts[0].outcome == "finished"
    assert m.expected_workers("a") == [] and m.worker_owner("j1-w1-a1") is None
    assert [e for _, e in rec.events][-1] == "finished"


def test_retry_then_fail_after_max_attempts():
    m = Manager(max_attempts=2, clock=Clock())
    rec = m.submit(job(), "random")
    start(m, rec, ["a", "b"])
    assert m.end_attempt(rec, "node b stopped heartbeating") == Phase.QUEUED
    assert "rescheduling" in rec.reason and m.queued() == [rec]
    start(m, rec, ["a", "c"])
    assert rec.current.workers["w0"] == "j1-w0-a2"
    assert m.end_attempt(rec, "worker w1 on c exited with code 137") == Phase.FAILED
    assert "exited with code 137" in rec.reason and "2 attempts" in rec.reason
    assert m.queued() == [] and m.active() == []


def test_non_retryable_failure_fails_at_once():
    m = Manager(max_attempts=5, clock=Clock())
    rec = m.submit(job(), "random")
    start(m, rec, ["a", "b"])
    assert m.end_attempt(rec, "worker w0 exited with code 2", retryable=False) == Phase.FAILED
    assert "not retryable" in rec.reason


def test_submit_validation():
    m = Manager(clock=Clock())
    m.submit(job("dup"), "random")
    with pytest.raises(ManagerError) as e:
        m.submit(job("dup"), "random")
    assert e.value.status == 409
    with pytest.raises(ManagerError) as e:
        m.submit(job("bad name!"), "random")
    assert e.value.status == 400
    with pytest.raises(ManagerError) as e:
        m.get("nope")
    assert e.value.status == 404


def test_cancel_and_reject():
    m = Manager(clock=Clock())
    rec = m.submit(job(), "random")
    start(m, rec, ["a", "b"])
    m.cancel(rec)
    assert rec.state == Phase.CANCELLED and rec.attempts[0].outcome == "cancelled"
    with pytest.raises(ManagerError):
        m.cancel(rec)
    other = m.submit(job("j2"), "ces-ppo")
    m.reject(other, "scheduler ces-ppo failed: no checkpoint")
    assert other.state == Phase.FAILED and "no checkpoint" in other.reason
    # a finished name can be submitted again (a new record)
    again = m.submit(job(), "random")
    assert again.state == Phase.QUEUED and m.get("j1") is again


# --- Compute Controller ---------------------------------------------------------------------------
def reg(node: str) -> Registration:
    return Registration(node, f"http://127.0.0.1:1/{node}", "10.0.0.1", "eth0", 1.0, 1024)


def hb(node: str, seq: int, workers: list[WorkerState]) -> Heartbeat:
    return Heartbeat(node, seq, 0.0, Usage(0.5, 100, 1.0, 2.0), workers)


def test_heartbeat_loss_is_noticed_after_the_timeout():
    clock = Clock()
    cc = ComputeController(heartbeat_timeout_s=6.0, clock=clock)
    assert cc.register(reg("a")) and cc.register(reg("b"))
    clock.t += 5.9
    cc.heartbeat(hb("a", 1, []), set())
    assert cc.stale() == []
    clock.t += 0.2
    assert [n for n, _ in cc.stale()] == ["b"]
    cc.mark_offline("b")
    assert cc.online() == {"a"} and cc.stale() == []
    came_back, ended = cc.heartbeat(hb("b", 7, []), set())
    assert came_back and ended == [] and cc.online() == {"a", "b"}


def test_heartbeat_reports_ended_workers_once():
    clock = Clock()
    cc = ComputeController(clock=clock)
    cc.register(reg("a"))
    running = WorkerState("j-w0-a1", "j", "w0", "running")
    exited = WorkerState("j-w0-a1", "j", "w0", "exited", 137, "killed")
    assert cc.heartbeat(hb("a", 1, [running]), {"j-w0-a1"})[1] == []
    assert cc.heartbeat(hb("a", 2, [exited]), {"j-w0-a1"})[1] == [exited]
    assert cc.heartbeat(hb("a", 3, [exited]), {"j-w0-a1"})[1] == []  # not twice
    # workers the Master does not expect are to be stopped
    assert cc.unwanted("a", set()) == ["j-w0-a1"]
    assert cc.unwanted("a", {"j-w0-a1"}) == []


def test_a_worker_the_agent_forgot_is_missing_after_the_grace():
    clock = Clock()
    cc = ComputeController(missing_grace_s=5.0, clock=clock)
    cc.register(reg("a"))
    cc.started["j-w0-a1"] = clock.t
    assert cc.heartbeat(hb("a", 1, []), {"j-w0-a1"})[1] == []
    clock.t += 6
    ended = cc.heartbeat(hb("a", 2, []), {"j-w0-a1"})[1]
    assert [(w.name, w.state) for w in ended] == [("j-w0-a1", "missing")]


def test_worker_command_from_the_workload_mapping():
    j = ring_job(
        "r",
        3,
        Resources(0.5, 256),
        4e5,
        50,
        target_accuracy=0.9,
        iterations=300,
        workload={"model": "cnn", "eval_every": 5, "max_seconds": 60},
    )
    cmd = worker_command(j, 1, "10.0.0.7", 29501, "eth0", 3)
    assert cmd[:3] == ["python3", "-m", "workloads.train"]
    opts = dict(zip(cmd[3::2], cmd[4::2]))
    assert opts == {
        "--rank": "1",
        "--world-size": "3",
        "--master-addr": "10.0.0.7",
        "--master-port": "29501",
        "--iface": "eth0",
        "--seed": "3",
        "--out": "-",
        "--collective": "ring",
        "--target-acc": "0.9",
        "--max-iters": "300",
        "--model": "cnn",
        "--eval-every": "5",
        "--max-seconds": "60",
    }
    star = star_job("s", 2, Resources(0.5, 256), 4e5, 50, iterations=10)
    assert "ps" in worker_command(star, 0, "10.0.0.1", 1, "eth0", 0)
    j.command = "python3 -m workloads.train"  # a program: the options are appended
    assert worker_command(j, 0, "10.0.0.7", 1, "eth0", 0)[3] == "--rank"
    j.command = "run --r {rank} --of {world_size} --at {master_addr}:{master_port}"
    assert worker_command(j, 2, "10.0.0.7", 9, "eth0", 0) == [
        "run",
        "--r",
        "2",
        "--of",
        "3",
        "--at",
        "10.0.0.7:9",
    ]
    j.command = "run {nope}"
    with pytest.raises(ValueError, match="placeholders"):
        worker_command(j, 0, "10.0.0.7", 9, "eth0", 0)
    j.command, j.collective = "", "tree"
    cmd = worker_command(j, 0, "10.0.0.7", 9, "eth0", 0)
    assert cmd[cmd.index("--collective") + 1] == "tree" and "--flows" not in cmd


def test_a_custom_job_gives_its_workers_its_flows_by_rank():
    (doc,) = load_job_documents(JOBS / "custom-cycle.yaml")
    cmd = worker_command(doc.job, 2, "10.0.0.7", 9, "eth0", 0)
    at = cmd.index("--flows")
    # tasks a, b, c, d are ranks 0-3; c -> a carries 4 MB, a -> b the job's model_bytes
    assert cmd[at + 1 : at + 7] == [
        "0>1:2000000",
        "1>2:2000000",
        "2>0:4000000",
        "0>2:2000000",
        "2>3:500000",
        "3>0:500000",
    ]
    assert cmd[cmd.index("--collective") + 1] == "custom"


def test_worker_image():
    assert worker_image("", "ces-worker:abc") == "ces-worker:abc"
    assert worker_image("ces-worker", "ces-worker:abc") == "ces-worker:abc"
    assert worker_image("other:1", "ces-worker:abc") == "other:1"
    assert worker_image("registry:5000/x", "ces-worker:abc") == "registry:5000/x"
