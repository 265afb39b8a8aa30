"""Scenarios: what `experiments/run.py` runs (jobs, background traffic, schedulers, seeds), read
and checked completely before anything is created. Every problem is a `ScenarioError` naming the
file, the field and what was expected."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from scheduler.baselines import make_algorithm
from scheduler.jobs import JobDocument, JobError, load_job_documents, parse_job
from scheduler.multi import make_policy
from master.scheduling import QUEUES
from topologies import Topology, load_topology

HERE = Path(__file__).resolve().parent.parent
REPO = HERE.parent
SCENARIOS = HERE / "scenarios"


# --- the scenario ------------------------------------------------------------------------------
class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the file, the field and what was expected."""


@dataclass(frozen=True)
class Background:
    src: str
    dst: str
    mbps: float
    path: tuple[str, ...] = ()  # switches; empty: the SDN app's default forwarding


@dataclass
class Scenario:
    name: str
    source: str
    topology: str
    schedulers: list[str]
    seeds: int
    timeout_s: float
    jobs: list[JobDocument]
    background: list[Background] = field(default_factory=list)
    description: str = ""


SCENARIO_KEYS = {"name", "description", "topology", "schedulers", "seeds", "timeout_s",
                 "background", "jobs"}


def load_scenario(path: Path) -> Scenario:
    where = str(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ScenarioError(f"{where}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{where}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise ScenarioError(f"{where}: expected a mapping with {', '.join(sorted(SCENARIO_KEYS))}")

    def bad(field_: str, expected: str) -> ScenarioError:
        got = doc.get(field_.split(".")[0].split("[")[0], None)
        return ScenarioError(f"{where}: field '{field_}': expected {expected}, got {got!r}")

    unknown = sorted(set(doc) - SCENARIO_KEYS)
    if unknown:
        raise bad(unknown[0], f"one of the known keys ({', '.join(sorted(SCENARIO_KEYS))})")
    if not isinstance(doc.get("name"), str):
        raise bad("name", "a string")
    schedulers = doc.get("schedulers")
    if not isinstance(schedulers, list) or not schedulers or \
            not all(isinstance(s, str) for s in schedulers):
        raise bad("schedulers", "a non-empty list of scheduler names")
    seeds, timeout = doc.get("seeds", 1), doc.get("timeout_s", 600)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise bad("seeds", "an integer >= 1")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise bad("timeout_s", "a number of seconds > 0")
    jobs = doc.get("jobs")
    if isinstance(jobs, str):
        jobs_path = (path.parent / jobs).resolve()
        try:
            docs = load_job_documents(jobs_path)
        except JobError as e:
            raise ScenarioError(f"{where}: field 'jobs': {e}") from None
    elif isinstance(jobs, list) and jobs:
        try:
            docs = [JobDocument(where, j, parse_job(j, where, i)) for i, j in enumerate(jobs)]
        except JobError as e:
            raise ScenarioError(str(e)) from None
    else:
        raise bad("jobs", "a non-empty list of jobs or the path of a job file/folder")
    background = []
    for i, b in enumerate(doc.get("background") or []):
        f = f"background[{i}]"
        if not isinstance(b, dict) or set(b) - {"src", "dst", "mbps", "path"} or \
                not isinstance(b.get("src"), str) or not isinstance(b.get("dst"), str) or \
                not isinstance(b.get("mbps"), (int, float)) or b["mbps"] <= 0 or \
                not isinstance(b.get("path", []), list):
            raise ScenarioError(f"{where}: field '{f}': expected {{src: NODE, dst: NODE, mbps: "
                                f"RATE > 0, path: [SWITCH, ...] (optional)}}, got {b!r}")
        background.append(Background(b["src"], b["dst"], float(b["mbps"]),
                                     tuple(b.get("path", []))))
    return Scenario(doc["name"], where, str(doc.get("topology", "campus")), list(schedulers),
                    seeds, float(timeout), docs, background, str(doc.get("description", "")))


@dataclass
class Plan:
    """Everything a run needs, checked before anything is created."""
    scenario: Scenario
    topo: Topology
    schedulers: list[str]
    seeds: int
    out: Path
    warnings: list[str] = field(default_factory=list)


def plan(args: argparse.Namespace) -> Plan:
    """Resolve and check every input; any problem is a ScenarioError/TopologyError/JobError."""
    scenario = load_scenario(Path(args.scenario) if args.scenario
                             else SCENARIOS / ("quick.yaml" if args.quick else "default.yaml"))
    seeds = scenario.seeds if args.seeds is None else args.seeds
    if seeds < 1:
        raise ScenarioError(f"--seeds: expected an integer >= 1, got {seeds}")
    topo = load_topology(args.topo or scenario.topology)
    if args.jobs:
        scenario.jobs = load_job_documents(args.jobs)
    names = [d.job.name for d in scenario.jobs]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{scenario.source}: job names must be unique, got {names}")
    schedulers = args.schedulers.split(",") if args.schedulers else scenario.schedulers
    for name in schedulers:
        try:
            make_policy(name) if name in QUEUES else make_algorithm(name, seed=0)
        except (OSError, ValueError, RuntimeError) as e:
            raise ScenarioError(f"--schedulers: '{name}' cannot be used: {e}") from None
    nodes = {n.name for n in topo.nodes}
    switches = {s.name for s in topo.switches}
    warnings, background = [], []
    for b in scenario.background:
        missing = [v for v in (b.src, b.dst) if v not in nodes] + \
                  [v for v in b.path if v not in switches]
        if missing:
            warnings.append(f"background {b.src}->{b.dst} skipped: {', '.join(missing)} not in "
                            f"topology {topo.name}")
        else:
            background.append(b)
    scenario.background = background
    out = Path(args.out or REPO / "results" / "e2e" / (scenario.name + "-" + topo.name))
    return Plan(scenario, topo, schedulers, seeds, out, warnings)
