"""The live view of a run: its jobs (state, placement, accuracy) and the busiest links; in a
log (no terminal), one line per state change and a summary every 30 s."""
from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table


class Display:
    """Live progress: the run, its jobs (state, placement, accuracy) and the busiest links."""

    def __init__(self, console: Console):
        self.console = console
        self.live: Live | None = None
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

    def update(self, title: str, elapsed: float, jobs: list[dict], links: list[dict]) -> None:
        if self.live is None:  # a log (CI): one line per state change, a summary every 30 s
            for j in jobs:
                key = f"{j['state']} {j['reason']}"
                if self._last.get(j["name"]) != key:
                    self._last[j["name"]] = key
                    self.console.print(f"  {elapsed:6.1f} s  {j['name']}: {key}")
            if elapsed - self._printed >= 30:
                self._printed = elapsed
                self.console.print(f"  {elapsed:6.1f} s  " + ", ".join(
                    f"{j['name']} acc={fmt(j['progress']['accuracy'])}" for j in jobs))
            return
        jt = Table("job", "state", "placement", "accuracy", "iter", title=f"{title}  "
                   f"[dim]{elapsed:.0f} s[/]", title_justify="left")
        for j in jobs:
            att = j["attempts"][-1] if j["attempts"] else None
            where = " ".join(sorted(att["placement"].values())) if att else j["reason"][:50]
            jt.add_row(j["name"], j["state"], where, fmt(j["progress"]["accuracy"]),
                       str(j["progress"]["iteration"] or ""))
        lt = Table("link", "measured Mbit/s", "granted", "background", "capacity",
                   title="busiest links", title_justify="left")
        busy = sorted((lk for lk in links if lk["measured_mbps"]),
                      key=lambda lk: -lk["measured_mbps"] / lk["capacity_mbps"])[:6]
        for lk in busy:
            lt.add_row(f"{lk['src']}→{lk['dst']}", f"{lk['measured_mbps']:.1f}",
                       f"{lk['granted_mbps']:.0f}", f"{lk['background_mbps']:.0f}",
                       f"{lk['capacity_mbps']:.0f}")
        self.live.update(Group(jt, lt))


def fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}"
