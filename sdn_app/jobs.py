"""The jobs the network must carry: their flows, the meter ids and cookies they hold, what every
switch must contain, and the state file that lets a restarted controller re-learn them.
Pure logic, no framework imports."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topologies import Topology

from .flows import (
    MAX_METER_ID,
    MAX_SEQ,
    FlowKey,
    FlowSpec,
    Meter,
    MeterPolicy,
    RequestError,
    Rule,
    default_rules,
    job_rules,
    parse_flows,
    parse_job_id,
)

STATE_VERSION = 1


class StateError(ValueError):
    """A state file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class InstalledFlow:
    spec: FlowSpec
    flow_no: int  # stable per flow key within the job: part of the cookie
    meter_id: int  # at the flow's first switch


@dataclass(frozen=True)
class Job:
    job_id: str
    seq: int  # stable per job: part of the cookie
    flows: tuple[InstalledFlow, ...]
    updated: float = field(default_factory=time.time)

    def by_key(self) -> dict[FlowKey, InstalledFlow]:
        return {f.spec.key: f for f in self.flows}


class JobTable:
    """Jobs by id. Copy-on-write: readers iterate `jobs` without a lock while one writer (holding
    the app's job lock) replaces it."""

    def __init__(self, topo: Topology, policy: MeterPolicy = MeterPolicy()):
        self.topo = topo
        self.policy = policy
        self.jobs: dict[str, Job] = {}
        self.next_seq = 1
        self._defaults = default_rules(topo)

    # --- building the next state ---------------------------------------------------------------

    def propose(
        self,
        job_id: str,
        specs: list[FlowSpec],
        meter_limit: Callable[[int], int] = lambda dpid: MAX_METER_ID,
    ) -> Job:
        """The job as it would be with `specs`: flow numbers and meter ids kept for flows it
        already had, new ones allocated otherwise. Nothing is stored. Raises `RequestError` (409)
        when a flow belongs to another job or a switch has no free meter."""
        old = self.jobs.get(job_id)
        kept = old.by_key() if old else {}
        owner = {
            f.spec.key: j.job_id for j in self.jobs.values() if j.job_id != job_id for f in j.flows
        }
        for i, spec in enumerate(specs):
            if spec.key in owner:
                raise RequestError(
                    f"{spec.describe()} is already scheduled by job '{owner[spec.key]}'",
                    f"flows[{i}]",
                    status=409,
                )
        # Ids of every current flow stay reserved, including those this change removes: their
        # meters are deleted last, after the new entries are in (deleting a meter also deletes
        # the entries that use it).
        used_meters: dict[int, set[int]] = {}
        for j in self.jobs.values():
            for f in j.flows:
                used_meters.setdefault(self._first_dpid(f.spec), set()).add(f.meter_id)
        used_nos = {f.flow_no for f in kept.values()}
        next_no, next_meter = 1, {}
        flows = []
        for i, spec in enumerate(specs):
            if spec.key in kept:
                flows.append(InstalledFlow(spec, kept[spec.key].flow_no, kept[spec.key].meter_id))
                continue
            while next_no in used_nos:
                next_no += 1
            if next_no > MAX_SEQ:
                raise RequestError("too many flows in one job", f"flows[{i}]", status=409)
            used_nos.add(next_no)
            dpid = self._first_dpid(spec)
            used = used_meters.setdefault(dpid, set())
            meter_id = next_meter.get(dpid, 1)
            while meter_id in used:
                meter_id += 1
            if meter_id > meter_limit(dpid):
                raise RequestError(
                    f"switch '{spec.path[0]}' has no free meter (it supports {meter_limit(dpid)})",
                    f"flows[{i}]",
                    status=409,
                )
            used.add(meter_id)
            next_meter[dpid] = meter_id + 1
            flows.append(InstalledFlow(spec, next_no, meter_id))
        seq = old.seq if old else self.next_seq
        if seq > MAX_SEQ:
            raise RequestError("job numbers exhausted; restart with a fresh state file", status=409)
        return Job(job_id, seq, tuple(flows))

    def commit(self, job: Job) -> None:
        self.jobs = {**self.jobs, job.job_id: job}
        self.next_seq = max(self.next_seq, job.seq + 1)

    def remove(self, job_id: str) -> None:
        self.jobs = {k: v for k, v in self.jobs.items() if k != job_id}

    # --- what the switches must contain ---------------------------------------------------------

    def rules(self, job: Job | None) -> list[Rule]:
        if job is None:
            return []
        return [
            r
            for f in job.flows
            for rules in job_rules(f.spec, self.topo, job.seq, f.flow_no, f.meter_id)
            for r in rules
        ]

    def meters(self, job: Job | None) -> list[Meter]:
        if job is None:
            return []
        return [
            Meter(self._first_dpid(f.spec), f.meter_id, *self.policy.params(f.spec.rate_mbps))
            for f in job.flows
        ]

    def switch_contents(self, dpid: int) -> tuple[list[Rule], list[Meter]]:
        """Everything switch `dpid` must hold: the default rules and every job's entries."""
        rules = [r for r in self._defaults if r.dpid == dpid]
        meters = []
        for job in self.jobs.values():
            rules += [r for r in self.rules(job) if r.dpid == dpid]
            meters += [m for m in self.meters(job) if m.dpid == dpid]
        return rules, meters

    def _first_dpid(self, spec: FlowSpec) -> int:
        return self.topo.switch(spec.path[0]).dpid

    # --- the state file -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "topology": self.topo.name,
            "next_seq": self.next_seq,
            "jobs": [
                {
                    "job": j.job_id,
                    "seq": j.seq,
                    "updated": j.updated,
                    "flows": [
                        f.spec.to_json() | {"flow_no": f.flow_no, "meter_id": f.meter_id}
                        for f in j.flows
                    ],
                }
                for j in self.jobs.values()
            ],
        }

    def save(self, path: Path) -> None:
        """Write atomically (temp file + rename): a crash leaves the old or the new file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.to_json(), f, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def load(self, path: Path) -> None:
        """Replace the table with the jobs in `path` (no file: nothing to load), validating every
        job against the topology."""
        if not path.exists():
            return
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise StateError(f"{path}: cannot read the state file: {e}") from None
        if (
            not isinstance(doc, dict)
            or doc.get("version") != STATE_VERSION
            or not isinstance(doc.get("jobs"), list)
        ):
            raise StateError(
                f"{path}: not a state file of version {STATE_VERSION} "
                '(expected {"version": 1, "jobs": [...]})'
            )
        if doc.get("topology") != self.topo.name:
            raise StateError(
                f"{path}: written for topology '{doc.get('topology')}', not "
                f"'{self.topo.name}'; use another --state file or delete it"
            )
        self.jobs, self.next_seq = {}, 1
        for i, item in enumerate(doc["jobs"]):
            where = f"{path}: jobs[{i}]"
            try:
                job_id = parse_job_id(str(item["job"]))
                raw = item["flows"]
                specs = parse_flows(
                    {
                        "flows": [
                            {k: v for k, v in f.items() if k not in ("flow_no", "meter_id")}
                            for f in raw
                        ]
                    },
                    self.topo,
                )
                flows = tuple(
                    InstalledFlow(s, int(f["flow_no"]), int(f["meter_id"]))
                    for s, f in zip(specs, raw)
                )
                self.commit(Job(job_id, int(item["seq"]), flows, float(item["updated"])))
            except RequestError as e:
                raise StateError(f"{where}: {e}") from None
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise StateError(f"{where}: malformed job entry ({e!r})") from None
        self.next_seq = max(self.next_seq, int(doc.get("next_seq", 1)))
