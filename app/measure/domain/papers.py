"""Each cell of a tunnel measurement beside the papers' figures (pure): what `qoss bench report`
says about the matrix (family x protocol), the IPv6 overhead, RTT by size and parallel flows.

The figures come from the project's data file ``app/measure/data/paper_figures.json``
(read by the report adapter, checked by :func:`parse_paper_figures`), one entry per figure
with the paper and table it is printed in:

- Thiruvasagam and George Table 5 (TCP and UDP throughput, IPv4 and IPv6) and Tables 6-8
  (UDP throughput, jitter and loss): each cell (IPv4/IPv6 x TCP/UDP) becomes a
  :class:`~app.measure.domain.seed_tables.SeedTable` ranked both ways by
  :func:`~app.measure.domain.comparison.compare`. A suite printed in several tables is
  taken from the lowest-numbered one that has jitter and loss (UDP: Table 6 before Table 5,
  whose UDP column it repeats; Table 7 repeats Table 6's AES128-SHA2 256 row).
- the IPv6 overhead: per suite, throughput over IPv6 / over IPv4, today and in Table 5.
- Al Boloushi and Al Dhaheri Table 3 (RTT by MTU) and Table 4 (bandwidth by parallel
  flows): they measured plain TCP/IP, AH and AH+ESP, not suites, so what compares is the
  shape: how much RTT grows from the smallest to the largest packet with and without IPsec,
  and how much more two and four flows carry than one.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.domain.errors import InvalidInput
from app.measure.domain.comparison import TableComparison, compare, esp_keywords, today_from_tunnel, tunnel_spreads
from app.measure.domain.runs import TunnelCell, TunnelRun, TunnelSuite
from app.measure.domain.seed_tables import SeedRow, SeedTable

__all__ = [
    "FlowsRow",
    "Overhead",
    "PaperFigure",
    "PaperFigures",
    "RttRow",
    "cell_comparisons",
    "cell_table",
    "flows_gain",
    "ipv6_overhead",
    "parse_paper_figures",
    "render_matrix",
    "rtt_growth",
]


@dataclass(frozen=True, slots=True)
class PaperFigure:
    """One throughput figure of a paper: the suite (``esp`` None: no IPsec) in one cell."""

    paper: str
    table: str
    row: str
    esp: str | None
    family: int
    protocol: str
    throughput_mbps: float
    jitter_ms: float | None = None
    loss_percent: float | None = None


@dataclass(frozen=True, slots=True)
class RttRow:
    """Al Boloushi and Al Dhaheri Table 3: RTT (µs) at one MTU, plain, AH, AH+ESP."""

    table: str
    mtu_bytes: int
    plain_us: float
    ah_us: float
    ah_esp_us: float


@dataclass(frozen=True, slots=True)
class FlowsRow:
    """Al Boloushi and Al Dhaheri Table 4: total bandwidth (MB/s) with n parallel flows."""

    table: str
    flows: int
    plain_mb_s: float
    ah_mb_s: float
    ah_esp_mb_s: float


@dataclass(frozen=True, slots=True)
class PaperFigures:
    throughput: tuple[PaperFigure, ...]
    rtt_by_size: tuple[RttRow, ...]
    bandwidth_by_flows: tuple[FlowsRow, ...]

    def cell(self, family: int, protocol: str) -> list[PaperFigure]:
        """The figures of one cell, one per suite: from a table with jitter and loss if one prints
        the suite, else from the lowest-numbered table printing it."""
        out: dict[str | None, PaperFigure] = {}
        for f in sorted((f for f in self.throughput if (f.family, f.protocol) == (family, protocol)),
                        key=lambda f: (f.jitter_ms is None, _table_number(f.table))):
            out.setdefault(f.esp, f)
        return list(out.values())


def _table_number(table: str) -> int:
    digits = "".join(c for c in table if c.isdigit())
    return int(digits) if digits else 0


def _num(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{where}: expected a number")
    return float(value)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{where}: expected text")
    return value


def parse_paper_figures(data: Any) -> PaperFigures:
    """Read the papers' figures (``app/measure/data/paper_figures.json``).

    Raises:
        InvalidInput: not such a document.
    """
    if not isinstance(data, Mapping) or data.get("kind") != "qoss-paper-figures":
        raise InvalidInput("paper figures: kind must be 'qoss-paper-figures'")
    throughput = []
    for i, raw in enumerate(data.get("throughput") or []):
        where = f"paper figures.throughput[{i}]"
        if not isinstance(raw, Mapping):
            raise InvalidInput(f"{where}: expected an object")
        family, protocol, esp = raw.get("family"), raw.get("protocol"), raw.get("esp")
        if family not in (4, 6) or protocol not in ("tcp", "udp") or not (esp is None or isinstance(esp, str)):
            raise InvalidInput(f"{where}: family 4 or 6, protocol tcp or udp, esp a proposal or null")
        throughput.append(PaperFigure(
            paper=_text(raw.get("paper"), where), table=_text(raw.get("table"), where),
            row=_text(raw.get("row"), where),
            esp=esp, family=int(family), protocol=str(protocol),
            throughput_mbps=_num(raw.get("throughput_mbps"), f"{where}.throughput_mbps"),
            jitter_ms=_num(raw["jitter_ms"], f"{where}.jitter_ms") if raw.get("jitter_ms") is not None else None,
            loss_percent=(_num(raw["loss_percent"], f"{where}.loss_percent")
                          if raw.get("loss_percent") is not None else None)))
    rtt = [RttRow(_text(r.get("table"), "rtt_by_size"), int(_num(r.get("mtu_bytes"), "rtt_by_size.mtu_bytes")),
                  _num(r.get("plain_us"), "rtt_by_size.plain_us"), _num(r.get("ah_us"), "rtt_by_size.ah_us"),
                  _num(r.get("ah_esp_us"), "rtt_by_size.ah_esp_us"))
           for r in data.get("rtt_by_size") or [] if isinstance(r, Mapping)]
    flows = [FlowsRow(_text(r.get("table"), "bandwidth_by_flows"),
                      int(_num(r.get("flows"), "bandwidth_by_flows.flows")),
                      _num(r.get("plain_mb_s"), "bandwidth_by_flows.plain_mb_s"),
                      _num(r.get("ah_mb_s"), "bandwidth_by_flows.ah_mb_s"),
                      _num(r.get("ah_esp_mb_s"), "bandwidth_by_flows.ah_esp_mb_s"))
             for r in data.get("bandwidth_by_flows") or [] if isinstance(r, Mapping)]
    if not throughput:
        raise InvalidInput("paper figures: no throughput figure")
    return PaperFigures(tuple(throughput), tuple(rtt), tuple(flows))


# --------------------------------------------------------------------------- the cells


def _protocol_words(protocol: str) -> str:
    return protocol.upper()


def cell_table(figures: PaperFigures, family: int, protocol: str) -> SeedTable | None:
    """The papers' figures of one cell as a seed table (None: the papers have none for it)."""
    rows = []
    for f in figures.cell(family, protocol):
        extra = {k: v for k, v in (("jitter ms", f.jitter_ms), ("loss %", f.loss_percent)) if v is not None}
        rows.append(SeedRow(f.row, tuple(sorted(esp_keywords(f.esp))) if f.esp else (), f.throughput_mbps,
                            f"{f.paper} {f.table}, row '{f.row}', IPv{family} {_protocol_words(protocol)}", extra))
    if not rows:
        return None
    tables = sorted({f.table for f in figures.cell(family, protocol)}, key=_table_number)
    paper = figures.cell(family, protocol)[0].paper.split(" (")[0]
    return SeedTable(f"004-IPv{family}-{protocol}", f"{paper} {', '.join(tables)}: IPv{family} "
                     f"{_protocol_words(protocol)}", "Mbit/s", tuple(rows))


