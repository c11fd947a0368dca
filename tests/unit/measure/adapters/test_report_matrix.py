"""`qoss bench report` with a measurement matrix: each cell beside the papers, the IPv6 overhead
table and plot; an old document (IPv4 TCP) still makes its report."""

from __future__ import annotations

import json
from pathlib import Path

from app.measure.adapters.report import PAPER_FIGURES, paper_figures, write_report
from tests.unit.measure.domain.test_papers import _doc

DATA = Path(__file__).parent / "data"
PNG = b"\x89PNG\r\n\x1a\n"


def test_the_shipped_paper_figures_are_the_ones_the_report_reads() -> None:
    assert PAPER_FIGURES.is_file()
    assert len(paper_figures().throughput) == len(json.loads(PAPER_FIGURES.read_text())["throughput"])


def test_a_matrix_report_has_every_cell_and_the_ipv6_overhead_plot(tmp_path: Path) -> None:
    (tmp_path / "matrix.json").write_text(json.dumps(_doc()))
    report = write_report(micro_path=DATA / "micro_recorded.json", tunnel_path=tmp_path / "matrix.json",
                          out_dir=tmp_path / "out", flags=frozenset({"aes", "sha_ni"}))
    plot = tmp_path / "out" / "ipv6_overhead.png"
    assert plot in report.plots
    data = plot.read_bytes()
    assert data.startswith(PNG)
    assert 5_000 < len(data) < 200_000
    text = report.markdown.read_text()
    assert "## The measurement matrix beside the papers" in text
    assert "Cells measured: IPv4 TCP, IPv4 UDP, IPv6 TCP, IPv6 UDP." in text
    assert "### IPv6 overhead: throughput over IPv6 / over IPv4" in text
    assert text.count("](ipv6_overhead.png)") == 1  # beside its table
    sources = {c.source for c in report.comparisons}
    assert {"tunnel, IPv4 TCP", "tunnel, IPv6 UDP"} <= sources


def test_an_old_document_reports_its_one_cell_and_no_overhead(tmp_path: Path) -> None:
    report = write_report(micro_path=DATA / "micro_recorded.json", tunnel_path=DATA / "tunnel_lab_first.json",
                          out_dir=tmp_path, flags=frozenset())
    text = report.markdown.read_text()
    assert "Cells measured: IPv4 TCP." in text
    assert "#### Thiruvasagam and George Table 5: IPv4 TCP" in text
    assert "IPv6 overhead" not in text
    assert not (tmp_path / "ipv6_overhead.png").exists()
