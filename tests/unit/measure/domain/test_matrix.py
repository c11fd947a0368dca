"""The measurement matrix (pure): the UDP rate search against a fake path, the options, the
version 2 document with a family and protocol on every sample, and reading it back."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.errors import InvalidInput
from app.measure.domain.matrix import (
    CellRuns,
    UdpProbe,
    ipv6_table_name,
    matrix_document,
    parse_families,
    parse_protocols,
    udp_rate_search,
)
from app.measure.domain.runs import parse_tunnel
from app.measure.domain.tunnel import SuiteRun, SuiteSpec

DATA = Path(__file__).parents[1] / "adapters" / "data"


class _FakePath:
    """A path that carries ``capacity`` Mbit/s: beyond it the excess is lost, as iperf3 would report."""

    def __init__(self, capacity: float, *, seconds_per_probe: float = 2.0) -> None:
        self.capacity = capacity
        self.offered: list[float] = []
        self.now = 0.0
        self.seconds_per_probe = seconds_per_probe

    def __call__(self, rate: float) -> UdpProbe:
        self.offered.append(rate)
        self.now += self.seconds_per_probe
        received = min(rate, self.capacity)
        return UdpProbe(rate, received, 0.05, 100 * (rate - received) / rate)

    def clock(self) -> float:
        return self.now


def test_the_search_finds_the_highest_rate_within_one_percent_loss_from_a_hint_above_it() -> None:
    path = _FakePath(capacity=180.0)
    found = udp_rate_search(path, start_mbps=270.0, max_steps=5, clock=path.clock)
    assert found.within_limit
    assert found.best.loss_percent <= 1.0
    assert 180 * 0.85 <= found.best.received_mbps <= 180.0
    assert len(found.probes) <= 5
    assert path.offered[0] == 270.0  # the hint first
    assert path.offered[1] == pytest.approx(180 * 0.9)  # then just under what got through


def test_the_search_raises_the_rate_while_nothing_is_lost() -> None:
    path = _FakePath(capacity=1000.0)
    found = udp_rate_search(path, start_mbps=100.0, max_steps=4, clock=path.clock)
    assert path.offered == pytest.approx([100.0, 150.0, 225.0, 337.5])
    assert found.best.received_mbps == pytest.approx(337.5)


def test_the_search_stops_once_the_bounds_are_within_the_tolerance() -> None:
    path = _FakePath(capacity=100.0)
    found = udp_rate_search(path, start_mbps=99.0, max_steps=20, clock=path.clock, tolerance=0.1)
    assert len(found.probes) < 20
    assert found.best.received_mbps >= 100 / 1.1 * 0.99


def test_the_search_is_bounded_in_time() -> None:
    path = _FakePath(capacity=50.0, seconds_per_probe=3.0)
    found = udp_rate_search(path, start_mbps=500.0, max_steps=10, budget_s=5.0, clock=path.clock)
    assert len(found.probes) == 2  # started at 0 and 3 s; none after 5 s


def test_with_no_rate_within_the_limit_the_least_loss_is_kept_and_said() -> None:
    def lossy(rate: float) -> UdpProbe:
        return UdpProbe(rate, rate * 0.95, 0.2, 5.0 if rate > 80 else 3.0)

    now = iter(range(100))
    found = udp_rate_search(lossy, start_mbps=100.0, max_steps=4, clock=lambda: float(next(now)))
    assert not found.within_limit
    assert found.best.loss_percent == 3.0
    assert len(found.probes) == 4


@given(capacity=st.floats(5.0, 5000.0), start=st.floats(1.0, 8000.0), steps=st.integers(1, 8))
def test_the_search_never_exceeds_its_steps_nor_reports_a_lossy_rate_as_within(capacity: float, start: float,
                                                                                steps: int) -> None:
    path = _FakePath(capacity)
    found = udp_rate_search(path, start_mbps=start, max_steps=steps, clock=path.clock, budget_s=1e9)
    assert 1 <= len(found.probes) <= steps
    assert found.within_limit == (found.best.loss_percent <= 1.0)
    assert all(1.0 <= r <= 10_000.0 for r in path.offered)


@pytest.mark.parametrize("kwargs", [{"max_steps": 0}, {"start_mbps": 0.0}, {"tolerance": 0.0}])
def test_the_search_refuses_bad_bounds(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        udp_rate_search(_FakePath(10.0), **kwargs)


def test_families_and_protocols_are_read_in_the_order_given() -> None:
    assert parse_families("4") == (4,)
    assert parse_families("6,4") == (6, 4)
    assert parse_protocols("tcp,udp") == ("tcp", "udp")
    assert parse_protocols("UDP") == ("udp",)
    for bad in ("5", "4,4", "", "four"):
        with pytest.raises(InvalidInput):
            parse_families(bad)
    for bad in ("sctp", "tcp,tcp", ""):
        with pytest.raises(InvalidInput):
            parse_protocols(bad)
    assert ipv6_table_name("lab-measured") == "lab-measured-ipv6"


# --------------------------------------------------------------------------- the document


def _sample(run: SuiteRun, family: int, protocol: str, metric: str, value: float, **where: int) -> None:
    run.samples.append({"esp": run.esp, "family": family, "protocol": protocol, "metric": metric, **where,
                        "repetition": 0, "value": value})


def _cells() -> list[CellRuns]:
    gcm = SuiteSpec("aes128gcm16")
    cells = []
    for family in (4, 6):
        rtt = {64: [0.3], 1400: [0.4]}
        tcp = SuiteRun(gcm, esp="aes128gcm16", ike="aes128gcm16-prfsha256-x25519", throughput_mbps=[250.0],
                       parallel_mbps={1: [250.0], 2: [260.0]}, rtt_ms=dict(rtt))
        udp = SuiteRun(gcm, esp="aes128gcm16", ike="aes128gcm16-prfsha256-x25519", throughput_mbps=[180.0],
                       offered_mbps=[182.0], jitter_ms=[0.05], loss_percent=[0.4], within_loss_limit=[True],
                       rtt_ms=dict(rtt))
        _sample(tcp, family, "tcp", "throughput_mbps", 250.0, flows=1)
        _sample(tcp, family, "tcp", "throughput_mbps", 260.0, flows=2)
        _sample(tcp, family, "icmp", "rtt_ms", 0.3, size=64)
        _sample(udp, family, "udp", "throughput_mbps", 180.0, flows=1)
        base_tcp = SuiteRun(None, throughput_mbps=[6000.0])
        base_udp = SuiteRun(None, throughput_mbps=[110.0], offered_mbps=[111.0], jitter_ms=[0.01],
                            loss_percent=[0.9], within_loss_limit=[True])
        cells += [CellRuns(family, "tcp", base_tcp, [tcp]), CellRuns(family, "udp", base_udp, [udp])]
    return cells


def _doc() -> dict[str, Any]:
    return matrix_document(machine="m", backend="kernel-libipsec", date="2026-11-27", repetitions=1, duration_s=1.0,
                           cells=_cells(), udp={"loss_limit_percent": 1.0})


def test_the_document_has_every_cell_and_a_family_and_protocol_on_every_sample() -> None:
    doc = _doc()
    json.dumps(doc)
    assert doc["version"] == 2
    assert doc["families"] == [4, 6]
    assert doc["protocols"] == ["tcp", "udp"]
    assert [(c["family"], c["protocol"]) for c in doc["cells"]] == [(4, "tcp"), (4, "udp"), (6, "tcp"), (6, "udp")]
    assert doc["baseline"] == doc["cells"][0]["baseline"]  # version 1 readers read the first cell
    assert doc["suites"] == doc["cells"][0]["suites"]
    udp = doc["cells"][1]["suites"][0]
    assert udp["throughput_mbps"]["median"] == 180.0
    assert udp["jitter_ms"]["median"] == 0.05
    assert udp["loss_percent"]["median"] == 0.4
    assert udp["offered_mbps"]["median"] == 182.0
    assert udp["within_loss_limit"] == [True]
    assert "jitter_ms" not in doc["cells"][0]["suites"][0]  # a TCP cell has none
    assert all({"esp", "family", "protocol", "metric", "value", "repetition"} <= set(s) for s in doc["samples"])
    assert all(("flows" in s) != ("size" in s) for s in doc["samples"])
    assert {(s["family"], s["protocol"]) for s in doc["samples"]} == {
        (f, p) for f in (4, 6) for p in ("tcp", "udp", "icmp")}
    assert {s["flows"] for s in doc["samples"] if s["metric"] == "throughput_mbps" and s["protocol"] == "tcp"} == {1, 2}
    with pytest.raises(InvalidInput):
        matrix_document(machine="m", backend="b", date="d", repetitions=1, duration_s=1.0, cells=[])


def test_the_document_reads_back_cell_by_cell() -> None:
    run = parse_tunnel(_doc())
    assert [c.label for c in run.cells] == ["IPv4 TCP", "IPv4 UDP", "IPv6 TCP", "IPv6 UDP"]
    cell = run.cell(6, "udp")
    assert cell is not None
    (suite,) = cell.suites
    assert suite.jitter_ms is not None
    assert suite.jitter_ms.median == 0.05
    assert suite.loss_percent is not None
    assert suite.loss_percent.median == 0.4
    assert suite.throughput is not None
    assert suite.throughput.median == 180.0
    assert run.suites == run.cells[0].suites


def test_an_old_document_is_one_cell_ipv4_tcp() -> None:
    old = json.loads((DATA / "tunnel_lab_first.json").read_text())
    assert "cells" not in old
    assert "samples" not in old
    run = parse_tunnel(old)
    (cell,) = run.cells
    assert (cell.family, cell.protocol) == (4, "tcp")
    assert cell.suites == run.suites
    assert len(cell.suites) == 10
    assert run.cell(6, "tcp") is None


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(cells=[]),
    lambda d: d.update(cells=[{"family": 5, "protocol": "tcp"}]),
    lambda d: d.update(cells=[{"family": 4, "protocol": "sctp"}]),
    lambda d: d.update(cells=[{"family": 4, "protocol": "tcp"}, {"family": 4, "protocol": "tcp"}]),
    lambda d: d["cells"][1]["suites"][0].update(jitter_ms={"spread": 0.1}),
])
def test_malformed_cells_are_refused(mutate: Callable[[dict[str, Any]], None]) -> None:
    doc = _doc()
    mutate(doc)
    with pytest.raises(InvalidInput):
        parse_tunnel(doc)


def test_a_table_measured_over_ipv6_says_so_and_is_named_for_it() -> None:
    from app.adapters.files import load_rating_table
    from app.measure.domain.tunnel import tunnel_table
    from app.settings import SHIPPED_RATINGS_DIR

    base = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
    (tcp6,) = [c for c in _cells() if (c.family, c.protocol) == (6, "tcp")]
    table = tunnel_table(name=ipv6_table_name("lab"), base=base, runs=tcp6.suites, machine="m",
                         backend="kernel-libipsec", date="2026-11-27", family=6)
    assert table.name == "lab-ipv6"
    assert "over IPv6" in table.description
    measurement = table.ratings["aes128gcm16"].measurement
    assert measurement is not None
    assert "iperf3 TCP over IPv6" in (measurement.method or "")
