"""How two schedulers compare over seeds: the ratio of a figure paired by seed, its 95 % interval
and a verdict against a target. One home for every "X vs Y" line of the summaries and the
benchmarks.

The ratio is a geometric mean over seeds (each seed's X / Y), its interval Student's t over the
seeds' log ratios — the paired design takes the seed-to-seed spread both schedulers share (the
same background draw, the same host hour) out of the comparison. A verdict says `met` when the
whole interval is on the target's side, `missed` when it is wholly on the other, `inconclusive`
when it straddles the target (or one seed gives no interval).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

LEVEL = 0.95


@dataclass(frozen=True)
class Ratio:
    """X / Y paired over `n` seeds: the geometric mean `ratio` and its interval [low, high]
    (None with one seed)."""

    ratio: float
    low: float | None
    high: float | None
    n: int

    def judge(self, below: float) -> str:
        """`met` when X / Y is below `below` with 95 % confidence, `missed` when it is not below
        it with the same confidence, else `inconclusive`."""
        if self.low is None or self.high is None:
            return "inconclusive"
        if self.high < below:
            return "met"
        if self.low >= below:
            return "missed"
        return "inconclusive"

    def text(self, digits: int = 3) -> str:
        interval = (
            f"[{self.low:.{digits}f}, {self.high:.{digits}f}]"
            if self.low is not None and self.high is not None
            else "(one seed: no interval)"
        )
        return f"{self.ratio:.{digits}f} {interval}, {self.n} seeds"

    def to_json(self) -> dict:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "n": self.n}

    def seeds_for_verdict(self, target: float, level: float = LEVEL, most: int = 100) -> int | None:
        """The seeds after which, at the spread of these and the same ratio, the interval would
        lie wholly on one side of `target` (met or missed): what an inconclusive verdict would
        cost to settle. None with one seed, a ratio at the target, or more than `most`."""
        if self.low is None or self.high is None or self.n < 2:
            return None
        effect = abs(math.log(target / self.ratio))
        half = math.log(self.high / self.ratio)
        if effect == 0:
            return None
        sd = half * math.sqrt(self.n) / scipy_stats.t.ppf(0.5 + level / 2, self.n - 1)
        return next(
            (
                m
                for m in range(2, most + 1)
                if scipy_stats.t.ppf(0.5 + level / 2, m - 1) * sd / math.sqrt(m) < effect
            ),
            None,
        )


def paired_ratio(xs: Sequence[float], ys: Sequence[float], level: float = LEVEL) -> Ratio:
    """X / Y over pairs (xs[i], ys[i]) of positive figures of the same seed."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"paired_ratio: {len(xs)} and {len(ys)} values; expected equal, > 0")
    logs = [math.log(x / y) for x, y in zip(xs, ys, strict=True)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return Ratio(round(math.exp(mean), 4), None, None, 1)
    half = scipy_stats.t.ppf(0.5 + level / 2, len(logs) - 1) * statistics.stdev(logs)
    half /= math.sqrt(len(logs))
    return Ratio(
        round(math.exp(mean), 4),
        round(math.exp(mean - half), 4),
        round(math.exp(mean + half), 4),
        len(logs),
    )


def mean_interval(xs: Sequence[float], level: float = LEVEL) -> tuple[float, float | None]:
    """(mean, half-width of its Student's t interval; None with one value)."""
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return mean, None
    half = scipy_stats.t.ppf(0.5 + level / 2, len(xs) - 1) * statistics.stdev(xs)
    return mean, half / math.sqrt(len(xs))
