"""slow_clients' figures: nearest-rank percentiles of the latencies, and the loopback addresses its
slow sockets connect from."""

from __future__ import annotations

import ipaddress

from benchmarks.slow_clients import Phase, percentile, source_address


def test_percentiles_are_by_nearest_rank_and_0_without_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(list(reversed(values)), 1.0) == 100.0
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([], 0.5) == 0.0


def test_slow_sockets_connect_from_loopback_addresses_other_than_the_legitimate_clients() -> None:
    addresses = [ipaddress.ip_address(source_address(i)) for i in range(0, 200_000, 97)]
    assert all(a.is_loopback for a in addresses)
    assert ipaddress.ip_address("127.0.0.1") not in addresses
    assert source_address(0) == "127.0.0.2"
    assert len({source_address(i) for i in range(2000)}) == 8  # 250 sockets to each


def test_a_phase_counts_what_was_not_answered() -> None:
    phase = Phase(kind="drip", sockets=260, latencies=[0.01, 0.02], other={"ReadTimeout": 3, "503": 1})
    assert (phase.answered, phase.unanswered) == (2, 4)
