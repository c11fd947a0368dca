"""The measurement matrix for real at its smallest: one suite, 1-second runs, IPv4 and IPv6,
TCP and UDP, through real kernel-libipsec tunnels, beside the no-IPsec baseline (two UDP probes).

The lab (its own namespace prefix ``qbx``) and its database are torn down on exit, also on failure.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.lab.bench import bench_lab
from app.lab.hosts import LabHost
from app.measure.adapters.tunnel import OpenTunnel, TunnelOpener, run_matrix
from app.measure.domain.matrix import matrix_document
from app.measure.domain.runs import parse_tunnel
from app.measure.domain.tunnel import SuiteSpec

pytestmark = pytest.mark.charon


@dataclasses.dataclass
class _Watching:
    """The bench's opener; what charon reports for each tunnel it opens is kept: the IKE SA's
    addresses and the CHILD_SA's selectors."""

    opener: TunnelOpener
    host: LabHost
    seen: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = dataclasses.field(default_factory=list)

    def open(self, suite: SuiteSpec) -> OpenTunnel:
        tunnel = self.opener.open(suite)
        for sa in self.host.gateway(timeout=5.0).list_sas(ike=tunnel.conn):
            for child in sa.children:
                self.seen.append((sa.local_host, sa.remote_host, child.local_ts, child.remote_ts))
        return tunnel

    def close(self, tunnel: OpenTunnel) -> None:
        self.opener.close(tunnel)


def test_one_suite_in_every_cell_over_both_families_and_protocols() -> None:
    suite = SuiteSpec("aes128gcm16")
    with bench_lab(prefix_hint="qbx", families=(4, 6)) as bl:
        assert bl.gateways6 is not None
        assert [g.ike_address for g in bl.gateways6] == ["fd00:71::1", "fd00:71::2"]
        candidates = bl.candidates()
        routes = bl.routes(candidates, (4, 6))
        assert [r.inside for r in routes] == [("10.1.0.1", "10.2.0.1"), ("fd01::1", "fd02::1")]
        watched = [_Watching(r.opener, bl.initiator) for r in routes]
        routes = [dataclasses.replace(r, opener=w) for r, w in zip(routes, watched, strict=True)]
        result = run_matrix(initiator=bl.initiator, responder=bl.responder, routes=routes, protocols=("tcp", "udp"),
                            suites=[suite], repetitions=1, duration=1.0, ping_count=3, flows=(1, 2),
                            sizes=(64, 1000), udp_steps=2)
        gateways = [bl.initiator.gateway(timeout=5.0), bl.responder.gateway(timeout=5.0)]
        left_over = [(g.list_sas(), g.list_conns()) for g in gateways]
    assert result.skipped == {}
    # IKE and ESP ran over each family's addresses, the selectors its inside networks.
    assert watched[0].seen == [("10.99.0.1", "10.99.0.2", ("10.1.0.1/32",), ("10.2.0.1/32",))]
    assert watched[1].seen == [("fd00:71::1", "fd00:71::2", ("fd01::/64",), ("fd02::/64",))]
    assert left_over == [([], []), ([], [])]
    doc = matrix_document(machine="m", backend="kernel-libipsec", date="2026-11-27", repetitions=1, duration_s=1.0,
                          cells=result.cells)
    assert [(c["family"], c["protocol"]) for c in doc["cells"]] == [(4, "tcp"), (4, "udp"), (6, "tcp"), (6, "udp")]
    for cell in doc["cells"]:
        assert cell["baseline"]["throughput_mbps"]["median"] > 0  # between the IKE addresses of the family
        (row,) = cell["suites"]
        assert row["esp"] == "aes128gcm16"
        assert row["throughput_mbps"]["median"] > 0
        assert set(row["rtt_ms"]) == {"64", "1000"}
        if cell["protocol"] == "tcp":
            assert set(row["parallel_mbps"]) == {"1", "2"}
        else:
            assert row["loss_percent"]["median"] >= 0
            assert row["jitter_ms"]["median"] >= 0
            assert row["offered_mbps"]["median"] > 0
            assert len(row["within_loss_limit"]) == 1
    # The IPv6 cells' traffic went through an IPv6 tunnel: charon's CHILD_SA carried it.
    v6 = next(c for c in result.cells if (c.family, c.protocol) == (6, "tcp"))
    (observed,) = v6.suites[0].observed
    assert observed["encr_alg"] == "AES_GCM_16"
    assert observed["bytes_out"] > 100_000
    kinds = {(s["family"], s["protocol"], s["metric"]) for s in doc["samples"]}
    assert {(6, "tcp", "throughput_mbps"), (6, "udp", "throughput_mbps"), (6, "udp", "jitter_ms"),
            (6, "udp", "loss_percent"), (6, "icmp", "rtt_ms"), (4, "icmp", "rtt_ms")} <= kinds
    assert {s["size"] for s in doc["samples"] if s["metric"] == "rtt_ms"} == {64, 1000}
    assert {s["esp"] for s in doc["samples"] if s["family"] == 6} == {None, "aes128gcm16"}
    assert {s["flows"] for s in doc["samples"] if s["protocol"] == "tcp"} == {1, 2}
    run = parse_tunnel(json.loads(json.dumps(doc)))
    assert [c.label for c in run.cells] == ["IPv4 TCP", "IPv4 UDP", "IPv6 TCP", "IPv6 UDP"]
