"""The latency model and the score mapping, on recorded data (Niedermayer et al. Table 4)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.adapters.files import load_rating_table
from app.domain.errors import InvalidInput
from app.domain.scoring import (
    MicroResult,
    combine_repeats,
    fit_linear,
    kex_score,
    low_estimate,
    measured_table,
    split_half_spread,
    throughput_score,
)
from app.settings import SHIPPED_RATINGS_DIR

#: Niedermayer et al. Table 4, ESP AES-128 + AH SHA-1, transport mode: cycles per packet.
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
    base = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
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


def test_a_fit_that_says_bytes_cost_nothing_is_replaced_by_the_1400_byte_time() -> None:
    base = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
    # noise: the small packets timed slower than the large ones (a negative slope)
    noisy = MicroResult("aes128gcm16", {64: 900.0, 300: 700.0, 700: 650.0, 1400: 800.0}, 0.3, 40, "AES-GCM seal")
    assert noisy.fit.a < 0
    table = measured_table(name="m", base=base, results=[noisy], machine="test", backend="userspace",
                           date="2026-11-27", description="d")
    measurement = table.ratings["aes128gcm16"].measurement
    assert measurement is not None
    assert measurement.a_ns_per_byte == pytest.approx(800 / 1400, abs=1e-4)
    assert measurement.b_ns == 0.0


#: Key exchanges per second recorded by `qoss bench micro --budget 0.5` runs on the build machine
#: (AMD EPYC, 2 cores, cryptography 50 / OpenSSL 3.0.19, 2026-11-23).
RECORDED_KEX = {"x25519": 15976.0, "ecp256": 15509.0, "modp1024s160": 5734.0, "x448": 2995.0, "ecp384": 1924.0,
                "modp2048": 1827.0, "modp2048s256": 1260.0, "modp3072": 709.0, "ecp512bp": 480.0,
                "modp4096": 339.0, "modp6144": 153.0, "modp8192": 75.0}


def test_kex_score_steps_are_factors_of_root_ten() -> None:
    assert [kex_score(10.0**k) for k in range(1, 6)] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert kex_score(1e7) == 10  # clamped
    assert kex_score(0.5) == 0


def test_kex_scores_keep_the_recorded_order() -> None:
    by_speed = sorted(RECORDED_KEX, key=RECORDED_KEX.__getitem__, reverse=True)
    scores = [kex_score(RECORDED_KEX[k]) for k in by_speed]
    assert scores == sorted(scores, reverse=True)
    assert kex_score(RECORDED_KEX["modp2048"]) == pytest.approx(6.52, abs=0.01)
    assert kex_score(RECORDED_KEX["modp8192"]) == pytest.approx(3.75, abs=0.01)
    assert kex_score(RECORDED_KEX["x25519"]) == pytest.approx(8.41, abs=0.01)


def test_measured_table_scores_modp_groups_and_records_the_rate() -> None:
    base = load_rating_table(SHIPPED_RATINGS_DIR / "standards-2026.yaml")
    results = [MicroResult(k, {}, 0.01, 40, "key generation + shared secret", ops_per_s=v)
               for k, v in RECORDED_KEX.items()]
    table = measured_table(name="m", base=base, results=results, machine="EPYC", backend="userspace",
                           date="2026-11-23", description="d")
    assert set(table.ratings) == set(RECORDED_KEX)
    modp = table.ratings["modp8192"]
    assert modp.performance == kex_score(75.0)
    assert modp.key_exchange == base.ratings["modp8192"].key_exchange  # levels kept
    m = modp.measurement
    assert m is not None
    assert (m.machine, m.backend, m.date, m.samples, m.spread) == ("EPYC", "userspace", "2026-11-23", 40, 0.01)
    assert m.method == "key generation + shared secret: 75 ops/s"
    assert m.throughput_mbps is None  # a key exchange has no data-plane figures
    assert table.ratings["x25519"].performance > table.ratings["modp2048"].performance


#: ns per packet recorded for three transforms by `run_micro(budget_per_algorithm=0.5)` on the same machine.
RECORDED_NS = {
    "aes128gcm16": {64: 595.0, 300: 655.0, 700: 725.0, 1400: 834.0},
    "sha256": {64: 1611.0, 300: 1718.0, 700: 1974.0, 1400: 2362.0},
    "3des": {64: 6493.0, 300: 14182.0, 700: 26954.0, 1400: 49648.0},
}


def test_throughput_scores_and_fits_on_recorded_packets() -> None:
    results = {k: MicroResult(k, ns, 0.01, 1000, "m") for k, ns in RECORDED_NS.items()}
    for r in results.values():
        assert r.fit.r2 > 0.98  # Niedermayer et al. §5.5: linear is enough
        assert r.fit.a > 0
    scores = {k: throughput_score(r.mb_per_s) for k, r in results.items()}
    assert scores["aes128gcm16"] > scores["sha256"] > scores["3des"]
    assert results["3des"].fit.a == pytest.approx(32.27, abs=0.01)  # ns per byte: 3DES is cipher-bound
    assert results["3des"].mb_per_s == pytest.approx(1400 / 49648 * 1000)
    assert scores["3des"] == pytest.approx(10 * math.log10(1400 / 49.648) / math.log10(2000), abs=0.01)
    assert scores["aes128gcm16"] == pytest.approx(9.77, abs=0.01)


def test_repeated_sweeps_combine_to_medians_and_report_their_drift() -> None:
    gcm = RECORDED_NS["aes128gcm16"]
    sweeps = [
        [MicroResult("aes128gcm16", {s: v * f for s, v in gcm.items()}, 0.01, 100, "seal"),
         MicroResult("x25519", {}, 0.002, 10, "kex", ops_per_s=ops)]
        for f, ops in ((1.0, 15976.0), (1.1, 15509.0), (0.98, 15941.0))
    ]
    gcm_c, kex_c = combine_repeats(sweeps)
    assert gcm_c.ns_by_size == gcm  # the median sweep's figures (factor 1.0)
    assert gcm_c.samples == 300
    assert gcm_c.spread == pytest.approx((1.1 - 0.98) * 834 / 834)  # drift between sweeps beats 1 %
    assert kex_c.ops_per_s == 15941.0
    assert kex_c.spread == pytest.approx((15976 - 15509) / 15941)
    single = combine_repeats(sweeps[:1])
    assert single[0].spread == 0.01  # one sweep: its own split-half spread


def test_combining_different_sweeps_is_refused() -> None:
    a = [MicroResult("x25519", {}, 0.0, 1, "kex", ops_per_s=1.0)]
    b = [MicroResult("x448", {}, 0.0, 1, "kex", ops_per_s=1.0)]
    with pytest.raises(InvalidInput):
        combine_repeats([a, b])
    with pytest.raises(InvalidInput):
        combine_repeats([])
