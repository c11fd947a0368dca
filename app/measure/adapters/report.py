"""`qoss bench report`: read the benchmark JSON, draw the plots (matplotlib, Agg), write report.md.

The runs, ranking, comparison and Markdown are pure (``app.measure.domain.runs``,
``.comparison``, ``.report``); this module does the files and the drawing. Figures are made
with matplotlib's object API on the Agg canvas (no pyplot state, no display), at a size and
resolution that keeps each PNG small.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from app.adapters.files import read_document
from app.domain.errors import InvalidInput
from app.domain.scoring import SIZES
from app.measure.domain.comparison import (
    TableComparison,
    compare,
    today_from_micro,
    today_from_tunnel,
    tunnel_spreads,
)
from app.measure.domain.papers import (
    Overhead,
    PaperFigures,
    cell_comparisons,
    ipv6_overhead,
    parse_paper_figures,
    render_matrix,
)
from app.measure.domain.report import cpu_words, render_markdown
from app.measure.domain.runs import MicroRun, TunnelRun, parse_micro, parse_tunnel
from app.measure.domain.seed_tables import SEED_TABLES

__all__ = ["LATENCY_KEYWORDS", "PAPER_FIGURES", "Report", "cpu_flags", "paper_figures", "write_report"]

#: The transforms drawn in the latency plot, by panel: the main ones of each kind.
LATENCY_KEYWORDS: dict[str, tuple[str, ...]] = {
    "AEAD (seal)": ("aes128gcm16", "aes256gcm16", "chacha20poly1305", "aes128ccm16"),
    "cipher (CBC/CTR encrypt)": ("aes128", "aes256", "aes128ctr", "camellia128", "cast128"),
    "MAC (HMAC/CMAC)": ("md5", "sha1", "sha256", "sha512", "aescmac"),
}
_DPI = 90
#: The papers' figures the report sets each cell of a tunnel measurement beside (see :mod:`app.measure.domain.papers`).
PAPER_FIGURES = Path(__file__).resolve().parent.parent / "data" / "paper_figures.json"


@dataclass(frozen=True)
class Report:
    """What :func:`write_report` wrote."""

    markdown: Path
    plots: tuple[Path, ...]
    comparisons: tuple[TableComparison, ...]


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU feature flags (``aes``, ``sha_ni``, ...) of this machine; empty if unknown."""
    try:
        with cpuinfo.open() as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _load(path: Path, what: str) -> Any:
    try:
        return json.loads(read_document(path))  # a regular file within the document cap, never /dev/zero
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{what}: cannot read {path}: {exc}") from exc


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=_DPI)
    return path