def _as_run(tunnel: TunnelRun, cell: TunnelCell) -> TunnelRun:
    return dataclasses.replace(tunnel, baseline=cell.baseline, suites=cell.suites)


def cell_comparisons(tunnel: TunnelRun, figures: PaperFigures,
                     cpu_flags: frozenset[str] = frozenset()) -> list[tuple[TunnelCell, TableComparison]]:
    """Every measured cell the papers have figures for, ranked both ways (ties within the
    tunnel's spread are ties, as in :func:`compare`)."""
    out = []
    for cell in tunnel.cells:
        table = cell_table(figures, cell.family, cell.protocol)
        if table is None:
            continue
        run = _as_run(tunnel, cell)
        out.append((cell, compare(table, today_from_tunnel(table, run), source=f"tunnel, {cell.label}",
                                  cpu_flags=cpu_flags, spreads=tunnel_spreads(table, run))))
    return out


def _by_keywords(cell: TunnelCell | None) -> dict[frozenset[str] | None, TunnelSuite]:
    if cell is None:
        return {}
    out: dict[frozenset[str] | None, TunnelSuite] = {esp_keywords(s.esp): s for s in cell.suites
                                                      if s.throughput is not None}
    if cell.baseline is not None and cell.baseline.throughput is not None:
        out[None] = cell.baseline
    return out


