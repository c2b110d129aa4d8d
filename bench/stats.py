"""Statistics for noisy benchmarks: summaries over repeats and an HDR-style latency histogram.

Why a histogram rather than a list of samples: open-loop latency runs produce many thousands of
samples in several worker processes; log-linear buckets (about 1.6% relative precision, like
HdrHistogram with 2 significant digits) keep percentiles honest up to p99.9 and max while the
state stays small enough to ship between processes and store in results.json.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

_SUB_BITS = 6
_SUB = 1 << _SUB_BITS  # 64 sub-buckets per power of two above 2 * _SUB


@dataclass(slots=True)
class Summary:
    """Median with min and max over repeats (the machine is noisy; one number would lie)."""

    median: float | None
    min: float | None
    max: float | None
    samples: list[float]

    @staticmethod
    def of(samples: Iterable[float | None]) -> "Summary":
        vals = [float(s) for s in samples if s is not None and not math.isnan(s)]
        if not vals:
            return Summary(None, None, None, [])
        return Summary(statistics.median(vals), min(vals), max(vals), vals)

    def to_json(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "samples": self.samples}


def bucket_index(value: int) -> int:
    """Log-linear bucket of a non-negative integer (exact below 128)."""
    if value < 2 * _SUB:
        return max(value, 0)
    shift = value.bit_length() - (_SUB_BITS + 1)
    return (shift + 1) * _SUB + ((value >> shift) - _SUB)


def bucket_bounds(index: int) -> tuple[int, int]:
    """[low, high] of the values falling in bucket `index`."""
    if index < 2 * _SUB:
        return index, index
    shift = index // _SUB - 1
    mant = index % _SUB + _SUB
    return mant << shift, ((mant + 1) << shift) - 1


@dataclass(slots=True)
class Histogram:
    """Latencies in microseconds. Mergeable and JSON-serialisable."""

    counts: dict[int, int] = field(default_factory=dict)
    count: int = 0
    total: int = 0
    min: int | None = None
    max: int | None = None

    def record(self, value_us: float) -> None:
        v = max(int(value_us), 0)
        i = bucket_index(v)
        self.counts[i] = self.counts.get(i, 0) + 1
        self.count += 1
        self.total += v
        self.min = v if self.min is None else min(self.min, v)
        self.max = v if self.max is None else max(self.max, v)

    def merge(self, other: "Histogram") -> None:
        for i, c in other.counts.items():
            self.counts[i] = self.counts.get(i, 0) + c
        self.count += other.count
        self.total += other.total
        if other.min is not None:
            self.min = other.min if self.min is None else min(self.min, other.min)
        if other.max is not None:
            self.max = other.max if self.max is None else max(self.max, other.max)

    def percentile(self, q: float) -> float | None:
        """Value at quantile q in [0, 1] (bucket midpoint, clamped to the exact min/max)."""
        if not self.count:
            return None
        if q >= 1.0:
            return float(self.max)
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            if seen >= rank:
                lo, hi = bucket_bounds(i)
                mid = (lo + hi) / 2
                return float(min(max(mid, self.min or 0), self.max or mid))
        return float(self.max)

    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def cdf(self) -> list[tuple[float, float]]:
        """(upper value of bucket, fraction of samples <= it), for CDF plots."""
        out = []
        seen = 0
        for i in sorted(self.counts):
            seen += self.counts[i]
            out.append((float(min(bucket_bounds(i)[1], self.max or 0)), seen / self.count))
        return out

    def to_json(self) -> dict:
        return {"counts": {str(k): v for k, v in sorted(self.counts.items())}, "count": self.count,
                "total": self.total, "min": self.min, "max": self.max}

    @staticmethod
    def from_json(d: dict) -> "Histogram":
        return Histogram({int(k): int(v) for k, v in d.get("counts", {}).items()},
                         int(d.get("count", 0)), int(d.get("total", 0)), d.get("min"), d.get("max"))


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float | None]:
    """Exact percentiles of a small list (nearest rank)."""
    if not values:
        return [None for _ in qs]
    s = sorted(values)
    return [s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))] for q in qs]
