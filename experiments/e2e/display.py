"""The live view of a run: one overall progress bar with an ETA, the current run's jobs (state,
network, placement, latest accuracy) and the busiest links; in a log (no terminal), one line per
job state change and per job's first accuracy, and a summary every 30 s."""

from __future__ import annotations

import time

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table


class Display:
    def __init__(self, console: Console, runs: int):
        self.console, self.runs = console, runs
        self.live: Live | None = None
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} runs"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.bar = self.progress.add_task("all runs", total=runs)
        self.started = time.monotonic()
        self._last: dict[str, str] = {}
        self._printed = 0.0

    def __enter__(self) -> Display:
        if self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=2, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.live.__exit__(None, None, None)

    def run_done(self, done: int) -> None:
        self.progress.update(self.bar, completed=done)
        if self.live is None:
            spent = time.monotonic() - self.started
            left = spent / done * (self.runs - done) if done else 0.0
            self.console.print(
                f"  {done}/{self.runs} runs done in {spent / 60:.1f} min; "
                f"about {left / 60:.1f} min to go"
            )

    def update(self, title: str, elapsed: float, jobs: list[dict], links: list[dict]) -> None:
        if self.live is None:  # a log (CI)
            self._log(elapsed, jobs)
            return
        jt = Table(
            "job",
            "state",
            "network",
            "placement",
            "accuracy",
            "iter",
            title=f"{title}  [dim]{elapsed:.0f} s[/]",
            title_justify="left",
        )
        for j in jobs:
            att = j["attempts"][-1] if j["attempts"] else None
            where = " ".join(sorted(att["placement"].values())) if att else j["reason"][:50]
            jt.add_row(
                j["name"],
                j["state"],
                att.get("network", "") if att else "",
                where,
                fmt(j["progress"]["accuracy"]),
                str(j["progress"]["iteration"] or ""),
            )
        lt = Table(
            "link",
            "measured Mbit/s",
            "granted",
            "unscheduled",
            "capacity",
            title="busiest links",
            title_justify="left",
        )
        busy = sorted(
            (lk for lk in links if lk["measured_mbps"]),
            key=lambda lk: -lk["measured_mbps"] / lk["capacity_mbps"],
        )[:6]
        for lk in busy:
            lt.add_row(
                f"{lk['src']}→{lk['dst']}{'' if lk.get('up', True) else ' (down)'}",
                f"{lk['measured_mbps']:.1f}",
                f"{lk['granted_mbps']:.0f}",
                f"{lk['unscheduled_mbps']:.0f}",
                f"{lk['capacity_mbps']:.0f}",
            )
        self.live.update(Group(self.progress, jt, lt))

    def _log(self, elapsed: float, jobs: list[dict]) -> None:
        """One line per state change and per first accuracy; a summary every 30 s."""
        for j in jobs:
            acc = j["progress"]["accuracy"]
            key = f"{j['state']} {j['reason']}" + (" (evaluating)" if acc is not None else "")
            if self._last.get(j["name"]) != key:
                self._last[j["name"]] = key
                self.console.print(
                    f"  {elapsed:6.1f} s  {j['name']}: {j['state']} "
                    f"{j['reason']}" + (f" acc={fmt(acc)}" if acc is not None else "")
                )
        if elapsed - self._printed >= 30:
            self._printed = elapsed
            self.console.print(
                f"  {elapsed:6.1f} s  "
                + ", ".join(f"{j['name']} acc={fmt(j['progress']['accuracy'])}" for j in jobs)
            )


def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"