@dataclass(frozen=True, slots=True)
class Overhead:
    """Throughput over IPv6 / over IPv4 for one suite (None: a cell is missing)."""

    esp: str
    tcp: float | None
    udp: float | None
    paper_tcp: float | None
    paper_udp: float | None


def ipv6_overhead(tunnel: TunnelRun, figures: PaperFigures) -> list[Overhead]:
    """Per suite measured over both families (the baseline first): IPv6/IPv4 throughput for
    TCP and UDP, today and in Thiruvasagam and George Table 5."""
    today = {p: (_by_keywords(tunnel.cell(4, p)), _by_keywords(tunnel.cell(6, p))) for p in ("tcp", "udp")}
    paper = {(esp_keywords(f.esp) if f.esp else None, f.family, f.protocol): f.throughput_mbps
             for f in figures.throughput if f.table == "Table 5"}
    names: dict[frozenset[str] | None, str] = {}
    for v4, v6 in today.values():
        for key in v4.keys() & v6.keys():
            names.setdefault(key, v4[key].esp)
    out = []
    for key in sorted(names, key=lambda k: (k is not None, names[k])):

        def ratio(protocol: str, k: frozenset[str] | None = key) -> float | None:
            v4, v6 = today[protocol]
            a, b = v4.get(k), v6.get(k)
            if a is None or b is None or a.throughput is None or b.throughput is None or a.throughput.median <= 0:
                return None
            return b.throughput.median / a.throughput.median

        def paper_ratio(protocol: str, k: frozenset[str] | None = key) -> float | None:
            a, b = paper.get((k, 4, protocol)), paper.get((k, 6, protocol))
            return b / a if a and b else None

        out.append(Overhead(names[key], ratio("tcp"), ratio("udp"), paper_ratio("tcp"), paper_ratio("udp")))
    return out


def rtt_growth(cell: TunnelCell) -> tuple[int, int, float | None, float | None] | None:
    """RTT at the largest size / at the smallest, for the baseline and the median over the
    suites: ``(small, large, baseline ratio, suites ratio)``; None without two sizes."""
    runs = [s for s in ([cell.baseline] if cell.baseline else []) + list(cell.suites)]
    sizes = sorted({size for s in runs for size in s.rtt_ms})
    if len(sizes) < 2:
        return None
    small, large = sizes[0], sizes[-1]

    def ratio(s: TunnelSuite) -> float | None:
        a, b = s.rtt_ms.get(small), s.rtt_ms.get(large)
        return b.median / a.median if a and b and a.median > 0 else None

    base = ratio(cell.baseline) if cell.baseline else None
    suites = [r for s in cell.suites if (r := ratio(s)) is not None]
    return small, large, base, statistics.median(suites) if suites else None


