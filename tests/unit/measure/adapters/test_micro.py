"""A short real micro run (small budget, a few algorithms)."""

from __future__ import annotations

import pytest

from app.domain.algorithms import CATALOGUE, Kind
from app.measure.adapters.micro import available, run_micro
from app.measure.domain.modp_groups import MODP_GROUPS


def test_every_measurable_keyword_is_a_catalogue_keyword() -> None:
    assert set(available()) <= set(CATALOGUE)
    assert {"aes128", "aes128gcm16", "chacha20poly1305", "sha256", "3des", "x25519"} <= set(available())


def test_every_key_exchange_group_the_library_offers_is_measured() -> None:
    groups = {k for k, alg in CATALOGUE.items() if alg.kind is Kind.KEY_EXCHANGE}
    # brainpoolP224r1 is the one catalogue group the cryptography library does not offer.
    assert groups - set(available()) == {"ecp224bp"}
    assert set(MODP_GROUPS) <= set(available())


@pytest.mark.alone  # it compares measured speeds: with the machine shared, an order can flip
def test_short_real_run_fits_and_orders_sensibly() -> None:
    seen: list[str] = []
    wanted = ["aes128gcm16", "3des", "sha256", "x25519", "modp2048", "modp3072"]
    results = {r.keyword: r for r in run_micro(wanted, budget_per_algorithm=0.2, progress=seen.append)}
    assert sorted(seen) == sorted(wanted)  # in the order they finish
    for keyword in ("aes128gcm16", "3des", "sha256"):
        r = results[keyword]
        assert sorted(r.ns_by_size) == [64, 300, 700, 1400]
        assert r.ns_by_size[1400] > r.ns_by_size[64]  # bigger packets cost more
        assert r.fit.a > 0
    assert results["3des"].mb_per_s < results["aes128gcm16"].mb_per_s  # 3DES is cipher-bound (the lab set-up)
    assert results["x25519"].ops_per_s is not None
    assert results["x25519"].ops_per_s > 100
    modp2048, modp3072 = results["modp2048"].ops_per_s, results["modp3072"].ops_per_s
    assert modp2048 is not None
    assert modp3072 is not None
    assert modp3072 < modp2048 < results["x25519"].ops_per_s  # bigger groups cost more; ECC beats MODP
    assert results["modp2048"].method == "key generation + shared secret"


def test_unknown_keyword_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot measure"):
        run_micro(["rot13"])
