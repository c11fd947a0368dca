"""Today beside the papers (pure): today's figure for each seed row, both rankings, and for
every pair of rows whether the order agrees, ties or flips, with a one-line reason per flip.

- :func:`today_from_micro` / :func:`today_from_tunnel` give each seed row (``seed_tables``)
  today's figure: from the micro, the row's transforms' costs at 1400 B added (Niedermayer et al.
  Table 3: costs add) as MB/s; from the tunnel, the ESP suite made of the same transforms.
- :func:`compare` ranks a seed table both ways and finds, for every pair of rows, whether
  the order agrees or flips; :func:`explain_flip` gives a one-line reason per flip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from app.domain.algorithms import Kind, lookup
from app.domain.errors import UnknownAlgorithm
from app.measure.domain.runs import MicroRun, TunnelRun
from app.measure.domain.seed_tables import SeedRow, SeedTable

__all__ = [
    "NOISE",
    "Flip",
    "RowComparison",
    "TableComparison",
    "compare",
    "esp_keywords",
    "explain_flip",
    "ranks",
    "today_from_micro",
    "today_from_tunnel",
    "tunnel_spreads",
]

#: Relative difference below which two of today's figures are called a tie (measurement noise).
NOISE = 0.03


def esp_keywords(esp: str) -> frozenset[str]:
    """The transforms of an ESP proposal, canonical, without DH groups, ESN flags or ``null``.

    >>> sorted(esp_keywords("aes128-sha2_256-modp2048-noesn"))
    ['aes128', 'sha256']
    """
    out = set()
    for token in esp.strip().lower().split("-"):
        if token in ("", "esn", "noesn", "null"):
            continue
        try:
            algorithm = lookup(token)
        except UnknownAlgorithm:
            out.add(token)
            continue
        if algorithm.kind is not Kind.KEY_EXCHANGE:
            out.add(algorithm.keyword)
    return frozenset(out)


def today_from_micro(table: SeedTable, micro: MicroRun) -> dict[str, float | None]:
    """Per row label: MB/s at 1400 B of the row's transforms in sequence (None: one is not
    measured, or the row is the no-IPsec baseline). For ESAF's performance levels the report
    shows the score of this figure (``scoring.throughput_score``, monotone: same order)."""
    out: dict[str, float | None] = {}
    for row in table.rows:
        results = [micro.get(k) for k in row.keywords]
        if not row.keywords or any(r is None or r.ops_per_s is not None for r in results):
            out[row.label] = None
            continue
        ns = sum(r.ns_by_size[1400] for r in results if r is not None)
        out[row.label] = 1400 / ns * 1000
    return out


def today_from_tunnel(table: SeedTable, tunnel: TunnelRun) -> dict[str, float | None]:
    """Per row label: the tunnel's median Mbit/s for the ESP suite made of the row's transforms
    (the baseline for the no-IPsec row); None where the tunnel run has no such suite."""
    by_keywords = {esp_keywords(s.esp): s for s in tunnel.suites if s.throughput is not None}
    out: dict[str, float | None] = {}
    for row in table.rows:
        if not row.keywords:
            base = tunnel.baseline
            out[row.label] = base.throughput.median if base is not None and base.throughput is not None else None
            continue
        suite = by_keywords.get(frozenset(row.keywords))
        out[row.label] = suite.throughput.median if suite is not None and suite.throughput is not None else None
    return out


def tunnel_spreads(table: SeedTable, tunnel: TunnelRun) -> dict[str, float]:
    """Per row label: the relative spread (range over median) of the tunnel figure used."""
    by_keywords = {esp_keywords(s.esp): s for s in tunnel.suites if s.throughput is not None}
    out: dict[str, float] = {}
    for row in table.rows:
        suite = tunnel.baseline if not row.keywords else by_keywords.get(frozenset(row.keywords))
        if suite is not None and suite.throughput is not None and suite.throughput.spread is not None:
            out[row.label] = suite.throughput.spread
    return out


@dataclass(frozen=True, slots=True)
class RowComparison:
    row: SeedRow
    seed_rank: int
    today: float | None
    today_rank: int | None


@dataclass(frozen=True, slots=True)
class Flip:
    """``faster_then`` beat ``faster_now`` in the paper; today it is the other way round."""

    faster_then: SeedRow
    faster_now: SeedRow
    why: str


@dataclass(frozen=True, slots=True)
class TableComparison:
    table: SeedTable
    source: str
    rows: tuple[RowComparison, ...]
    agree: int
    flips: tuple[Flip, ...]
    seed_ties: tuple[tuple[SeedRow, SeedRow], ...]
    today_ties: tuple[tuple[SeedRow, SeedRow], ...]

    @property
    def compared(self) -> int:
        return self.agree + len(self.flips) + len(self.seed_ties) + len(self.today_ties)


def ranks(values: Mapping[str, float]) -> dict[str, int]:
    """Competition ranking, 1 = fastest; equal values share a rank."""
    return {label: 1 + sum(1 for other in values.values() if other > v) for label, v in values.items()}


def _close(x: float, y: float, sx: float = 0.0, sy: float = 0.0) -> bool:
    """Within ``NOISE`` of each other, or within half the measurements' own ranges."""
    return abs(x - y) <= max(NOISE * max(abs(x), abs(y)), (sx * abs(x) + sy * abs(y)) / 2)


