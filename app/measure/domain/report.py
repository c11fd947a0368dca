"""What `qoss bench report` says (pure): read the benchmark documents, rank, compare, write Markdown.

- :func:`parse_micro` / :func:`parse_tunnel` read the JSON of ``qoss bench micro --out`` and
  ``qoss bench tunnel --out`` (optional keys may be missing).
- :func:`today_from_micro` / :func:`today_from_tunnel` give each seed row (``seed_tables``)
  today's figure: from the micro, the row's transforms' costs at 1400 B added (Niedermayer et al.
  Table 3: costs add) as MB/s; from the tunnel, the ESP suite made of the same transforms.
- :func:`compare` ranks a seed table both ways and finds, for every pair of rows, whether
  the order agrees or flips; :func:`explain_flip` gives a one-line reason per flip.
- :func:`render_markdown` writes the report; the plots are drawn by the adapter.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.domain.algorithms import CATALOGUE, Kind, lookup
from app.domain.errors import InvalidInput, UnknownAlgorithm
from app.domain.scoring import MicroResult, kex_score, throughput_score
from app.measure.domain.seed_tables import SeedRow, SeedTable

__all__ = [
    "Flip",
    "MicroRun",
    "RowComparison",
    "Stat",
    "TableComparison",
    "TunnelRun",
    "TunnelSuite",
    "compare",
    "cpu_words",
    "esp_keywords",
    "explain_flip",
    "parse_micro",
    "parse_tunnel",
    "pinning",
    "render_markdown",
    "today_from_micro",
    "today_from_tunnel",
    "tunnel_spreads",
]

#: Relative difference below which two of today's figures are called a tie (measurement noise).
NOISE = 0.03


# ---------------------------------------------------------------------------- documents


@dataclass(frozen=True, slots=True)
class MicroRun:
    """A ``qoss bench micro --out`` document."""

    machine: str
    results: tuple[MicroResult, ...]
    date: str | None = None
    backend: str | None = None
    library: str | None = None
    command: str | None = None
    elapsed_s: float | None = None

    def get(self, keyword: str) -> MicroResult | None:
        return next((r for r in self.results if r.keyword == keyword), None)


@dataclass(frozen=True, slots=True)
class Stat:
    """Median of repeated measurements, their relative spread, and the samples."""

    median: float
    spread: float | None = None
    samples: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class TunnelSuite:
    """One ESP suite measured through a real tunnel."""

    esp: str
    ike: str | None
    throughput: Stat | None
    rtt_ms: Mapping[int, Stat] = field(default_factory=dict)
    parallel: Mapping[int, Stat] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TunnelRun:
    """A ``qoss bench tunnel --out`` document."""

    machine: str | None
    backend: str | None
    date: str | None
    repetitions: int | None
    duration_s: float | None
    baseline: TunnelSuite | None
    suites: tuple[TunnelSuite, ...]
    cpus: tuple[int, ...] | None = None  # the CPUs charons, iperf3 and ping were pinned to; None: not pinned


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{where}: expected a number")
    return float(value)


def _opt_text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return str(value) if value is not None else None


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{where}: expected an object")
    return value


def parse_micro(data: Any) -> MicroRun:
    """Read a ``qoss bench micro --out`` document.

    Raises:
        InvalidInput: not such a document.
    """
    doc = _mapping(data, "micro")
    if doc.get("kind", "qoss-bench-micro") != "qoss-bench-micro":
        raise InvalidInput(f"micro: kind is {doc.get('kind')!r}, not 'qoss-bench-micro'")
    rows = doc.get("results")
    if not isinstance(rows, list) or not rows:
        raise InvalidInput("micro: 'results' must be a non-empty list")
    results = []
    for i, raw in enumerate(rows):
        row = _mapping(raw, f"micro.results[{i}]")
        where = f"micro.results[{i}]"
        keyword = row.get("algorithm")
        if not isinstance(keyword, str):
            raise InvalidInput(f"{where}.algorithm: expected a keyword")
        spread = _num(row.get("spread", 0.0), f"{where}.spread")
        samples = int(_num(row.get("samples", 0), f"{where}.samples"))
        method = str(row.get("method", ""))
        if row.get("ops_per_s") is not None:
            results.append(MicroResult(keyword, {}, spread, samples, method,
                                       ops_per_s=_num(row["ops_per_s"], f"{where}.ops_per_s")))
            continue
        ns = _mapping(row.get("ns"), f"{where}.ns")
        try:
            by_size = {int(size): _num(v, f"{where}.ns.{size}") for size, v in ns.items()}
        except ValueError as exc:
            raise InvalidInput(f"{where}.ns: sizes must be integers") from exc
        if 1400 not in by_size or len(by_size) < 2:
            raise InvalidInput(f"{where}.ns: needs 1400 B and at least one other size")
        results.append(MicroResult(keyword, by_size, spread, samples, method))
    machine = doc.get("machine")
    elapsed = doc.get("elapsed_s")
    return MicroRun(
        machine=str(machine) if machine is not None else "unknown machine", results=tuple(results),
        date=_opt_text(doc, "date"), backend=_opt_text(doc, "backend"), library=_opt_text(doc, "library"),
        command=_opt_text(doc, "command"), elapsed_s=_num(elapsed, "micro.elapsed_s") if elapsed is not None else None,
    )


def _stat(value: Any, where: str) -> Stat | None:
    if value is None:
        return None
    data = _mapping(value, where)
    if "median" not in data:
        raise InvalidInput(f"{where}.median: missing")
    spread = data.get("spread")
    samples = data.get("samples") or []
    if not isinstance(samples, list):
        raise InvalidInput(f"{where}.samples: expected a list")
    return Stat(_num(data["median"], f"{where}.median"),
                _num(spread, f"{where}.spread") if spread is not None else None,
                tuple(_num(s, f"{where}.samples") for s in samples))


def _stats_by_int(value: Any, where: str) -> dict[int, Stat]:
    if value is None:
        return {}
    out = {}
    for key, raw in _mapping(value, where).items():
        try:
            number = int(key)
        except ValueError as exc:
            raise InvalidInput(f"{where}: key {key!r} is not an integer") from exc
        stat = _stat(raw, f"{where}.{key}")
        if stat is not None:
            out[number] = stat
    return out


def _suite(value: Any, where: str, *, esp: str | None = None) -> TunnelSuite:
    data = _mapping(value, where)
    name = esp if esp is not None else data.get("esp")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}.esp: expected a proposal")
    return TunnelSuite(
        esp=name, ike=_opt_text(data, "ike"), throughput=_stat(data.get("throughput_mbps"), f"{where}.throughput_mbps"),
        rtt_ms=_stats_by_int(data.get("rtt_ms"), f"{where}.rtt_ms"),
        parallel=_stats_by_int(data.get("parallel_mbps"), f"{where}.parallel_mbps"),
    )


def _cpus(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or not value
            or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in value)):
        raise InvalidInput(f"{where}: expected a non-empty list of CPU numbers or null")
    return tuple(sorted(set(value)))


def parse_tunnel(data: Any) -> TunnelRun:
    """Read a ``qoss bench tunnel --out`` document (kind ``qoss-bench-tunnel``, version 1;
    ``cpus`` is optional: older documents have none and were not pinned).

    Raises:
        InvalidInput: not such a document.
    """
    doc = _mapping(data, "tunnel")
    if doc.get("kind") != "qoss-bench-tunnel":
        raise InvalidInput(f"tunnel: kind is {doc.get('kind')!r}, not 'qoss-bench-tunnel'")
    suites = doc.get("suites", [])
    if not isinstance(suites, list):
        raise InvalidInput("tunnel.suites: expected a list")
    baseline = doc.get("baseline")
    reps, duration = doc.get("repetitions"), doc.get("duration_s")
    return TunnelRun(
        machine=_opt_text(doc, "machine"), backend=_opt_text(doc, "backend"), date=_opt_text(doc, "date"),
        repetitions=int(_num(reps, "tunnel.repetitions")) if reps is not None else None,
        duration_s=_num(duration, "tunnel.duration_s") if duration is not None else None,
        baseline=_suite(baseline, "tunnel.baseline", esp="(no IPsec)") if baseline is not None else None,
        suites=tuple(_suite(s, f"tunnel.suites[{i}]") for i, s in enumerate(suites)),
        cpus=_cpus(doc.get("cpus"), "tunnel.cpus"),
    )


# ---------------------------------------------------------------------------- today's figures


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


# ---------------------------------------------------------------------------- comparison


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


def _ranks(values: Mapping[str, float]) -> dict[str, int]:
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
    seed_ranks = _ranks({r.label: r.value for r in table.rows})
    today_ranks = _ranks(measured)
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


# ---------------------------------------------------------------------------- Markdown


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def cpu_words(cpus: Iterable[int]) -> str:
    """``CPU 1``, ``CPUs 0, 1``."""
    ordered = sorted(cpus)
    return ("CPU " if len(ordered) == 1 else "CPUs ") + ", ".join(str(c) for c in ordered)


def pinning(cpus: Iterable[int] | None) -> str:
    """How a tunnel run was placed: ``charons, iperf3 and ping pinned to CPU 1``, or ``not pinned``."""
    return f"charons, iperf3 and ping pinned to {cpu_words(cpus)}" if cpus else "not pinned"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _comparison_md(c: TableComparison, levels: Mapping[str, int | None]) -> list[str]:
    t = c.table
    level_table = t.unit.startswith("level")
    unit = "Mbit/s"
    if c.source == "micro":
        unit = "MB/s @1400 B (score)" if level_table else "MB/s @1400 B"
    head = f"| row | paper ({t.unit}) | paper rank | today, {c.source} ({unit}) | today rank |"
    rule = "|---|---:|---:|---:|---:|"
    if level_table:
        head += " security 2006 | security today |"
        rule += "---:|---:|"
    lines = [f"#### {t.title} — against the {c.source}", "", head, rule]
    for rc in c.rows:
        today = _fmt(rc.today, 2)
        if level_table and c.source == "micro" and rc.today is not None:
            today += f" ({throughput_score(rc.today):.2f})"
        line = (f"| {rc.row.label} | {_fmt(rc.row.value)} | {rc.seed_rank} | {today} | "
                f"{rc.today_rank if rc.today_rank is not None else 'not measured'} |")
        if level_table:
            then = next(iter(rc.row.extra.values()), None)
            now = levels.get(rc.row.keywords[0]) if rc.row.keywords else None
            line += f" {_fmt(then, 0)} | {_fmt(now, 0) if now is not None else '-'} |"
        lines.append(line)
    lines += ["", f"Pairs ranked both ways: {c.compared}; the order agrees for {c.agree}, flips for {len(c.flips)}"
              f", tied in the paper {len(c.seed_ties)}, tied today (within {NOISE:.0%} or the measurements' spread) "
              f"{len(c.today_ties)}.", ""]
    measured = [rc for rc in c.rows if rc.today_rank is not None]
    seed_among = _ranks({rc.row.label: rc.row.value for rc in measured})
    kept = [rc.row.label for rc in measured if seed_among[rc.row.label] == rc.today_rank]
    if kept:
        lines.append(f"- **same place** among the rows measured both ways: {', '.join(kept)}.")
    by_reason: dict[str, list[Flip]] = {}
    for flip in c.flips:
        by_reason.setdefault(flip.why, []).append(flip)
    for why, flips in by_reason.items():
        pairs = "; ".join(f"{f.faster_now.label} > {f.faster_then.label}" for f in flips)
        lines.append(f"- **flips** ({len(flips)}; today's order shown): {pairs}. *Why:* {why}.")
    if c.seed_ties:
        lines.append("- tied in the paper: " + "; ".join(f"{a.label} = {b.label}" for a, b in c.seed_ties) + ".")
    if c.today_ties:
        lines.append("- tied today: " + "; ".join(f"{a.label} ≈ {b.label}" for a, b in c.today_ties) + ".")
    if level_table:
        changed = [rc.row.label for rc in c.rows if rc.row.keywords and rc.row.extra
                   and levels.get(rc.row.keywords[0]) is not None
                   and levels.get(rc.row.keywords[0]) != next(iter(rc.row.extra.values()))]
        if changed:
            lines.append(f"- security levels that changed since 2006 ({', '.join(changed)}) are security, not "
                         "speed: 64-bit blocks (Sweet32) and RFC 8221's MUST NOT sink 3DES and Blowfish whatever "
                         "their speed; the ranking above is speed only.")
    lines.append("")
    return lines


def render_markdown(
    *, micro: MicroRun, tunnel: TunnelRun | None, comparisons: Sequence[TableComparison], plots: Mapping[str, str],
    commands: Sequence[str], levels: Mapping[str, int | None] | None = None,
) -> str:
    """The whole report as Markdown.

    Args:
        micro: the micro run.
        tunnel: the tunnel run, if any.
        comparisons: from :func:`compare`, in the order to show.
        plots: caption -> PNG file name (relative to the report).
        commands: the commands that produced the inputs and the report.
        levels: today's security level per keyword (standards-2026), for Table 14.
    """
    dp = sorted((r for r in micro.results if r.ops_per_s is None), key=lambda r: -r.mb_per_s)
    kex = sorted((r for r in micro.results if r.ops_per_s is not None), key=lambda r: -(r.ops_per_s or 0.0))
    worst = max((r.spread for r in micro.results), default=0.0)
    out = [
        "# qoss measurements", "",
        f"- machine: {micro.machine}",
        f"- date: {micro.date or '-'}; back end: {micro.backend or '-'}; library: {micro.library or '-'}",
        f"- micro: {len(dp)} data-plane transforms and {len(kex)} key-exchange groups"
        + (f" in {micro.elapsed_s:.1f} s" if micro.elapsed_s is not None else "")
        + f"; worst run-to-run spread {_pct(worst)}",
        "", "Produced by:", "", "```sh", *commands, "```", "",
        "Figures are userspace crypto on this machine (what kernel-libipsec does), timed per packet at 64-1400 B; "
        "a shared 2-core VM, so compare ratios within one run. Scores use the documented monotone mapping of "
        "`app/domain/scoring.py` (data plane 10·log10(MB/s)/log10(2000), key exchange 10·log10(ops/s)/5).", "",
    ]
    if plots:
        out += ["## Plots", ""]
        out += [f"![{caption}]({name})" + "\n" for caption, name in plots.items()]
    measured = {r.keyword for r in micro.results}
    missing = [k for k, a in CATALOGUE.items() if k not in measured and a.kind is not Kind.PRF]
    if missing:
        out += [f"Catalogue algorithms this run did not measure: {', '.join(missing)} (in a full sweep: those the "
                "crypto library does not offer - single DES, AES-XCBC, Camellia-CTR, brainpoolP224r1 - and null). "
                "IKE PRFs are the HMACs of the same hashes.", ""]
    out += ["## Data plane (micro)", "",
            "| algorithm | method | MB/s @1400 B | a (ns/B) | b (ns) | r² | spread | score |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in dp:
        fit = r.fit
        out.append(f"| {r.keyword} | {r.method} | {_fmt(r.mb_per_s)} | {fit.a:.3f} | {fit.b:,.0f} | {fit.r2:.4f} | "
                   f"{_pct(r.spread)} | {throughput_score(r.mb_per_s):.2f} |")
    out += ["", "## Key exchange (micro: key generation + shared secret)", "",
            "| group | ops/s | ms per op | spread | score |", "|---|---:|---:|---:|---:|"]
    for r in kex:
        ops = r.ops_per_s or 0.0
        out.append(f"| {r.keyword} | {ops:,.0f} | {1000 / ops:.3f} | {_pct(r.spread)} | {kex_score(ops):.2f} |")
    out.append("")
    if tunnel is not None:
        out += ["## Tunnel (real charon, kernel-libipsec, iperf3)", "",
                f"- machine: {tunnel.machine or '-'}; back end: {tunnel.backend or '-'}; date: {tunnel.date or '-'}; "
                f"{tunnel.repetitions or '-'} repetitions of {_fmt(tunnel.duration_s)} s"
                + (f"; {pinning(tunnel.cpus)}" if tunnel.cpus else ""), "",
                "| ESP | IKE | Mbit/s (median) | spread | RTT 64 B (ms) | RTT 1400 B (ms) | parallel 1/2/4 (Mbit/s) |",
                "|---|---|---:|---:|---:|---:|---|"]
        suites = ([tunnel.baseline] if tunnel.baseline is not None else []) + list(tunnel.suites)
        for s in suites:
            tp = s.throughput
            par = "/".join(_fmt(s.parallel[n].median) if n in s.parallel else "-" for n in (1, 2, 4))
            out.append(f"| {s.esp} | {s.ike or '-'} | {_fmt(tp.median if tp else None)} | "
                       f"{_pct(tp.spread if tp else None)} | {_fmt(s.rtt_ms[64].median, 3) if 64 in s.rtt_ms else '-'} "
                       f"| {_fmt(s.rtt_ms[1400].median, 3) if 1400 in s.rtt_ms else '-'} | {par} |")
        out.append("")
    out += ["## Today beside the papers", "",
            "Each paper's rows ranked by the paper's figure and by today's (1 = fastest). A pair of rows *flips* "
            "when the faster one changed; the line says why. Rows made of several transforms add their costs "
            "(Niedermayer et al. Table 3). Niedermayer et al. measured Linux 2.6 on 2.6 GHz Pentium 4s (2006), "
            "Thiruvasagam and George strongSwan "
            "on 2019 hardware; today's micro is per-transform userspace crypto, so only the *order* is comparable.",
            ""]
    for c in comparisons:
        out += _comparison_md(c, levels or {})
    return "\n".join(out).rstrip() + "\n"

