"""Each cell of a tunnel measurement beside the papers: the data file, the cell tables, where
today's ranking differs, the IPv6 overhead and the Markdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.domain.errors import InvalidInput
from app.measure.domain.papers import (
    cell_comparisons,
    cell_table,
    flows_gain,
    ipv6_overhead,
    parse_paper_figures,
    render_matrix,
    rtt_growth,
)
from app.measure.domain.runs import parse_tunnel

FIGURES_FILE = Path(__file__).parents[4] / "app" / "measure" / "data" / "paper_figures.json"
FIGURES = parse_paper_figures(json.loads(FIGURES_FILE.read_text()))


def _stat(value: float) -> dict[str, Any]:
    return {"median": value, "spread": 0.0, "samples": [value]}


def _suite(esp: str, mbps: float, **more: Any) -> dict[str, Any]:
    return {"esp": esp, "ike": None, "throughput_mbps": _stat(mbps), **more}


def _doc() -> dict[str, Any]:
    """Two families, both protocols; over IPv4 TCP aes128-sha256 beats aes128-sha1 (the paper: the other way)."""
    rtt = {"64": _stat(0.30), "1400": _stat(0.45)}
    par = {"1": _stat(200.0), "2": _stat(220.0), "4": _stat(230.0)}
    cells = []
    for family, scale in ((4, 1.0), (6, 0.9)):
        tcp = [_suite("aes128gcm16", 260 * scale, rtt_ms=rtt, parallel_mbps=par),
               _suite("aes128-sha1", 200 * scale, rtt_ms=rtt, parallel_mbps=par),
               _suite("aes128-sha256", 240 * scale if family == 4 else 150.0, rtt_ms=rtt, parallel_mbps=par)]
        udp = [_suite(s["esp"], s["throughput_mbps"]["median"] * 0.8, jitter_ms=_stat(0.05), loss_percent=_stat(0.5),
                      offered_mbps=_stat(s["throughput_mbps"]["median"] * 0.81)) for s in tcp]
        base = {"throughput_mbps": _stat(6000 * scale), "rtt_ms": {"64": _stat(0.05), "1400": _stat(0.05)},
                "parallel_mbps": {"1": _stat(6000.0), "2": _stat(5000.0)}}
        cells += [{"family": family, "protocol": "tcp", "baseline": base, "suites": tcp},
                  {"family": family, "protocol": "udp", "baseline": {"throughput_mbps": _stat(110 * scale)},
                   "suites": udp}]
    return {"kind": "qoss-bench-tunnel", "version": 2, "baseline": cells[0]["baseline"], "suites": cells[0]["suites"],
            "cells": cells}


def test_the_data_file_names_the_table_of_every_figure() -> None:
    assert all(f.paper and f.table.startswith("Table ") for f in FIGURES.throughput)
    table5 = [f for f in FIGURES.throughput if f.table == "Table 5"]
    assert len(table5) == 6 * 4  # six rows, IPv4/IPv6 x TCP/UDP
    assert {f.protocol for f in FIGURES.throughput if f.table != "Table 5"} == {"udp"}
    gcm6 = next(f for f in table5 if (f.esp, f.family, f.protocol) == ("aes128gcm16", 6, "tcp"))
    assert gcm6.throughput_mbps == 873
    xcbc = next(f for f in FIGURES.throughput if f.esp == "null-aesxcbc" and f.family == 6)
    assert (xcbc.table, xcbc.loss_percent) == ("Table 8", 30)
    assert [r.mtu_bytes for r in FIGURES.rtt_by_size] == [300, 600, 900, 1200, 1500]
    assert FIGURES.bandwidth_by_flows[0].ah_esp_mb_s == 39.35
    with pytest.raises(InvalidInput):
        parse_paper_figures({"kind": "qoss-paper-figures", "throughput": [{"family": 5}]})


def test_a_udp_cell_takes_each_suite_from_a_table_with_jitter_and_loss() -> None:
    table = cell_table(FIGURES, 4, "udp")
    assert table is not None
    rows = {r.label: r for r in table.rows}
    assert rows["AES128-GCM16"].extra == {"jitter ms": 0.06, "loss %": 0}
    assert "Table 6" in rows["AES128-GCM16"].citation
    assert "Table 7" in rows["3DES-SHA256"].citation
    assert rows["3DES-SHA256"].keywords == ("3des", "sha256")
    assert rows["No IPSec"].keywords == ()
    assert len(rows) == 11  # Tables 6-8 without their repeated rows
    tcp = cell_table(FIGURES, 6, "tcp")
    assert tcp is not None
    assert {r.citation.split(",")[0] for r in tcp.rows} == {
        "Thiruvasagam and George (2019) Table 5"}


def test_each_cell_is_ranked_and_a_different_order_today_is_named() -> None:
    run = parse_tunnel(_doc())
    compared = {cell.label: c for cell, c in cell_comparisons(run, FIGURES)}
    assert list(compared) == ["IPv4 TCP", "IPv4 UDP", "IPv6 TCP", "IPv6 UDP"]
    flips = [(f.faster_now.label, f.faster_then.label) for f in compared["IPv4 TCP"].flips]
    assert flips == [("AES128-SHA2 256", "AES128-SHA1 160")]
    assert compared["IPv6 TCP"].flips == ()  # there sha256 is slower, as in the paper


def test_the_ipv6_overhead_is_per_suite_beside_table_5() -> None:
    overhead = {o.esp: o for o in ipv6_overhead(parse_tunnel(_doc()), FIGURES)}
    assert next(iter(overhead)) == "(no IPsec)"
    gcm = overhead["aes128gcm16"]
    assert gcm.tcp == pytest.approx(0.9)
    assert gcm.udp == pytest.approx(0.9)
    assert gcm.paper_tcp == pytest.approx(873 / 899)
    assert gcm.paper_udp == pytest.approx(885 / 942)
    assert overhead["aes128-sha256"].tcp == pytest.approx(150 / 240)
    # One family only: nothing to divide.
    assert ipv6_overhead(parse_tunnel({"kind": "qoss-bench-tunnel", "suites": []}), FIGURES) == []


def test_rtt_growth_and_flow_gains_are_ratios() -> None:
    cell = parse_tunnel(_doc()).cell(4, "tcp")
    assert cell is not None
    assert rtt_growth(cell) == (64, 1400, pytest.approx(1.0), pytest.approx(1.5))
    assert flows_gain(cell, 2) == (pytest.approx(5000 / 6000), pytest.approx(1.1))


def test_the_markdown_has_every_cell_the_overhead_and_the_shapes() -> None:
    run = parse_tunnel(_doc())
    text = render_matrix(tunnel=run, comparisons=cell_comparisons(run, FIGURES),
                         overhead=ipv6_overhead(run, FIGURES), figures=FIGURES,
                         plots={"IPv6 overhead per suite": "ipv6_overhead.png"})
    for title in ("Table 5: IPv4 TCP", "Table 6, Table 7, Table 8: IPv4 UDP", "Table 5: IPv6 TCP",
                  "Table 6, Table 7, Table 8: IPv6 UDP"):
        assert f"#### Thiruvasagam and George {title}" in text
    assert ("Where today's ranking differs (today's faster row first, today's figures, then the paper's): "
            "AES128-SHA2 256 > AES128-SHA1 160 (240 vs 200 Mbit/s; paper 710 vs 839; "
            "today's vectorised SHA code") in text
    assert "| aes128gcm16 | 0.900 | 0.971 | 0.900 | 0.939 |" in text
    assert "![IPv6 overhead per suite](ipv6_overhead.png)" in text
    assert "| 3DES-SHA256 | 184 | 11 | 0.500 | 5.30 | - | not measured | - | - |" in text
    assert "| IPv4 | 64 to 1400 | 1.00 | 1.50 |" in text
    assert "| 2 | 0.99 | 1.16 | 0.83 | 1.10 | 0.83 | 1.10 |" in text
