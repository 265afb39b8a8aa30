"""The Master survives its own kill -9: a `python -m master serve --state FILE` process is killed
and started again on the same file and port, with simulated agents (the real Messenger over HTTP)
that keep heartbeating meanwhile. Nothing is lost, nothing runs twice: the running job keeps its
attempt and its workers (the agents keep them), the queued one resumes, the finished one stays
finished; a node that does not come back ends its attempt."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_master_loop import spread_job, wait_for

from edge.simulated import SimulatedAgent
from master.client import MasterClient
from protocol.http import Unreachable, free_port
from topologies import load_topology

REPO = Path(__file__).resolve().parents[2]
STAR = load_topology("star")  # only e1 and e2 hold a 1-core task


class MasterProcess:
    def __init__(self, state: Path, port: int):
        self.state, self.port = state, port
        self.proc: subprocess.Popen | None = None
        self.log = (state.parent / "master.log").open("a")
        self.client = MasterClient(f"http://127.0.0.1:{port}", timeout_s=10)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "master",
                "serve",
                "--topo",
                "star",
                "--port",
                str(self.port),
                "--state",
                str(self.state),
                "--algorithm",
                "first-fit",
                "--heartbeat-timeout",
                "2",
            ],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )

        def answers() -> bool:
            assert self.proc.poll() is None, "the Master exited"
            try:
                return bool(self.client.health())
            except Unreachable:
                return False

        wait_for(answers, 30, "the Master to answer")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def lab(tmp_path):
    master = MasterProcess(tmp_path / "master.sqlite", free_port())
    master.start()
    agents = {
        n.name: SimulatedAgent(
            n.name, master.client.url, n.ip, n.cpu, n.mem_mb, heartbeat_s=0.2
        ).start()
        for n in STAR.nodes
    }
    master.client.wait_ready(len(STAR.nodes), timeout_s=20)
    yield master, agents
    for a in agents.values():
        a.stop()
    if master.proc.poll() is None:
        master.proc.terminate()
        master.proc.wait(20)


def workers_of(agents, job: str) -> dict[str, str]:
    """worker -> node, of the job's workers the agents run."""
    return {
        w: node
        for node, a in agents.items()
        for w in a.compute.workers
        if a.compute.specs[w].job == job
    }


def test_a_killed_master_restarted_on_its_state_loses_and_duplicates_nothing(lab):
    master, agents = lab
    c = master.client
    c.submit(spread_job("done"))
    wait_for(lambda: len(workers_of(agents, "done")) == 2, what="done's workers")
    for w, node in workers_of(agents, "done").items():
        agents[node].finish(w, 0)
    wait_for(lambda: c.job("done")["state"] == "finished", what="done finished")
    c.submit(spread_job("run"))
    wait_for(lambda: c.job("run")["state"] == "running", what="run running")
    c.submit(spread_job("wait"))  # e1 and e2 are taken: it queues
    wait_for(lambda: c.job("wait")["reason"], what="wait has a reason")
    running = workers_of(agents, "run")
    before = {name: c.job(name) for name in ("done", "run", "wait")}

    master.kill()
    master.start()  # same file, same port: the agents re-register on their own

    c.wait_ready(len(STAR.nodes), timeout_s=20)
    after = {name: c.job(name) for name in ("done", "run", "wait")}
    assert [after[n]["state"] for n in after] == ["finished", "running", "queued"]
    for name in after:  # the same attempts, decisions and rendezvous ports
        assert [
            (a["number"], a["placement"], a["master_port"]) for a in after[name]["attempts"]
        ] == [(a["number"], a["placement"], a["master_port"]) for a in before[name]["attempts"]]
    assert any("taken over by a restarted Master" in e["event"] for e in after["run"]["events"])
    wait_for(
        lambda: all(workers_of(agents, "run").get(w) == n for w, n in running.items()),
        what="the running workers kept",
    )
    assert sum(len(a.compute.specs) for a in agents.values()) == 4  # none started twice

    for w, node in running.items():
        agents[node].finish(w, 0)
    wait_for(lambda: c.job("run")["state"] == "finished", what="run finished after the restart")
    wait_for(lambda: c.job("wait")["state"] == "running", what="the queue resumed")
    port = c.job("wait")["attempts"][0]["master_port"]
    assert port not in {
        a["master_port"] for n in ("done", "run") for a in after[n]["attempts"]
    }  # a fresh rendezvous port
    with sqlite3.connect(master.state) as db:  # the file is SQLite in WAL mode
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert {r[0] for r in db.execute("SELECT name FROM jobs")} == {"done", "run", "wait"}