def flows_gain(cell: TunnelCell, n: int) -> tuple[float | None, float | None]:
    """Throughput with ``n`` flows / with one: the baseline's, and the median over the suites."""

    def ratio(s: TunnelSuite) -> float | None:
        a, b = s.parallel.get(1), s.parallel.get(n)
        return b.median / a.median if a and b and a.median > 0 else None

    base = ratio(cell.baseline) if cell.baseline else None
    suites = [r for s in cell.suites if (r := ratio(s)) is not None]
    return base, statistics.median(suites) if suites else None


# --------------------------------------------------------------------------- Markdown


def _f(value: float | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.{digits}f}"


#: :func:`~app.measure.domain.comparison.explain_flip` fallbacks that name no mechanism of a tunnel's order.
_NO_MECHANISM = ("no single known cause", "AES-128 and AES-192", "Blowfish's speed", "the no-IPsec baseline")


def _mechanism(why: str) -> str:
    """``; <why>`` when the reason names a known crypto mechanism, else nothing: through
    kernel-libipsec most suites are bound by the TUN path, so an order without one is noise or the path."""
    return "" if why.startswith(_NO_MECHANISM) else f"; {why}"


def _cell_md(cell: TunnelCell, c: TableComparison) -> list[str]:
    udp = cell.protocol == "udp"
    suites = {esp_keywords(s.esp): s for s in cell.suites}
    head = "| row | paper Mbit/s | paper rank |"
    rule = "|---|---:|---:|"
    if udp:
        head += " paper jitter ms | paper loss % |"
        rule += "---:|---:|"
    head += " today Mbit/s | today rank |"
    rule += "---:|---:|"
    if udp:
        head += " today jitter ms | today loss % |"
        rule += "---:|---:|"
    lines = [f"#### {c.table.title}", "", head + " from |", rule + "---|"]
    for rc in c.rows:
        row = rc.row
        line = f"| {row.label} | {_f(row.value)} | {rc.seed_rank} |"
        if udp:
            line += f" {_f(row.extra.get('jitter ms'), 3)} | {_f(row.extra.get('loss %'), 2)} |"
        line += f" {_f(rc.today)} | {rc.today_rank if rc.today_rank is not None else 'not measured'} |"
        if udp:
            s = cell.baseline if not row.keywords else suites.get(frozenset(row.keywords))
            jitter = s.jitter_ms.median if s is not None and s.jitter_ms is not None else None
            loss = s.loss_percent.median if s is not None and s.loss_percent is not None else None
            line += f" {_f(jitter, 3)} | {_f(loss, 2)} |"
        lines.append(line + f" {row.citation.split(', row')[0]} |")
    lines += ["", f"Pairs ranked both ways: {c.compared}; the order agrees for {c.agree}, differs for {len(c.flips)}, "
              f"tied in the paper {len(c.seed_ties)}, tied today {len(c.today_ties)}.", ""]
    if c.flips:
        today = {rc.row.label: rc.today for rc in c.rows}
        lines.append("Where today's ranking differs (today's faster row first, today's figures, then the paper's): "
                     + "; ".join(f"{f.faster_now.label} > {f.faster_then.label} ({_f(today[f.faster_now.label])} vs "
                                 f"{_f(today[f.faster_then.label])} Mbit/s; paper {_f(f.faster_now.value)} vs "
                                 f"{_f(f.faster_then.value)}{_mechanism(f.why)})" for f in c.flips) + ".")
    elif c.compared:
        lines.append("Today's ranking does not differ from the paper's for any pair measured both ways.")
    if c.today_ties:
        lines.append("Tied today: " + "; ".join(f"{a.label} ≈ {b.label}" for a, b in c.today_ties) + ".")
    lines.append("")
    return lines


