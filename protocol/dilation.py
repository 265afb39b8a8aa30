"""Time dilation: a host too small for what it emulates runs it K times slower (SELENA, ANCS 2014;
virtual-time Mininet, Yan & Jin), so that every emulated second gets K seconds of the host.

Every part of the system keeps speaking *emulated* units — Mbit/s, cores, seconds — and converts
where it touches the host: what it enforces is divided by K (a link's HTB rate, a meter, a tc
class, a CPU quota, a tenant's paced rate), what it measures is multiplied back (a rate or a CPU
use computed over an emulated span), and its clock runs K times slower than the host's, from a
common `origin` (the run's start), so that the instants the Master, the agents, the SDN app and
the workers record on their own clocks still line up. A component given no dilation (K = 1, the
default; always on real hosts) is unchanged.

What cannot be dilated this way is said where it matters: the kernel's TCP timers (minimum RTO
200 ms, delayed ACKs) run on the host's clock, and so do container start-up and the scheduler's
own decision time (reported as measured, in host milliseconds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Dilation:
    factor: float = 1.0  # K: host seconds per emulated second
    origin: float = 0.0  # the epoch second (host clock) at which both clocks agree

    def __post_init__(self) -> None:
        if not 1.0 <= self.factor < float("inf"):  # also refuses nan
            raise ValueError(f"a time dilation factor is a number >= 1, got {self.factor!r}")

    @property
    def on(self) -> bool:
        return self.factor != 1.0

    # --- clocks: emulated seconds ----------------------------------------------------------------
    def time(self) -> float:
        """The emulated epoch: `origin` + emulated seconds since then."""
        return self.emulated_instant(time.time())

    def monotonic(self) -> float:
        return time.monotonic() / self.factor

    def sleep(self, seconds: float) -> None:
        time.sleep(self.host_seconds(seconds))

    def emulated_instant(self, host_epoch: float) -> float:
        """An instant of the host's clock (epoch seconds) on the emulated clock."""
        return self.origin + (host_epoch - self.origin) / self.factor

    def host_seconds(self, seconds: float) -> float:
        """How long an emulated span lasts on the host (a period, a timeout, a link delay)."""
        return seconds * self.factor

    def emulated_seconds(self, host_seconds: float) -> float:
        return host_seconds / self.factor

    # --- resources: what the host enforces for an emulated amount, and back -----------------------
    def host_mbps(self, mbps: float) -> float:
        return mbps / self.factor

    def emulated_mbps(self, host_mbps: float) -> float:
        return host_mbps * self.factor

    def host_cores(self, cores: float) -> float:
        return cores / self.factor

    def emulated_cores(self, host_cores: float) -> float:
        return host_cores * self.factor

    # --- on a command line and in a worker's environment ----------------------------------------
    def spec(self) -> str:
        return f"{self.factor:g}@{self.origin:.6f}"

    @classmethod
    def parse(cls, text: str | None) -> Dilation:
        """`K` or `K@ORIGIN` (what `spec` writes); None or '' is no dilation. ValueError names
        what was expected."""
        if not text:
            return cls()
        factor, _, origin = text.partition("@")
        try:
            return cls(float(factor), float(origin) if origin else time.time())
        except ValueError:
            raise ValueError(
                f"time dilation: expected K or K@ORIGIN (K >= 1, ORIGIN epoch seconds), got {text!r}"
            ) from None


NONE = Dilation()
