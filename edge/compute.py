"""The edge agent's Compute Manager: worker containers on the local Docker engine.

Workers are started with `edge.workers` (quota, the node's network namespace and cgroup
parent). A worker writes its metric lines as JSON to stdout; a thread per worker follows the
container's log stream, keeps every line in `workdir/<worker>.jsonl` and queues it for the next
heartbeat, and when the stream ends (the container stopped) records the exit code and wakes the
Messenger, so the Master hears of a dead worker within a second or so. A restarted agent follows
the workers it adopts from their first line again: it keeps the lines its file lacks and sends
those the Master lacks (the registration reply says how many it holds), so none is lost or
doubled by the restart.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container

from protocol.dilation import NONE, Dilation
from protocol.messages import WorkerSpec, WorkerState
from protocol.worker import DILATION_ENV, START_ENV

from . import cgroups, workers

log = logging.getLogger(__name__)

LABEL_NODE = "ces.agent.node"  # marks the containers an agent owns
LABEL_WORKER = "ces.worker"


@dataclass
class Worker:
    spec: WorkerSpec
    container: Container
    state: str = "running"
    exit_code: int | None = None
    detail: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    def status(self) -> WorkerState:
        return WorkerState(
            self.spec.name, self.spec.job, self.spec.task, self.state, self.exit_code, self.detail
        )


class ComputeManager:
    def __init__(
        self,
        client: docker.DockerClient,
        node: str,
        name_prefix: str,
        workdir: Path,
        node_container: str | None = None,
        cgroup_parent: str | None = None,
        on_change: Callable[[], None] = lambda: None,
        dilation: Dilation = NONE,
    ):
        self.client, self.node, self.name_prefix = client, node, name_prefix
        self.dilation = dilation
        self.workdir = workdir
        self.node_container, self.cgroup_parent = node_container, cgroup_parent
        self.on_change = on_change
        self.workers: dict[str, Worker] = {}
        self._starting: set[str] = set()  # asked to start, container not made yet
        self.lock = threading.Lock()
        self._records: list[dict] = []

    def container_name(self, worker: str) -> str:
        return f"{self.name_prefix}{worker}"

    # --- commands -------------------------------------------------------------------------------
    def start(self, spec: WorkerSpec) -> WorkerState:
        with self.lock:
            if spec.name in self.workers:
                return self.workers[spec.name].status()  # idempotent: a retried request
            self._starting.add(spec.name)
        # The worker's clock: when its container started, and how fast emulated time runs.
        env = {**spec.env, START_ENV: f"{self.dilation.time():.3f}"}
        if self.dilation.on:
            env[DILATION_ENV] = self.dilation.spec()
        try:
            container = workers.start_worker(
                self.client,
                spec.image,
                self.container_name(spec.name),
                spec.command,
                self.dilation.host_cores(spec.cpu),
                int(spec.mem_mb),
                env=env,
                node_container=self.node_container,
                cgroup_parent=self.cgroup_parent,
                labels={LABEL_NODE: self.node, LABEL_WORKER: spec.name, "ces.job": spec.job},
                period_us=cgroups.period_us(self.dilation.factor),
            )
        except BaseException:
            with self.lock:
                self._starting.discard(spec.name)
            raise
        worker = Worker(spec, container)
        with self.lock:
            self.workers[spec.name] = worker
            self._starting.discard(spec.name)
        threading.Thread(
            target=self._follow, args=(worker,), name=f"logs-{spec.name}", daemon=True
        ).start()
        log.info("started %s (%s)", spec.name, " ".join(spec.command))
        return worker.status()

    def stop(self, name: str) -> bool:
        """Stop and remove a worker; idempotent (the Master's command and a heartbeat reply
        may ask at the same time: one removes, the other finds it gone)."""
        with self.lock:
            worker = self.workers.pop(name, None)
        if worker is None:
            return False
        try:
            workers.stop_worker(self.client, self.container_name(name))
        except docker.errors.APIError as e:
            if e.status_code != 409:  # 409: docker is already removing it
                raise
        worker.done.wait(timeout=5)  # its last lines are in the file before we answer
        return True

    def stop_all(self) -> None:
        for name in list(self.workers):
            self.stop(name)

    def reconcile(
        self,
        expected: list[str],
        held: dict[str, int] | None = None,
        judged: set[str] | None = None,
    ) -> None:
        """After (re)registration: remove this agent's containers the Master does not expect
        (left by an earlier incarnation of the agent); those it expects are followed again,
        `held` saying how many of a worker's metric lines the Master has. Only containers named
        with this agent's prefix and labelled with its node: another run's agent for a node of
        the same name owns its own. `judged`: the workers this agent held when it asked; one it
        has started since (or is starting) was started by the Master after its reply: kept."""
        for c in workers.find_workers(self.client, self.name_prefix):
            if c.labels.get(LABEL_NODE) != self.node:
                continue
            name = c.labels.get(LABEL_WORKER, "")
            with self.lock:
                mine = name in self.workers or name in self._starting
                if mine and judged is not None and name not in judged:
                    continue
                adopt = name in expected and name not in self.workers
                if adopt:
                    spec = WorkerSpec(name, c.labels.get("ces.job", ""), "", "", [], 0, 0)
                    worker = Worker(spec, c)
                    self.workers[name] = worker
            if adopt:
                try:
                    with (self.workdir / f"{name}.jsonl").open("rb") as f:
                        kept = sum(1 for _ in f)
                except FileNotFoundError:
                    kept = 0
                sent = int((held or {}).get(name, 0))
                threading.Thread(
                    target=self._follow, args=(worker, kept, sent), daemon=True
                ).start()
            elif name not in expected:
                log.info("removing %s: the Master does not expect it", c.name)
                workers.stop_worker(self.client, c.name)

    # --- observation ----------------------------------------------------------------------------
    def states(self) -> list[WorkerState]:
        with self.lock:
            return [w.status() for w in self.workers.values()]

    def take_records(self) -> list[dict]:
        with self.lock:
            out, self._records = self._records, []
        return out

    def _follow(self, worker: Worker, kept: int = 0, sent: int = 0) -> None:
        """Follow the worker's stdout until the container stops; then record how it ended. Its
        first `kept` metric lines are in its file already, the first `sent` at the Master."""
        name = worker.spec.name
        out = (self.workdir / f"{name}.jsonl").open("a", encoding="utf-8")
        buf, pos = b"", 0
        try:
            for chunk in worker.container.logs(stream=True, follow=True, stdout=True, stderr=False):
                buf += chunk
                *lines, buf = buf.split(b"\n")
                pos = self._take(name, lines, out, pos, kept, sent)
            self._take(name, [buf], out, pos, kept, sent)
            result = worker.container.wait(timeout=30)
            worker.exit_code = int(result.get("StatusCode", -1))
            worker.detail = self._why(worker)
        except docker.errors.NotFound:
            worker.exit_code, worker.detail = None, "container removed"
        except Exception as e:  # the daemon went away, a timeout: report it, never hang
            worker.exit_code, worker.detail = None, f"lost track of the container: {e}"
        finally:
            out.close()
            worker.state = "exited" if worker.exit_code is not None else "missing"
            worker.done.set()
            log.info("%s ended: %s %s", name, worker.state, worker.exit_code)
            self.on_change()

    def _take(self, worker: str, lines: list[bytes], out, pos: int, kept: int, sent: int) -> int:
        """Keep (from the `kept`-th) and queue for the Master (from the `sent`-th) the metric
        lines among `lines`, the first of them the `pos`-th of the worker; the next position."""
        records = []
        for raw in lines:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue  # not a metric line (a stray print)
            if isinstance(rec, dict) and "type" in rec:
                if pos >= kept:
                    out.write(raw.decode() + "\n")
                if pos >= sent:
                    records.append({**rec, "worker": worker})
                pos += 1
        out.flush()
        if records:
            with self.lock:
                self._records += records
        return pos

    def _why(self, worker: Worker) -> str:
        """A short reason for a non-zero exit: OOM kill, else the last line of stderr."""
        if worker.exit_code == 0:
            return ""
        try:
            worker.container.reload()
            if worker.container.attrs["State"].get("OOMKilled"):
                limit = worker.container.attrs["HostConfig"].get("Memory") or 0
                return "killed: out of memory" + (
                    f" (memory limit {limit / 2**20:g} MiB)" if limit else ""
                )
            tail = worker.container.logs(stdout=False, stderr=True, tail=3).decode(errors="replace")
            lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
            return lines[-1][:300] if lines else ""
        except docker.errors.APIError:
            return ""