def test_the_operators_settings_survive_a_restart(lab):
    """What run.py sets through the API — the scheduler, seed and queue of a run, the cordoned
    nodes of another tenant — and a link's capacity hold for a restarted Master too."""
    master, _ = lab
    c = master.client
    c.set_scheduler("best-fit", 7, queue="sjf")
    c.set_schedulable("e3", False)
    c.set_link_capacity("e1", "hub", 300)
    master.kill()
    master.start()
    health = c.health()
    assert (health["scheduler"], health["seed"], health["queue"]) == ("best-fit", 7, "sjf")
    assert [n["node"] for n in c.nodes() if n["cordoned"]] == ["e3"]
    assert {lk["capacity_mbps"] for lk in c.links() if {lk["src"], lk["dst"]} == {"e1", "hub"}} == {
        300
    }


def test_a_node_that_does_not_come_back_ends_its_restored_attempt(lab):
    master, agents = lab
    c = master.client
    c.submit(spread_job("run"))
    wait_for(lambda: c.job("run")["state"] == "running", what="run running")
    gone = sorted(workers_of(agents, "run").values())[1]
    master.kill()
    agents[gone].stop()  # its host died with the Master
    master.start()
    view = wait_for(
        lambda: (v := c.job("run"))["attempts"][0]["outcome"] and v,
        20,
        "the restored attempt to end",
    )
    assert f"node {gone} stopped heartbeating" in view["attempts"][0]["outcome"]


def test_an_unusable_state_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "state.sqlite"
    bad.write_text("not a database\n" * 100)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "master",
            "serve",
            "--topo",
            "star",
            "--port",
            "0",
            "--state",
            str(bad),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and str(bad) in lines[0], done.stderr


def test_the_store_gives_back_what_it_was_given(tmp_path):
    """A record with attempts, events, info and metric lines written in two passes and read back
    by a new Store: equal, field by field."""
    from master.manager import Manager
    from master.store import Store, take_changes
    from scheduler.jobs import parse_job
    from scheduler.model import Decision, FlowAssignment

    doc = spread_job("j")
    m = Manager()
    rec = m.submit(parse_job(doc), "first-fit", doc, "j.yaml")
    decision = Decision(
        "j",
        {"w0": "e1", "w1": "e2"},
        [FlowAssignment("w0", "w1", ("e1", "hub", "e2"), 12.5)],
        0.01,
        "enforced",
    )
    attempt = m.start_attempt(rec, decision, {"w0": "j-w0-a1", "w1": "j-w1-a1"}, 29501)
    attempt.info.update(predicted_iteration_s=float("inf"), adjustments=[])
    store = Store(tmp_path / "s.sqlite")
    rec.records["j-w0-a1"] = [{"type": "iter", "iter": 1}]
    unsaved = [("j", "j-w0-a1", rec.records["j-w0-a1"][0])]
    store.save(take_changes([rec], unsaved))
    m.mark_running(rec)
    rec.records["j-w0-a1"].append({"type": "eval", "accuracy": 0.5})
    unsaved.append(("j", "j-w0-a1", rec.records["j-w0-a1"][1]))
    store.save(take_changes([rec], unsaved))
    assert not take_changes([rec], unsaved)  # nothing new
    store.close()
    (back,) = Store(tmp_path / "s.sqlite").load()
    for name in (
        "job",
        "algorithm",
        "submitted_at",
        "state",
        "reason",
        "attempts",
        "events",
        "records",
        "finished_at",
        "document",
        "source",
    ):
        assert getattr(back, name) == getattr(rec, name), name