def _log_barh(labels: list[str], values: list[float], colours: str | list[str], *, row: float, labelsize: int,
              xlabel: str, title: str, path: Path) -> Path:
    """A horizontal bar chart on a log axis, one bar per row, saved to ``path``."""
    fig = Figure(figsize=(7.5, row * len(labels) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    ax.barh(labels, values, color=colours)
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.tick_params(axis="y", labelsize=labelsize)
    ax.grid(axis="x", which="both", alpha=0.3)
    return _save(fig, path)


def _plot_micro_throughput(micro: MicroRun, path: Path) -> Path:
    rows = sorted((r for r in micro.results if r.ops_per_s is None), key=lambda r: r.mb_per_s)
    return _log_barh([r.keyword for r in rows], [r.mb_per_s for r in rows], "tab:blue", row=0.18, labelsize=7,
                     xlabel="MB/s at 1400 B (log scale)",
                     title="Micro: throughput per transform, one core, userspace crypto", path=path)


def _plot_latency(micro: MicroRun, path: Path) -> Path:
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    axes = fig.subplots(1, len(LATENCY_KEYWORDS), sharex=True)
    xs = [0.0, float(max(SIZES))]
    for ax, (panel, keywords) in zip(axes, LATENCY_KEYWORDS.items(), strict=True):
        drawn = 0
        for keyword in keywords:
            result = micro.get(keyword)
            if result is None or result.ops_per_s is not None:
                continue
            drawn += 1
            fit = result.fit
            sizes = sorted(result.ns_by_size)
            (line,) = ax.plot(xs, [fit.at(int(x)) for x in xs], linewidth=1)
            ax.plot(sizes, [result.ns_by_size[s] for s in sizes], "o", color=line.get_color(), markersize=4,
                    label=f"{keyword}: {fit.a:.2f}·B + {fit.b:,.0f}")
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("packet size (bytes)")
        if drawn:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "none measured in this run", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("ns per packet")
    fig.suptitle("Micro: ns per packet against size, with the fitted ns = a·bytes + b (Niedermayer et al. §5.5)",
                 fontsize=11)
    return _save(fig, path)


def _plot_kex(micro: MicroRun, path: Path) -> Path:
    rows = sorted((r for r in micro.results if r.ops_per_s is not None), key=lambda r: r.ops_per_s or 0.0)
    colours = ["tab:orange" if r.keyword.startswith("modp") else "tab:green" for r in rows]
    return _log_barh([r.keyword for r in rows], [r.ops_per_s or 0.0 for r in rows], colours, row=0.22, labelsize=8,
                     xlabel="key generation + shared secret per second (log scale); orange: MODP, green: elliptic "
                            "curves",
                     title="Micro: key exchange per group (the IKE cost)", path=path)


def _plot_tunnel(tunnel: TunnelRun, path: Path) -> Path:
    suites = sorted((s for s in tunnel.suites if s.throughput is not None),
                    key=lambda s: s.throughput.median if s.throughput else 0.0)
    fig = Figure(figsize=(7.5, 0.3 * len(suites) + 1.5), layout="constrained")
    ax = fig.add_subplot()
    medians = [s.throughput.median if s.throughput else 0.0 for s in suites]
    # spread = range over median: the bar spans the repetitions' range around the median.
    errors = [(s.throughput.spread or 0.0) * m / 2 if s.throughput else 0.0
              for s, m in zip(suites, medians, strict=True)]
    ax.barh([s.esp for s in suites], medians, xerr=errors, color="tab:purple", capsize=2)
    base = tunnel.baseline.throughput if tunnel.baseline is not None else None
    if base is not None and base.median <= 1.5 * max(medians, default=0.0):
        ax.axvline(base.median, color="black", linestyle="--", linewidth=1, label=f"no IPsec: {base.median:,.0f}")
        ax.legend(fontsize=8)
    elif base is not None:  # far off the scale of the suites: said, not drawn
        ax.text(0.98, 0.02, f"no IPsec: {base.median:,.0f} Mbit/s (off scale)", ha="right", va="bottom",
                transform=ax.transAxes, fontsize=8)
    ax.set_xlabel("Mbit/s through the tunnel (median; whisker: range of the repetitions)")
    pinned = f", pinned to {cpu_words(tunnel.cpus)}" if tunnel.cpus else ""
    ax.set_title(f"Tunnel: throughput per ESP suite ({tunnel.backend or 'charon'}{pinned})")
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def paper_figures(path: Path = PAPER_FIGURES) -> PaperFigures:
    """The papers' figures from the project's data file.

    Raises:
        InvalidInput: missing or not such a document.
    """
    return parse_paper_figures(_load(path, "paper figures"))


def _plot_ipv6_overhead(overhead: list[Overhead], path: Path) -> Path:
    rows = list(reversed(overhead))
    fig = Figure(figsize=(8.5, 0.42 * len(rows) + 1.6), layout="constrained")
    ax = fig.add_subplot()
    ys = list(range(len(rows)))
    height = 0.38
    for offset, attr, paper_attr, colour, label in ((height / 2, "tcp", "paper_tcp", "tab:blue", "TCP"),
                                                    (-height / 2, "udp", "paper_udp", "tab:orange", "UDP")):
        values = [getattr(o, attr) for o in rows]
        ax.barh([y + offset for y in ys], [v if v is not None else 0.0 for v in values], height=height,
                color=colour, label=f"{label} today")
        paper = [(y + offset, getattr(o, paper_attr)) for y, o in zip(ys, rows, strict=True)
                 if getattr(o, paper_attr) is not None]
        if paper:
            ax.plot([v for _, v in paper], [y for y, _ in paper], "k|", markersize=12,
                    label="the paper's ratio\n(Thiruvasagam and\nGeorge Table 5)" if attr == "tcp" else None)
    ax.axvline(1.0, color="grey", linewidth=1, linestyle="--")
    ax.set_yticks(ys, [o.esp for o in rows], fontsize=8)
    ax.set_xlabel("throughput over IPv6 / over IPv4 (1 = no overhead); black tick: the paper's ratio")
    ax.set_title("IPv6 overhead per suite")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def write_report(
    *, micro_path: Path, out_dir: Path, tunnel_path: Path | None = None, commands: Sequence[str] = (),
    levels: Mapping[str, int | None] | None = None, flags: frozenset[str] | None = None,
) -> Report:
    """Write ``out_dir/report.md`` and its PNG plots.

    Args:
        micro_path: JSON from ``qoss bench micro --out``.
        out_dir: created if missing; existing report files are overwritten.
        tunnel_path: JSON from ``qoss bench tunnel --out``, optional.
        commands: the commands that produced the inputs and this report (shown in it).
        levels: today's security level per keyword, for the Table 14 comparison.
        flags: CPU flags for the flip reasons (default: this machine's).

    Raises:
        InvalidInput: an input file is missing or is not such a document.
    """
    micro = parse_micro(_load(micro_path, "micro"))
    tunnel = parse_tunnel(_load(tunnel_path, "tunnel")) if tunnel_path is not None else None
    flags = cpu_flags() if flags is None else flags
    out_dir.mkdir(parents=True, exist_ok=True)
    comparisons: list[TableComparison] = []
    for table in SEED_TABLES:
        comparisons.append(compare(table, today_from_micro(table, micro), source="micro", cpu_flags=flags))
        if tunnel is not None:
            today = today_from_tunnel(table, tunnel)
            if sum(v is not None for v in today.values()) >= 2:
                comparisons.append(compare(table, today, source="tunnel", cpu_flags=flags,
                                           spreads=tunnel_spreads(table, tunnel)))
    plots = {
        "Throughput per transform at 1400 B (micro)": _plot_micro_throughput(micro, out_dir / "throughput_micro.png"),
        "ns per packet against size with fitted lines": _plot_latency(micro, out_dir / "latency_fit.png"),
        "Key exchange per group": _plot_kex(micro, out_dir / "kex.png"),
    }
    if tunnel is not None and tunnel.suites:
        plots["Throughput per ESP suite (tunnel)"] = _plot_tunnel(tunnel, out_dir / "throughput_tunnel.png")
    text = render_markdown(micro=micro, tunnel=tunnel, comparisons=comparisons,
                           plots={caption: p.name for caption, p in plots.items()}, commands=commands, levels=levels)
    if tunnel is not None:  # each cell beside the papers, the IPv6 overhead
        figures = paper_figures()
        cells = cell_comparisons(tunnel, figures, cpu_flags=flags)
        comparisons += [c for _, c in cells]
        overhead = ipv6_overhead(tunnel, figures)
        extra: dict[str, Path] = {}
        if overhead:
            extra["IPv6 overhead per suite"] = _plot_ipv6_overhead(overhead, out_dir / "ipv6_overhead.png")
            plots.update(extra)
        text = text.rstrip() + "\n\n" + render_matrix(tunnel=tunnel, comparisons=cells, overhead=overhead,
                                                       figures=figures,
                                                       plots={c: p.name for c, p in extra.items()})
    markdown = out_dir / "report.md"
    markdown.write_text(text)
    return Report(markdown, tuple(plots.values()), tuple(comparisons))