def render_matrix(*, tunnel: TunnelRun, comparisons: Sequence[tuple[TunnelCell, TableComparison]],
                  overhead: Sequence[Overhead], figures: PaperFigures, plots: Mapping[str, str]) -> str:
    """The report's part on the matrix: every cell beside the papers, the IPv6 overhead, RTT
    by size and parallel flows beside Al Boloushi and Al Dhaheri."""
    cells = ", ".join(c.label for c in tunnel.cells)
    out = ["## The measurement matrix beside the papers", "",
           f"Cells measured: {cells}. Each cell's suites ranked by the paper's figure and by today's "
           "(1 = fastest); an order within the tunnel's own spread is a tie, not a difference. The papers' "
           "figures and the table each comes from are in `app/measure/data/paper_figures.json`. Today's UDP "
           "figure is the highest rate carried with at most 1 % loss (a short search over offered rates); "
           "the paper's is iperf3's result at its offered rate, whatever its loss.", ""]
    for cell, c in comparisons:
        out += _cell_md(cell, c)
    if overhead:
        out += ["### IPv6 overhead: throughput over IPv6 / over IPv4", "",
                "| suite | TCP today | TCP paper (Table 5) | UDP today | UDP paper (Table 5) |",
                "|---|---:|---:|---:|---:|"]
        out += [f"| {o.esp} | {_f(o.tcp, 3)} | {_f(o.paper_tcp, 3)} | {_f(o.udp, 3)} | {_f(o.paper_udp, 3)} |"
                for o in overhead]
        out.append("")
        out += [f"![{caption}]({name})" + "\n" for caption, name in plots.items()]
    rtt = figures.rtt_by_size
    tcp_cells = [c for c in tunnel.cells if any(s.rtt_ms for s in c.suites)]
    if rtt and tcp_cells:
        first, last = rtt[0], rtt[-1]
        out += ["### RTT by packet size (Al Boloushi and Al Dhaheri Table 3)", "",
                f"RTT at the largest packet / at the smallest. Paper ({first.table}, MTU {first.mtu_bytes} to "
                f"{last.mtu_bytes} B): plain TCP/IP {_f(last.plain_us / first.plain_us, 2)}, AH+ESP "
                f"{_f(last.ah_esp_us / first.ah_esp_us, 2)}; AH+ESP over plain at {first.mtu_bytes} B "
                f"{_f(first.ah_esp_us / first.plain_us, 2)}, at {last.mtu_bytes} B "
                f"{_f(last.ah_esp_us / last.plain_us, 2)}.",
                "", "| cell | sizes (ICMP payload B) | no IPsec | ESP suites (median) |", "|---|---|---:|---:|"]
        seen: set[int] = set()
        for cell in tcp_cells:
            if cell.family in seen:  # ICMP: the same samples in each cell of a family
                continue
            seen.add(cell.family)
            growth = rtt_growth(cell)
            if growth is not None:
                small, large, base, suites = growth
                out.append(f"| IPv{cell.family} | {small} to {large} | {_f(base, 2)} | {_f(suites, 2)} |")
        out.append("")
    flows = {r.flows: r for r in figures.bandwidth_by_flows}
    par_cells = [c for c in tunnel.cells if c.protocol == "tcp" and any(s.parallel for s in c.suites)]
    if 1 in flows and par_cells:
        out += ["### Throughput by parallel flows (Al Boloushi and Al Dhaheri Table 4)", "",
                "Throughput with n flows / with one flow.", "",
                "| n | paper plain | paper AH+ESP | " + " | ".join(
                    f"IPv{c.family} no IPsec | IPv{c.family} ESP (median)" for c in par_cells) + " |",
                "|---:|---:|---:|" + "---:|---:|" * len(par_cells)]
        one = flows[1]
        measured = {n for c in par_cells for s in c.suites for n in s.parallel}
        for n in sorted(k for k in flows if k in measured and k != 1):
            row = flows[n]
            gains = [flows_gain(c, n) for c in par_cells]
            out.append(f"| {n} | {_f(row.plain_mb_s / one.plain_mb_s, 2)} | "
                       f"{_f(row.ah_esp_mb_s / one.ah_esp_mb_s, 2)} | "
                       + " | ".join(f"{_f(b, 2)} | {_f(s, 2)}" for b, s in gains) + " |")
        out += ["", f"The paper's flows ({one.table}) are lmbench TCP streams, n up to 80; today's are iperf3 `-P n`."
                , ""]
    return "\n".join(out).rstrip() + "\n"
