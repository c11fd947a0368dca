"""The tunnel benchmark's pure parts: suites, pinning, statistics, the JSON document, and
measured suite throughputs turned into per-transform rating rows.

- A *suite* is one ESP proposal: an AEAD alone (``aes128gcm16``) or a cipher with an
  integrity algorithm (``aes128-sha256``, ``null-sha1``).
- The default suite list covers every ESP transform both gateways can use with the fewest
  tunnels (a "star"): every AEAD alone, every cipher with a reference integrity algorithm,
  every integrity algorithm with a reference cipher. Under the additive cost model
  (Niedermayer et al. Table 3: costs add) any other pair is predicted from these.
- *Pinning*: the tunnel service picks the cheapest feasible suite, so a benchmark asks
  for one suite by forbidding every other ESP candidate (the request's ``forbids``).
  IKE must still find a proposal; where the suite alone cannot give one (``null``, an
  ESP-only integrity algorithm without a PRF), further attempts leave one *helper*
  algorithm allowed for IKE, and the caller keeps the first attempt whose negotiated ESP
  suite is the one asked for. ``null`` suites ask for Objective-ID 2 (AH), which
  kernel-libipsec turns into integrity-only ESP, so a helper AEAD is not taken for ESP.
- Spread is ``(max - min) / median`` of the repetitions (with three repetitions an
  interquartile range says nothing).
- Per-transform figures from suite figures: time per byte (``t = 8000 / Mbit/s`` ns/B,
  or the charons' CPU time per byte) is taken as additive,
  ``t(cipher, integ) = u(cipher) + v(integ)``; an AEAD carries its whole suite time.
  ``u`` and ``v`` are fitted by least squares over the measured pairs (exact for the
  star). The split between a cipher and an integrity algorithm is only fixed up to a
  constant: the integrity algorithm of least marginal cost is charged
  :data:`INTEGRITY_FLOOR` of the fastest pair's time and the cipher the rest. Any
  suite's sum, and so every choice between suites, does not depend on that constant.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.algorithms import CATALOGUE, Kind, Protocol, catalogue_order, lookup
from app.domain.errors import InvalidInput, UnknownAlgorithm
from app.domain.negotiation import LIBIPSEC_NO_ESP
from app.domain.ratings import Measurement, Rating, RatingTable
from app.domain.scoring import throughput_score

__all__ = [
    "AH_OBJECTIVE_ID",
    "INTEGRITY_FLOOR",
    "PARALLEL_FLOWS",
    "PING_SIZES",
    "REFERENCE_CIPHER",
    "REFERENCE_INTEGRITY",
    "Pin",
    "Stat",
    "SuiteRun",
    "SuiteSpec",
    "bench_document",
    "default_suites",
    "esp_candidates",
    "micro_prior",
    "parse_suite",
    "pin_attempts",
    "pooled_log_sd",
    "shrink_to_prior",
    "split_costs",
    "split_times",
    "summarize",
    "tunnel_table",
]

#: ICMP payload sizes for RTT by packet size (Al Boloushi and Al Dhaheri Table 3; Niedermayer et al. Table 4's sizes).
PING_SIZES: tuple[int, ...] = (64, 300, 700, 1400)
#: Parallel TCP flows (Al Boloushi and Al Dhaheri Table 4).
PARALLEL_FLOWS: tuple[int, ...] = (1, 2, 4)
REFERENCE_CIPHER = "aes128"
REFERENCE_INTEGRITY = "sha256"
#: Share of the fastest pair's time charged to the cheapest integrity algorithm (see the module doc).
INTEGRITY_FLOOR = 0.05
#: Liu et al. Table 2-2, Objective-ID 2 (AH): on kernel-libipsec, integrity-only ESP.
AH_OBJECTIVE_ID = 2
_NS_PER_BYTE_AT_1_MBPS = 8000.0


# --------------------------------------------------------------------------- suites


@dataclass(frozen=True, slots=True)
class SuiteSpec:
    """One ESP suite: an AEAD alone, or a cipher with an integrity algorithm."""

    cipher: str
    integrity: str | None = None

    @property
    def aead(self) -> bool:
        return self.integrity is None

    @property
    def name(self) -> str:
        """The ESP proposal as strongSwan writes it (``aes128gcm16``, ``aes128-sha256``)."""
        return self.cipher if self.integrity is None else f"{self.cipher}-{self.integrity}"

    @property
    def transforms(self) -> tuple[str, ...]:
        return (self.cipher,) if self.integrity is None else (self.cipher, self.integrity)


def parse_suite(text: str) -> SuiteSpec:
    """``aes128gcm16`` or ``aes128-sha256`` (aliases resolved) as a :class:`SuiteSpec`.

    Raises:
        InvalidInput: not one AEAD, nor one cipher and one integrity algorithm usable in ESP.
    """
    parts = [p for p in text.strip().lower().split("-") if p]
    try:
        algs = [lookup(p) for p in parts]
    except UnknownAlgorithm as exc:
        raise InvalidInput(f"suite {text[:64]!r}: {exc.message}") from exc
    if not all(a.usable_in(Protocol.ESP) for a in algs):
        raise InvalidInput(f"suite {text[:64]!r}: every transform must be usable in ESP")
    kinds = [a.kind for a in algs]
    if kinds == [Kind.AEAD]:
        return SuiteSpec(algs[0].keyword)
    if kinds == [Kind.ENCRYPTION, Kind.INTEGRITY]:
        return SuiteSpec(algs[0].keyword, algs[1].keyword)
    raise InvalidInput(f"suite {text[:64]!r}: an AEAD alone, or a cipher then an integrity algorithm")


def esp_candidates(supported: Iterable[str], *, libipsec: bool, rated: Iterable[str] | None = None) -> list[str]:
    """ESP transforms (ciphers, AEADs, integrity) in catalogue order that every gateway
    supports, the back end can negotiate and (if given) the table rates."""
    keep = set(supported)
    if rated is not None:
        keep &= set(rated)
    out = []
    for alg in CATALOGUE.values():
        if alg.kind not in (Kind.ENCRYPTION, Kind.AEAD, Kind.INTEGRITY) or not alg.usable_in(Protocol.ESP):
            continue
        if libipsec and alg.keyword in LIBIPSEC_NO_ESP:
            continue
        if alg.keyword in keep:
            out.append(alg.keyword)
    return out


def default_suites(candidates: Sequence[str]) -> list[SuiteSpec]:
    """The star over ``candidates``: every AEAD; every cipher with the reference integrity
    algorithm; every integrity algorithm with the reference cipher (references fall back
    to the first candidate of their kind)."""
    aeads = [k for k in candidates if CATALOGUE[k].kind is Kind.AEAD]
    ciphers = [k for k in candidates if CATALOGUE[k].kind is Kind.ENCRYPTION]
    integs = [k for k in candidates if CATALOGUE[k].kind is Kind.INTEGRITY]
    out = [SuiteSpec(a) for a in aeads]
    if ciphers and integs:
        ref_c = REFERENCE_CIPHER if REFERENCE_CIPHER in ciphers else ciphers[0]
        ref_i = REFERENCE_INTEGRITY if REFERENCE_INTEGRITY in integs else integs[0]
        out += [SuiteSpec(c, ref_i) for c in ciphers]
        out += [SuiteSpec(ref_c, i) for i in integs if i != ref_i]
    return out


@dataclass(frozen=True, slots=True)
class Pin:
    """One way to ask the tunnel service for exactly one suite."""

    forbids: tuple[str, ...]
    objective_id: int | None = None
    helper: str | None = None


def pin_attempts(suite: SuiteSpec, candidates: Sequence[str]) -> list[Pin]:
    """Requests that should make the service choose ``suite``, most direct first.

    The first forbids every other ESP candidate. The next ones each leave one helper
    usable in IKE (an integrity algorithm with a PRF, an AEAD, a cipher), in catalogue
    order, for when IKE has nothing else; the caller checks which suite was negotiated.
    """
    keep = set(suite.transforms)
    objective = AH_OBJECTIVE_ID if suite.cipher == "null" else None
    others = [k for k in candidates if k not in keep]
    attempts = [Pin(tuple(others), objective)]
    helpers = sorted(
        (k for k in others if CATALOGUE[k].usable_in(Protocol.IKE)
         and (CATALOGUE[k].kind is not Kind.INTEGRITY or CATALOGUE[k].prf is not None)),
        key=lambda k: ({Kind.INTEGRITY: 0, Kind.AEAD: 1, Kind.ENCRYPTION: 2}[CATALOGUE[k].kind], catalogue_order(k)),
    )
    attempts += [Pin(tuple(o for o in others if o != h), objective, h) for h in helpers]
    return attempts


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True, slots=True)
class Stat:
    """Median of repeated samples and their spread ``(max - min) / median``."""

    median: float
    spread: float
    samples: tuple[float, ...]

    def as_dict(self, digits: int = 3) -> dict[str, Any]:
        return {"median": round(self.median, digits), "spread": round(self.spread, 4),
                "samples": [round(s, digits) for s in self.samples]}


def summarize(samples: Sequence[float]) -> Stat:
    """Median and spread of the samples.

    Raises:
        InvalidInput: no samples, or one that is not a finite number.
    """
    if not samples:
        raise InvalidInput("no samples to summarize")
    if not all(math.isfinite(s) for s in samples):
        raise InvalidInput("samples must be finite numbers")
    median = statistics.median(samples)
    spread = (max(samples) - min(samples)) / median if median > 0 else 0.0
    return Stat(median, spread, tuple(samples))


@dataclass
class SuiteRun:
    """What one suite (or the no-IPsec baseline, ``spec`` None) measured over the repetitions."""

    spec: SuiteSpec | None
    esp: str | None = None
    ike: str | None = None
    throughput_mbps: list[float] = field(default_factory=list)
    rtt_ms: dict[int, list[float]] = field(default_factory=dict)
    parallel_mbps: dict[int, list[float]] = field(default_factory=dict)
    #: What charon reported for the CHILD_SA after traffic (list-sas): algorithms and bytes.
    observed: list[dict[str, Any]] = field(default_factory=list)
    #: Both charons' CPU nanoseconds per byte carried, beside each single-flow throughput sample.
    cpu_ns_per_byte: list[float] = field(default_factory=list)
    #: UDP cells (:mod:`app.measure.domain.matrix`): ``throughput_mbps`` is then the highest UDP
    #: rate carried with at most 1 % loss; beside it the offered rate, the receiver's jitter and
    #: loss, and whether the loss limit was met, per repetition.
    offered_mbps: list[float] = field(default_factory=list)
    jitter_ms: list[float] = field(default_factory=list)
    loss_percent: list[float] = field(default_factory=list)
    within_loss_limit: list[bool] = field(default_factory=list)
    #: Every single measurement with its family, protocol, metric and flows or size (the document's ``samples``).
    samples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.spec is not None:
            out["esp"] = self.esp or self.spec.name
            out["ike"] = self.ike
        out["throughput_mbps"] = summarize(self.throughput_mbps).as_dict(1) if self.throughput_mbps else None
        out["rtt_ms"] = {str(size): summarize(v).as_dict(4) for size, v in sorted(self.rtt_ms.items()) if v}
        out["parallel_mbps"] = {str(n): summarize(v).as_dict(1) for n, v in sorted(self.parallel_mbps.items()) if v}
        if self.jitter_ms:  # a UDP cell's run
            out["offered_mbps"] = summarize(self.offered_mbps).as_dict(1)
            out["jitter_ms"] = summarize(self.jitter_ms).as_dict(4)
            out["loss_percent"] = summarize(self.loss_percent).as_dict(4)
            out["within_loss_limit"] = list(self.within_loss_limit)
        return out


def bench_document(
    *, machine: str, backend: str, date: str, repetitions: int, duration_s: float, baseline: SuiteRun,
    suites: Sequence[SuiteRun], cpus: Iterable[int] | None = None,
) -> dict[str, Any]:
    """The ``qoss-bench-tunnel`` JSON document (version 1).

    ``cpus``: the CPUs the charons, iperf3 and ping were pinned to (``null``: not pinned;
    documents written before the key existed have none and were not pinned).
    """
    return {
        "kind": "qoss-bench-tunnel",
        "version": 1,
        "machine": machine,
        "backend": backend,
        "date": date,
        "repetitions": repetitions,
        "duration_s": duration_s,
        "cpus": sorted(cpus) if cpus is not None else None,
        "baseline": baseline.as_dict(),
        "suites": [s.as_dict() for s in suites],
    }


# --------------------------------------------------------------------------- rating rows


def split_costs(mbps: Mapping[SuiteSpec, float], iterations: int = 200) -> dict[str, float]:
    """Per-transform ns/byte whose sums reproduce each suite's ``8000 / Mbit/s`` (least squares).

    Raises:
        InvalidInput: a throughput that is not positive.
    """
    if any(not (v > 0 and math.isfinite(v)) for v in mbps.values()):
        raise InvalidInput("suite throughputs must be positive")
    return split_times({s: _NS_PER_BYTE_AT_1_MBPS / v for s, v in mbps.items()}, iterations)


def split_times(times: Mapping[SuiteSpec, float], iterations: int = 200) -> dict[str, float]:
    """Per-transform shares of suite times per byte (additive model, least squares; see the module doc).

    Raises:
        InvalidInput: a time that is not positive.
    """
    if any(not (t > 0 and math.isfinite(t)) for t in times.values()):
        raise InvalidInput("suite times must be positive")
    out = {s.cipher: t for s, t in times.items() if s.aead}
    pairs = [(s.cipher, s.integrity, t) for s, t in times.items() if s.integrity is not None]
    if not pairs:
        return out
    u = {c: 0.0 for c, _, _ in pairs}
    v = {i: 0.0 for _, i, _ in pairs}
    for _ in range(iterations):  # block coordinate descent on a convex quadratic
        u = {c: statistics.fmean(t - v[i] for cc, i, t in pairs if cc == c) for c in u}
        v = {i: statistics.fmean(t - u[c] for c, ii, t in pairs if ii == i) for i in v}
    floor = INTEGRITY_FLOOR * min(t for _, _, t in pairs)
    shift = floor - min(v.values())
    tiny = 1e-6
    for c, value in u.items():
        out.setdefault(c, max(value - shift, tiny))
    for i, value in v.items():
        out[i] = max(value + shift, tiny)
    return out


def micro_prior(results: Iterable[Mapping[str, Any]], size: int = 1400) -> dict[str, float]:
    """Per-transform ns/byte at ``size`` bytes from ``qoss bench micro`` result rows (those
    with a time at that size; key exchanges have none)."""
    out: dict[str, float] = {}
    for row in results:
        ns = (row.get("ns") or {}).get(str(size))
        if isinstance(ns, int | float) and ns > 0 and math.isfinite(ns):
            out[str(row["algorithm"])] = float(ns) / size
    return out


def pooled_log_sd(groups: Iterable[Sequence[float]]) -> float | None:
    """The standard deviation of log samples within their groups, pooled over the groups
    (each group's mean removed; ``None`` when no group has two samples). Samples must be > 0."""
    logs = [[math.log(v) for v in g] for g in groups if len(g) > 1]
    dof = sum(len(z) - 1 for z in logs)
    if dof == 0:
        return None
    return math.sqrt(sum(sum((z - statistics.fmean(zs)) ** 2 for z in zs) for zs in logs) / dof)


def _theil_sen(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Intercept and slope of ``y = p + k x`` (median of pairwise slopes; both clamped at 0)."""
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1:] if x2 != x1]
    k = max(0.0, statistics.median(slopes)) if slopes else 0.0
    return max(0.0, statistics.median(y - k * x for x, y in points)), k


def shrink_to_prior(samples: Mapping[SuiteSpec, Sequence[float]], prior: Mapping[str, float]) -> dict[SuiteSpec, float]:
    """Each suite's cost (ns/byte): its median, moved toward what the micro benchmark predicts
    by as much as the noise of the median warrants, never by more than one standard error.

    Through kernel-libipsec a dozen suites lie within a few % of each other, less than the
    noise of a few tunnel samples, so ranking them by their medians alone is a lottery. The
    micro benchmark measures the crypto itself precisely. Empirical Bayes, in log space:

    - model ``cost = p + k * x`` with ``x`` the suite's micro ns/byte (sum over its
      transforms), ``p`` the per-byte cost every suite shares (the TUN path), fitted by
      Theil-Sen over the suites (robust to those whose charon implementation differs from
      the library's);
    - noise variance of a median ``v = (pi/2) sigma^2 / n``, ``sigma^2`` pooled within suites;
    - spread of the suites around the model ``tau^2`` = robust variance (MAD) of the log
      residuals minus the typical ``v``;
    - estimate ``model + tau^2 / (tau^2 + v) * residual``, limited to the median +- one
      standard error (Efron-Morris limited translation): a suite the model does not fit keeps
      nearly its measurement, noise-tied suites are ordered by their crypto cost.

    Suites without a prior, or too little data to estimate the noise (one sample each, fewer
    than three suites with a prior), keep their medians.

    Raises:
        InvalidInput: a sample that is not a positive finite number.
    """
    if any(not (v > 0 and math.isfinite(v)) for vs in samples.values() for v in vs):
        raise InvalidInput("suite costs must be positive")
    medians = {s: statistics.median(v) for s, v in samples.items() if v}
    x = {s: sum(prior[t] for t in s.transforms) for s in medians if all(t in prior for t in s.transforms)}
    sigma = pooled_log_sd(samples.values())
    if len(x) < 3 or sigma is None:
        return medians
    sigma2 = sigma ** 2
    p, k = _theil_sen([(x[s], medians[s]) for s in x])
    if p + k * min(x.values()) <= 0:
        return medians
    residual = {s: math.log(medians[s]) - math.log(p + k * x[s]) for s in x}
    centre = statistics.median(residual.values())
    mad = 1.4826 * statistics.median(abs(r - centre) for r in residual.values())
    noise = {s: (math.pi / 2) * sigma2 / len(samples[s]) for s in medians}
    tau2 = max(0.0, mad ** 2 - statistics.median(noise.values()))
    out = dict(medians)
    for s, r in residual.items():
        weight = tau2 / (tau2 + noise[s]) if tau2 + noise[s] > 0 else 1.0
        z, se = math.log(medians[s]), math.sqrt(noise[s])
        out[s] = math.exp(min(max(math.log(p + k * x[s]) + weight * r, z - se), z + se))
    return out


def tunnel_table(
    *, name: str, base: RatingTable, runs: Sequence[SuiteRun], machine: str, backend: str, date: str,
    prior: Mapping[str, float] | None = None, family: int = 4,
) -> RatingTable:
    """A rating table from tunnel runs: levels from ``base``, ESP rows with measured figures.

    Each transform's row carries ``throughput_mbps = 8000 / t`` for its share ``t`` of the
    suites' iperf3 times per byte (:func:`split_costs`) and a performance score from it.
    Its cost ``a_ns_per_byte`` (what the engine compares) is its share of the suites' CPU
    time per byte in both charons where every suite has CPU samples (with kernel-libipsec
    ESP runs in charon, and CPU time is far less disturbed by other load than throughput),
    else ``t``; ``b_ns = 0``: a bulk TCP measurement has no per-packet term. Transforms
    ``base`` does not rate are left out. With ``prior`` (per-transform ns/byte from the micro
    benchmark, :func:`micro_prior`) each suite's cost is first moved toward what the crypto
    costs predict (:func:`shrink_to_prior`), so suites tied within the noise of the tunnel
    samples are ordered by their measured crypto cost. ``family`` (4 or 6) is the address
    family the runs were measured over; it is named in the table's description and methods.

    Raises:
        InvalidInput: no measured suite, or none of its transforms rated in ``base``.
    """
    measured = {r.spec: statistics.median(r.throughput_mbps) for r in runs if r.spec and r.throughput_mbps}
    if not measured:
        raise InvalidInput("no suite was measured")
    costs = split_costs(measured)
    cpu = {r.spec: statistics.median(r.cpu_ns_per_byte) for r in runs
           if r.spec in measured and r.cpu_ns_per_byte}
    by_cpu = len(cpu) == len(measured) and all(v > 0 for v in cpu.values())
    if prior:
        per_suite = {r.spec: (r.cpu_ns_per_byte if by_cpu else [_NS_PER_BYTE_AT_1_MBPS / v for v in r.throughput_mbps])
                     for r in runs if r.spec in measured}
        cost_of = split_times(shrink_to_prior(per_suite, prior))
    else:
        cost_of = split_times(cpu) if by_cpu else costs
    samples = {k: sum(len(r.throughput_mbps) for r in runs if r.spec and k in r.spec.transforms) for k in costs}
    spreads = {k: max(summarize(r.throughput_mbps).spread for r in runs if r.spec and k in r.spec.transforms
                      and r.throughput_mbps) for k in costs}
    over = "over IPv6" if family == 6 else "over IPv4"
    rows = []
    for keyword in sorted(costs, key=catalogue_order):
        rated = base.get(keyword)
        if rated is None:
            continue
        mbit = _NS_PER_BYTE_AT_1_MBPS / costs[keyword]
        rows.append(Rating(
            algorithm=keyword, confidentiality=rated.confidentiality, integrity=rated.integrity,
            key_exchange=rated.key_exchange, performance=throughput_score(mbit / 8), source="measurement",
            reason=f"levels from {base.name}; performance from iperf3 through real {backend} tunnels",
            requirement=rated.requirement,
            measurement=Measurement(
                throughput_mbps=round(mbit, 1), a_ns_per_byte=round(cost_of[keyword], 4), b_ns=0.0,
                machine=machine, backend=backend, date=date, samples=samples[keyword],
                method=("cost: charon CPU ns/byte" if by_cpu else "cost: iperf3 ns/byte")
                + (" shrunk toward the micro benchmark" if prior else "")
                + f"; throughput: iperf3 TCP {over} through the tunnel; suite figures split per transform",
                spread=round(spreads[keyword], 4),
            ),
        ))
    if not rows:
        raise InvalidInput("no measured transform is rated in the base table")
    return RatingTable.of(name, rows, description=f"Measured by `qoss bench tunnel` {over} on {machine}; levels from "
                          f"{base.name}.", source=f"qoss bench tunnel on {machine}")