def compare(table: SeedTable, today: Mapping[str, float | None], *, source: str,
            cpu_flags: frozenset[str] = frozenset(), spreads: Mapping[str, float] | None = None) -> TableComparison:
    """Rank ``table`` by the paper and by ``today`` (rows without a figure today are shown,
    not ranked) and classify every pair of rows ranked both ways.

    A pair *agrees* when the faster row is the same, is a *seed tie* when the paper prints the
    same figure for both, a *tie today* when today's figures are within ``NOISE`` (3 %) or
    within half their measured ranges (``spreads``: range over median per row, e.g. a tunnel's
    repetitions), and otherwise a *flip*, explained by :func:`explain_flip`.
    """
    spreads = spreads or {}
    measured = {r.label: v for r in table.rows if (v := today.get(r.label)) is not None}
    seed_ranks = ranks({r.label: r.value for r in table.rows})
    today_ranks = ranks(measured)
    rows = tuple(RowComparison(r, seed_ranks[r.label], measured.get(r.label), today_ranks.get(r.label))
                 for r in table.rows)
    agree, flips, seed_ties, today_ties = 0, [], [], []
    both = [r for r in table.rows if r.label in measured]
    for i, a in enumerate(both):
        for b in both[i + 1:]:
            ta, tb = measured[a.label], measured[b.label]
            if a.value == b.value:
                seed_ties.append((a, b))
            elif _close(ta, tb, spreads.get(a.label, 0.0), spreads.get(b.label, 0.0)):
                today_ties.append((a, b))
            elif (a.value > b.value) == (ta > tb):
                agree += 1
            else:
                then, now = (a, b) if a.value > b.value else (b, a)
                flips.append(Flip(then, now, explain_flip(then, now, cpu_flags)))
    return TableComparison(table, source, rows, agree, tuple(flips), tuple(seed_ties), tuple(today_ties))


def _family(keyword: str) -> str:
    for prefix in ("blowfish", "camellia", "3des", "des", "cast", "md5", "sha1", "sha256", "sha384", "sha512"):
        if keyword.startswith(prefix):
            return prefix
    if "gcm" in keyword or "gmac" in keyword:
        return "gcm"
    if "ccm" in keyword:
        return "ccm"
    return "aes" if keyword.startswith("aes") else keyword


_MACS = frozenset({"md5", "sha1", "sha256", "sha384", "sha512"})
_SLOW_CIPHERS = frozenset({"blowfish", "3des", "des", "cast", "camellia"})


def explain_flip(faster_then: SeedRow, faster_now: SeedRow, cpu_flags: frozenset[str] = frozenset()) -> str:
    """One line: why ``faster_now``, slower in the paper, is faster today.

    The reasons are the known mechanisms, one per part of the rows that changed (the MAC,
    the cipher, an AEAD mode): SHA extensions, AES-NI, GCM/CCM, key-size independent
    Blowfish. ``cpu_flags`` (from /proc/cpuinfo) says which instructions this CPU has.
    """
    then = {_family(k) for k in faster_then.keywords}
    now = {_family(k) for k in faster_now.keywords}
    gained, lost = now - then, then - now
    if not faster_now.keywords or not faster_then.keywords:
        return "the no-IPsec baseline and an ESP suite differ by less than the tunnel path's own noise"
    reasons = []
    if (lost & {"md5"} and gained & {"sha1", "sha256"}) or (lost & {"sha1"} and gained & {"sha256"}):
        reasons.append(
            "SHA extensions: this CPU hashes SHA-1 and SHA-256 in hardware (sha_ni), MD5 has no such instructions; "
            "the 2006 Pentium 4 had none and SHA-256 was the slowest" if "sha_ni" in cpu_flags else
            "today's vectorised SHA code against the 2006 kernel's plain C (this CPU has no SHA extensions)")
    if gained & {"aes", "gcm", "ccm"} and lost & _SLOW_CIPHERS:
        reasons.append("AES-NI: AES runs in hardware here, the 64-bit-block ciphers get no hardware help"
                       if "aes" in cpu_flags else "AES's table-driven code outruns the 64-bit-block ciphers")
    if then == {"ccm"} and now == {"gcm"}:
        reasons.append("CCM is two AES passes (CTR + CBC-MAC) in series; GCM is one AES-CTR pass + GHASH")
    elif "gcm" in gained and not then & {"gcm"}:
        reasons.append("GCM's counter mode runs several blocks at once through AES-NI and GHASH uses carry-less "
                       "multiply (PCLMULQDQ), while CBC encryption is serial"
                       + (" and its MAC a second pass" if then & _MACS else ""))
    elif "ccm" in gained and not then & {"gcm", "ccm"}:
        reasons.append("CCM's two AES-NI passes in one call cost less than AES-CBC followed by a separate HMAC"
                       if then & _MACS else "CCM's two AES-NI passes against one serial CBC pass: per-packet "
                       "overhead decides")
    if not reasons and "blowfish" in then and "blowfish" in now:
        reasons.append("Blowfish's speed does not depend on its key size (Niedermayer et al. §6.2): noise")
    if not reasons and "aes" in then and "aes" in now:
        reasons.append("AES-128 and AES-192 differ by two rounds in 10-12: a small difference either way")
    return "; ".join(reasons) if reasons else "no single known cause; see the figures above"
