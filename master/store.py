"""The Master's memory on disk: every job record — the job as submitted, its attempts (decision,
workers, rendezvous port, outcome), events and the workers' metric lines — and what an operator
set through the API (the scheduler, cordoned nodes, link capacities) in SQLite (WAL mode), so
that a Master killed and started again with the same `--state FILE` knows every job it had and
schedules them as it was told to.

The control loop writes the records that changed (`JobRecord.changed`) once per pass, in one
transaction: a crash loses at most the last pass. A record is one JSON document without its metric
lines, which are appended to a table of their own as they arrive, before the heartbeat that
brought them is answered (the agent forgets what was acknowledged; a running job's record is
rewritten often, its lines only grow). The job is kept as the mapping it was submitted as and
parsed again on load (one parser for jobs).
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.jobs import parse_job
from scheduler.model import Decision, FlowAssignment

from .manager import Attempt, JobRecord, Phase


class StateError(RuntimeError):
    """The state file cannot be used (the message names it and why)."""


class Store:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            self.db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS jobs (name TEXT PRIMARY KEY, doc TEXT NOT NULL)"
            )
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS lines (job TEXT NOT NULL, "
                "worker TEXT NOT NULL, line TEXT NOT NULL)"
            )
            self.db.execute(
                "CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
            )
            self.db.commit()
        except sqlite3.Error as e:
            raise StateError(f"state file {self.path}: {e}") from None

    def load(self) -> list[JobRecord]:
        """Every record, in submission order."""
        try:
            rows = self.db.execute("SELECT name, doc FROM jobs").fetchall()
            lines = self.db.execute("SELECT job, worker, line FROM lines ORDER BY rowid")
            records = {}
            for name, doc in rows:
                records[name] = record_from_json(json.loads(doc))
            for job, worker, line in lines:
                records[job].records.setdefault(worker, []).append(json.loads(line))
        except sqlite3.Error as e:
            raise StateError(f"state file {self.path}: {e}") from None
        except (ValueError, KeyError, TypeError) as e:
            raise StateError(f"state file {self.path}: a job record: {e}") from None
        return sorted(records.values(), key=lambda r: r.submitted_at)

    def settings(self) -> dict:
        """The operator's settings as last saved (key -> value)."""
        try:
            return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM settings")}
        except sqlite3.Error as e:
            raise StateError(f"state file {self.path}: {e}") from None
        except ValueError as e:
            raise StateError(f"state file {self.path}: a setting: {e}") from None

    def save(self, changes: Changes) -> None:
        """What `take_changes` took, in one transaction."""
        with self._lock:
            self._save(changes)

    def write(self, take: Callable[[], Changes]) -> None:
        """`take()` the changes and save them under one lock, so that of two writers an older
        copy of a record never lands after a newer one."""
        with self._lock:
            changes = take()
            if changes:
                self._save(changes)

    def _save(self, changes: Changes) -> None:
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO jobs (name, doc) VALUES (?, ?)", changes.docs
            )
            self.db.executemany(
                "INSERT INTO lines (job, worker, line) VALUES (?, ?, ?)", changes.lines
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in changes.settings.items()],
            )

    def close(self) -> None:
        with self._lock:
            self.db.close()


@dataclass
class Changes:
    docs: list[tuple[str, str]]  # (job, record document)
    lines: list[tuple[str, str, str]]  # (job, worker, metric line)
    settings: dict = field(default_factory=dict)  # the operator's settings, when they changed

    def __bool__(self) -> bool:
        return bool(self.docs or self.lines or self.settings)


def take_changes(records: Iterable[JobRecord], lines: list[tuple[str, str, dict]]) -> Changes:
    """What changed since the last call (under the Master's lock): the documents of changed
    records (their flags cleared) and the metric lines that arrived (`take_lines`)."""
    out = take_lines(lines)
    for rec in records:
        if rec.changed:
            out.docs.append((rec.name, json.dumps(record_to_json(rec))))
            rec.changed = False
    return out


def take_lines(lines: list[tuple[str, str, dict]]) -> Changes:
    """The metric lines (job, worker, line) that arrived; `lines` is emptied."""
    out = Changes([], [(job, worker, json.dumps(line)) for job, worker, line in lines])
    lines.clear()
    return out


def record_to_json(rec: JobRecord) -> dict:
    return {
        "job": rec.document,
        "source": rec.source,
        "algorithm": rec.algorithm,
        "submitted_at": rec.submitted_at,
        "state": rec.state.value,
        "reason": rec.reason,
        "attempts": [_attempt_to_json(a) for a in rec.attempts],
        "events": [list(e) for e in rec.events],
        "finished_at": rec.finished_at,
    }


def record_from_json(doc: dict) -> JobRecord:
    rec = JobRecord(
        parse_job(doc["job"], doc["source"]),
        doc["algorithm"],
        doc["submitted_at"],
        Phase(doc["state"]),
        doc["reason"],
        document=doc["job"],
        source=doc["source"],
    )
    rec.attempts = [_attempt_from_json(a) for a in doc["attempts"]]
    rec.events = [(t, text) for t, text in doc["events"]]
    rec.finished_at, rec.changed = doc["finished_at"], False
    return rec


def _attempt_to_json(a: Attempt) -> dict:
    d = a.decision
    return {
        "number": a.number,
        "workers": a.workers,
        "master_port": a.master_port,
        "started_at": a.started_at,
        "ended_at": a.ended_at,
        "outcome": a.outcome,
        "info": a.info,
        "decision": {
            "job": d.job,
            "placement": d.placement,
            "decision_s": d.decision_s,
            "network": d.network,
            "flows": [[f.src, f.dst, list(f.path), f.rate_mbps] for f in d.flows],
        },
    }


def _attempt_from_json(doc: dict) -> Attempt:
    d = doc["decision"]
    decision = Decision(
        d["job"],
        d["placement"],
        [FlowAssignment(s, t, tuple(p), r) for s, t, p, r in d["flows"]],
        d["decision_s"],
        d["network"],
    )
    return Attempt(
        doc["number"],
        decision,
        doc["workers"],
        doc["master_port"],
        doc["started_at"],
        doc["ended_at"],
        doc["outcome"],
        doc["info"],
    )
