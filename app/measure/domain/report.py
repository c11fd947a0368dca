"""What `qoss bench report` says (pure): the Markdown of the runs and of the comparisons.

The runs are read by :mod:`app.measure.domain.runs`, ranked and compared by
:mod:`app.measure.domain.comparison`; the plots are drawn by the adapter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from app.domain.algorithms import CATALOGUE, Kind
from app.domain.scoring import kex_score, throughput_score
from app.measure.domain.comparison import NOISE, Flip, TableComparison, ranks
from app.measure.domain.runs import MicroRun, TunnelRun

__all__ = ["cpu_words", "pinning", "render_markdown"]


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
    seed_among = ranks({rc.row.label: rc.row.value for rc in measured})
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
