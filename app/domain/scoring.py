"""From measurements to ratings (pure): the linear latency model and the 0-10 performance score.

- Niedermayer et al. §5.5: the time to process a packet is linear in its size,
  ``ns = a * bytes + b`` (``a``: per-byte cost, ``b``: per-packet overhead); fitted by
  least squares over the sizes of Niedermayer et al. Table 4 (64, 300, 700, 1400 B).
- The score keeps ``standards-2026``'s documented mapping, so measured and published
  tables sit on one scale. Both maps are logarithmic, so equal speed *ratios* are equal
  score steps (as ESAF's Table 14 steps are), and clamped to 0-10:

  data plane (MB/s at 1400 B)::

      performance = clamp(10 * log10(MB/s) / log10(2000), 0, 10)
      1 MB/s -> 0,  10 MB/s -> 3.03,  100 MB/s -> 6.06,  1 GB/s -> 9.09,  >= 2 GB/s -> 10

  key exchange (ops/s, one op = key generation + shared secret on one side)::

      performance = clamp(10 * log10(ops/s) / 5, 0, 10)
      10/s -> 2,  100/s -> 4 (MODP-6144/8192),  1000/s -> 6 (MODP-3072, Brainpool),
      10 000/s -> 8 (X25519, P-256),  >= 100 000/s -> 10

  Each step up the score is a factor 2000^(1/10) = 2.14 in throughput, or 10^(1/2) = 3.16
  in key exchanges per second. Both are monotone: a faster measurement is never scored
  lower (tested with Hypothesis), and both round to two decimals.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.domain.errors import InvalidInput
from app.domain.ratings import Measurement, Rating, RatingTable

__all__ = [
    "SIZES",
    "Fit",
    "MicroResult",
    "combine_repeats",
    "fit_linear",
    "kex_score",
    "low_estimate",
    "measured_table",
    "split_half_spread",
    "throughput_score",
]

#: Packet sizes of Niedermayer et al. Table 4.
SIZES: tuple[int, ...] = (64, 300, 700, 1400)


@dataclass(frozen=True, slots=True)
class Fit:
    """``ns = a * bytes + b`` and how well it fits."""

    a: float
    b: float
    r2: float

    def at(self, size: int) -> float:
        return self.a * size + self.b


def fit_linear(points: Sequence[tuple[float, float]]) -> Fit:
    """Least-squares line through (size, time) points.

    Raises:
        InvalidInput: fewer than two distinct sizes.
    """
    if len({x for x, _ in points}) < 2:
        raise InvalidInput("a fit needs at least two distinct packet sizes")
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    sxy = sum((x - mx) * (y - my) for x, y in points)
    a = sxy / sxx
    b = my - a * mx
    ss_tot = sum((y - my) ** 2 for _, y in points)
    ss_res = sum((y - (a * x + b)) ** 2 for x, y in points)
    return Fit(a, b, 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0)


def low_estimate(runs: Sequence[float]) -> float:
    """The 10th percentile of many short timed batches: the cost with the least interference
    (a shared, frequency-scaled VM slows some batches; none runs faster than the work)."""
    ordered = sorted(runs)
    return ordered[max(0, int(len(ordered) * 0.1) - 1)] if len(ordered) >= 10 else ordered[0]


def split_half_spread(runs: Sequence[float]) -> float:
    """How reproducible :func:`low_estimate` is: the relative difference between the
    estimates of the first and second half of the runs (interleaved in time)."""
    if len(runs) < 20:
        return 1.0
    first, second = low_estimate(runs[0::2]), low_estimate(runs[1::2])
    whole = low_estimate(runs)
    return abs(first - second) / whole if whole > 0 else 0.0


def throughput_score(mb_per_s: float) -> float:
    """Data-plane performance 0-10 from MB/s at 1400 B (standards-2026's mapping)."""
    if mb_per_s <= 1:
        return 0.0
    return round(min(10.0, max(0.0, 10 * math.log10(mb_per_s) / math.log10(2000))), 2)


def kex_score(ops_per_s: float) -> float:
    """Key-exchange performance 0-10 from (keygen + shared secret) operations per second."""
    if ops_per_s <= 1:
        return 0.0
    return round(min(10.0, max(0.0, 10 * math.log10(ops_per_s) / 5)), 2)


@dataclass(frozen=True)
class MicroResult:
    """One algorithm's micro benchmark: median ns per packet at each size, and the runs' spread."""

    keyword: str
    ns_by_size: Mapping[int, float]
    spread: float
    samples: int
    method: str
    ops_per_s: float | None = None  # key exchange only

    @property
    def fit(self) -> Fit:
        return fit_linear(sorted(self.ns_by_size.items()))

    @property
    def mb_per_s(self) -> float:
        """Throughput at 1400 B (bytes per microsecond = MB/s)."""
        return 1400 / self.ns_by_size[1400] * 1000

    def per_byte(self) -> tuple[float, float]:
        """``a`` (ns per byte) and ``b`` (ns per packet) of the :attr:`fit`; where the fit's slope
        is not positive (noise larger than the cost of the bytes between the sizes: no byte is
        free), the whole 1400 B time spread over its bytes and no fixed part, an upper bound."""
        fit = self.fit
        if fit.a > 0:
            return fit.a, fit.b
        return self.ns_by_size[1400] / 1400, 0.0


def combine_repeats(sweeps: Sequence[Sequence[MicroResult]]) -> list[MicroResult]:
    """Several sweeps of the same algorithms as one: per algorithm the median of each figure
    (ns per size, or ops/s), samples added, and as spread the larger of the sweeps' median
    split-half spread and the repeats' own spread (range over median of the 1400 B time or of
    ops/s) - so a figure that moved between sweeps says so.

    Raises:
        InvalidInput: no sweeps, or sweeps of different algorithms.
    """
    if not sweeps:
        raise InvalidInput("nothing to combine")
    order = [r.keyword for r in sweeps[0]]
    if any([r.keyword for r in sweep] != order for sweep in sweeps):
        raise InvalidInput("the sweeps measured different algorithms")
    combined = []
    for i, keyword in enumerate(order):
        runs = [sweep[i] for sweep in sweeps]
        first = runs[0]
        inner = statistics.median(r.spread for r in runs)
        if first.ops_per_s is not None:
            values = [r.ops_per_s or 0.0 for r in runs]
            ns: dict[int, float] = {}
            ops: float | None = statistics.median(values)
        else:
            ns = {size: statistics.median(r.ns_by_size[size] for r in runs) for size in first.ns_by_size}
            values = [r.ns_by_size[max(ns)] for r in runs]
            ops = None
        middle = statistics.median(values)
        between = (max(values) - min(values)) / middle if len(runs) > 1 and middle > 0 else 0.0
        combined.append(MicroResult(keyword=keyword, ns_by_size=ns, spread=max(inner, between),
                                    samples=sum(r.samples for r in runs), method=first.method, ops_per_s=ops))
    return combined


def measured_table(
    *, name: str, base: RatingTable, results: Sequence[MicroResult], machine: str, backend: str, date: str,
    description: str,
) -> RatingTable:
    """A rating table from measurements: security levels copied from ``base``, performance
    and :class:`Measurement` from the runs. Algorithms ``base`` does not rate are left out."""
    rows = []
    for result in results:
        rated = base.get(result.keyword)
        if rated is None:
            continue
        if result.ops_per_s is not None:
            # A key exchange has no throughput or a/b; its rate goes into the method text.
            performance = kex_score(result.ops_per_s)
            measurement = Measurement(machine=machine, backend=backend, date=date, samples=result.samples,
                                      method=f"{result.method}: {result.ops_per_s:.0f} ops/s",
                                      spread=round(result.spread, 4))
        else:
            a, b = result.per_byte()
            performance = throughput_score(result.mb_per_s)
            measurement = Measurement(
                throughput_mbps=round(result.mb_per_s * 8, 1), a_ns_per_byte=round(a, 4),
                b_ns=round(b, 1), machine=machine, backend=backend, date=date, samples=result.samples,
                method=result.method, spread=round(result.spread, 4),
            )
        rows.append(Rating(
            algorithm=rated.algorithm, confidentiality=rated.confidentiality, integrity=rated.integrity,
            key_exchange=rated.key_exchange, post_quantum=rated.post_quantum, performance=performance,
            source="measurement",
            reason=f"levels from {base.name}; performance measured ({result.method})",
            requirement=rated.requirement, measurement=measurement,
        ))
    if not rows:
        raise InvalidInput("no measured algorithm is rated in the base table")
    return RatingTable.of(name, rows, description=description, source=f"qoss bench micro on {machine}")
