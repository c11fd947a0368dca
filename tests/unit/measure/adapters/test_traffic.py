"""What iperf3 (UDP, ``--json``) and ``ping -6`` print, read back; the matrix options refused
before any lab is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.main import app
from app.lab.hosts import LabHost
from app.measure.adapters.traffic import BenchError, iperf3_udp_probe, ping_mean_ms
from app.measure.adapters.tunnel import OpenTunnel, Route, run_matrix
from app.measure.domain.tunnel import SuiteSpec

DATA = Path(__file__).parent / "data"


def test_iperf3_udp_json_gives_the_receivers_rate_jitter_and_loss() -> None:
    # Recorded with iperf 3.12: -u -b 300M -l 1352 -t 1 between two IPv6 namespaces.
    probe = iperf3_udp_probe((DATA / "iperf3_udp.json").read_text())
    assert probe.offered_mbps == pytest.approx(300.0)
    assert probe.received_mbps == pytest.approx(287.2219, rel=1e-4)  # end.sum_received, not what was sent
    assert probe.jitter_ms == pytest.approx(0.0012617, rel=1e-4)
    assert probe.loss_percent == pytest.approx(4.2021, rel=1e-4)


def test_iperf3_udp_json_without_sum_received_takes_the_sum_less_the_loss() -> None:
    doc = json.loads((DATA / "iperf3_udp.json").read_text())
    end = doc["end"]
    del end["sum_received"], end["sum_sent"]
    probe = iperf3_udp_probe(json.dumps(doc))
    assert probe.received_mbps == pytest.approx(299.8457 * (1 - 0.042021), rel=1e-4)
    assert probe.loss_percent == pytest.approx(4.2021, rel=1e-4)


@pytest.mark.parametrize("report", [
    "", "iperf3: error - unable to connect", json.dumps({"error": "unable to connect to server"}), "[]",
    json.dumps({"start": {"test_start": {"target_bitrate": 1}}, "end": {}}),
    json.dumps({"start": {}, "end": {"sum_received": {"bits_per_second": 1e8, "jitter_ms": 0.1, "lost_percent": 0}}}),
    json.dumps({"start": {"test_start": {"target_bitrate": 1e8}},
                "end": {"sum_received": {"bits_per_second": 1e8}}}),  # a TCP report has no jitter
])
def test_what_is_not_a_udp_report_is_a_bench_error(report: str) -> None:
    with pytest.raises(BenchError):
        iperf3_udp_probe(report)


def test_ping_6_summary_gives_the_mean_rtt() -> None:
    assert ping_mean_ms((DATA / "ping6.txt").read_text()) == pytest.approx(0.049)


class _NoTunnels:
    def open(self, suite: SuiteSpec) -> OpenTunnel:
        raise AssertionError("no tunnel may be opened")

    def close(self, tunnel: OpenTunnel) -> None:
        raise AssertionError("no tunnel may be closed")


@pytest.mark.parametrize(("protocols", "families"), [(("sctp",), (4,)), (("tcp", "tcp"), (4,)), ((), (4,)),
                                                     (("tcp",), (4, 4)), (("tcp",), (5,)), (("tcp",), ())])
def test_the_matrix_refuses_unknown_cells_before_measuring(protocols: tuple[str, ...],
                                                           families: tuple[int, ...]) -> None:
    host = LabHost("left", "qoss-no-such-netns", "/nonexistent", "10.99.0.1", "10.1.0.1", "/nonexistent")
    routes = [Route(f, _NoTunnels(), ("10.99.0.1", "10.99.0.2"), ("10.1.0.1", "10.2.0.1")) for f in families]
    with pytest.raises(ValueError, match=r"protocols|routes"):
        run_matrix(initiator=host, responder=host, routes=routes, protocols=protocols,
                   suites=[SuiteSpec("aes128gcm16")], repetitions=1, duration=1.0)


@pytest.mark.parametrize(("args", "says"), [
    (["--family", "5"], "--family"), (["--family", "4,4"], "--family"), (["--protocol", "sctp"], "--protocol"),
    (["--protocol", "udp", "--write-table", "t"], "TCP throughput"),
])
def test_the_command_refuses_bad_cells_before_any_lab(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["bench", "tunnel", "--suites", "aes128gcm16", *args])
    assert result.exit_code == 2
    assert says in result.output
