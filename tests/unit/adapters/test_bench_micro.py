"""A short real micro run (small budget, a few algorithms)."""

from __future__ import annotations

import pytest

from app.adapters.bench.micro import available, run_micro
from app.domain.algorithms import CATALOGUE


def test_every_measurable_keyword_is_a_catalogue_keyword() -> None:
    assert set(available()) <= set(CATALOGUE)
    assert {"aes128", "aes128gcm16", "chacha20poly1305", "sha256", "3des", "x25519"} <= set(available())


def test_short_real_run_fits_and_orders_sensibly() -> None:
    seen: list[str] = []
    results = {r.keyword: r for r in run_micro(["aes128gcm16", "3des", "sha256", "x25519"],
                                               budget_per_algorithm=0.3, progress=seen.append)}
    assert seen == ["aes128gcm16", "3des", "sha256", "x25519"]
    for keyword in ("aes128gcm16", "3des", "sha256"):
        r = results[keyword]
        assert sorted(r.ns_by_size) == [64, 300, 700, 1400]
        assert r.ns_by_size[1400] > r.ns_by_size[64]  # bigger packets cost more
        assert r.fit.a > 0
    assert results["3des"].mb_per_s < results["aes128gcm16"].mb_per_s  # 3DES is cipher-bound (LAB.md)
    assert results["x25519"].ops_per_s is not None
    assert results["x25519"].ops_per_s > 100


def test_unknown_keyword_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot measure"):
        run_micro(["rot13"])
