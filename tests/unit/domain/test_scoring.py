"""The latency model and the score mapping, on recorded data (seed 000 Table 4)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.adapters.files import load_rating_table
from app.domain.errors import InvalidInput
from app.domain.scoring import (
    MicroResult,
    fit_linear,
    kex_score,
    low_estimate,
    measured_table,
    split_half_spread,
    throughput_score,
)
from app.settings import REPO_ROOT

#: Seed 000 Table 4, ESP AES-128 + AH SHA-1, transport mode: cycles per packet.
TABLE_4_AES_SHA1 = [(64, 24587), (300, 43944), (700, 74956), (1400, 131012)]


def test_fit_reproduces_seed_000_section_5_5() -> None:
    fit = fit_linear(TABLE_4_AES_SHA1)
    assert fit.a == pytest.approx(79.5, abs=0.5)  # "a = 79.5 cycles/Byte"
    assert fit.b == pytest.approx(19_700, rel=0.02)  # "b = 19,700 cycles"
    assert fit.r2 > 0.999


def test_fit_needs_two_sizes() -> None:
    with pytest.raises(InvalidInput):
        fit_linear([(64, 1.0), (64, 2.0)])


@given(st.floats(1.5, 1e5), st.floats(1.5, 1e5))
def test_scores_are_monotone(x: float, y: float) -> None:
    lo, hi = sorted((x, y))
    assert throughput_score(lo) <= throughput_score(hi)
    assert kex_score(lo) <= kex_score(hi)


def test_scores_match_standards_2026_calibration() -> None:
    assert throughput_score(1000) == pytest.approx(9.09, abs=0.01)  # 1 GB/s
    assert throughput_score(2000) == 10
    assert kex_score(12400) == pytest.approx(8.19, abs=0.01)  # x25519 in standards-2026


def test_low_estimate_ignores_slow_interfered_batches() -> None:
    runs = [100.0] * 30 + [150.0] * 20
    assert low_estimate(runs) == 100.0
    assert split_half_spread(runs) == 0.0
    assert split_half_spread([1.0] * 5) == 1.0  # too few runs to judge


def test_measured_table_keeps_base_levels_and_fills_measurements() -> None:
    base = load_rating_table(REPO_ROOT / "ratings" / "standards-2026.yaml")
    results = [
        MicroResult("aes128gcm16", {64: 500.0, 300: 560.0, 700: 650.0, 1400: 800.0}, 0.01, 1000, "AES-GCM seal"),
        MicroResult("x25519", {}, 0.02, 500, "keygen + shared secret", ops_per_s=12000.0),
        MicroResult("not-in-base", {64: 1.0, 1400: 2.0}, 0.0, 1, "x"),
    ]
    table = measured_table(name="m", base=base, results=results, machine="test", backend="userspace",
                           date="2026-11-22", description="d")
    assert set(table.ratings) == {"aes128gcm16", "x25519"}
    gcm = table.ratings["aes128gcm16"]
    assert (gcm.confidentiality, gcm.integrity) == (base.ratings["aes128gcm16"].confidentiality,
                                                   base.ratings["aes128gcm16"].integrity)
    assert gcm.measurement is not None
    assert gcm.measurement.a_ns_per_byte == pytest.approx((800 - 500) / (1400 - 64), rel=0.1)
    assert gcm.measurement.throughput_mbps == pytest.approx(1400 / 800 * 1000 * 8, rel=0.01)
    assert table.ratings["x25519"].performance == kex_score(12000)
