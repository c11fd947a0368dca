"""The shipped data in ratings/ and policies/: it loads, and it says what the sources say."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.adapters.files import load_policies, load_policy, load_rating_table, load_rating_tables
from app.domain.algorithms import CATALOGUE, Kind
from app.domain.policies import IpsecOption, Policy
from app.domain.ratings import RatingTable, relevant_dimensions
from app.settings import SHIPPED_POLICIES_DIR, SHIPPED_RATINGS_DIR

RATINGS = SHIPPED_RATINGS_DIR
POLICIES = SHIPPED_POLICIES_DIR


@pytest.fixture(scope="module")
def standards() -> RatingTable:
    return load_rating_table(RATINGS / "standards-2026.yaml")


@pytest.fixture(scope="module")
def esaf() -> RatingTable:
    return load_rating_table(RATINGS / "esaf-2006.yaml")


@pytest.fixture(scope="module")
def policies() -> dict[str, Policy]:
    return {p.name: p for p in load_policies(POLICIES)}


# --------------------------------------------------------------------------- everything loads


@pytest.mark.parametrize("path", sorted(RATINGS.iterdir()), ids=lambda p: p.name)
def test_every_file_in_ratings_is_a_valid_table_named_after_it(path: Path) -> None:
    assert path.suffix == ".yaml"
    assert load_rating_table(path).name == path.stem


@pytest.mark.parametrize("path", sorted(POLICIES.iterdir()), ids=lambda p: p.name)
def test_every_file_in_policies_is_a_valid_policy_named_after_it(path: Path) -> None:
    assert path.suffix == ".yaml"
    policy = load_policy(path)
    assert policy.name == path.stem
    assert policy.description


def test_shipped_tables_include_the_reference_and_the_default() -> None:
    assert {"esaf-2006", "standards-2026"} <= {t.name for t in load_rating_tables(RATINGS)}


def test_shipped_policies_are_the_documented_examples(policies: dict[str, Policy]) -> None:
    assert {"voip", "bulk-backup", "mobile-default", "integrity-only", "high-security"} <= set(policies)


# --------------------------------------------------------------------------- esaf-2006 = Niedermayer et al. Table 14

TABLE_14 = {
    # keyword: (dimension, security level, performance)
    "aes128": ("confidentiality", 8, 8),
    "aes192": ("confidentiality", 9, 7),
    "des": ("confidentiality", 2, 4),
    "3des": ("confidentiality", 8, 2),
    "blowfish128": ("confidentiality", 9, 6),
    "blowfish192": ("confidentiality", 10, 6),
    "md5": ("integrity", 2, 9),
    "sha1": ("integrity", 5, 6),
    "sha256": ("integrity", 8, 3),
}


def test_esaf_2006_is_table_14(esaf: RatingTable) -> None:
    assert list(esaf.ratings) == list(TABLE_14)
    for keyword, (dimension, level, performance) in TABLE_14.items():
        rating = esaf.ratings[keyword]
        levels = {d: rating.level(d) for d in ("confidentiality", "integrity", "key_exchange")}
        assert levels == {d: (level if d == dimension else None) for d in levels}, keyword
        assert rating.performance == performance, keyword
        assert (rating.source, rating.reason) == ("paper", "Niedermayer et al. Table 14"), keyword
        assert rating.requirement is None
        assert rating.measurement is None


def test_esaf_2006_cites_the_paper(esaf: RatingTable) -> None:
    assert "Niedermayer" in esaf.source
    assert "Table 14" in esaf.source


def test_esaf_2006_rates_no_key_exchange_or_prf(esaf: RatingTable) -> None:
    assert not esaf.covers(Kind.KEY_EXCHANGE)
    assert not esaf.covers(Kind.PRF)


def test_esaf_2006_min_integrity_4_picks_sha1_by_performance(esaf: RatingTable) -> None:
    """Niedermayer et al. §7.4: SHA-256 is secure enough but slower, MD5 is too weak."""
    enough = [r for r in esaf.ratings.values() if r.integrity is not None and r.integrity >= 4]
    assert max(enough, key=lambda r: r.performance).algorithm == "sha1"


# --------------------------------------------------------------------------- standards-2026

#: today's standards section 1, "Proposed levels", for every catalogue keyword.
PROPOSED: dict[str, dict[str, int]] = {
    "null": {"confidentiality": 0},
    "des": {"confidentiality": 1},
    "3des": {"confidentiality": 3},
    "cast128": {"confidentiality": 2},
    **{f"blowfish{b}": {"confidentiality": 2} for b in (128, 192, 256)},
    **{f"{c}{b}{m}": {"confidentiality": lv} for c in ("aes", "camellia") for m in ("", "ctr")
       for b, lv in ((128, 8), (192, 9), (256, 10))},
    **{f"aes{b}{mode}{icv}": {"confidentiality": lv, "integrity": il} for mode in ("gcm", "ccm")
       for b, lv in ((128, 8), (192, 9), (256, 10)) for icv, il in ((16, 8), (12, 7), (8, 5))},
    "chacha20poly1305": {"confidentiality": 10, "integrity": 8},
    **{f"aes{b}gmac": {"confidentiality": 0, "integrity": 8} for b in (128, 192, 256)},
    **{k: {"integrity": v} for k, v in {"md5": 2, "md5_128": 2, "sha1": 5, "sha1_160": 5, "sha256_96": 4,
                                        "sha256": 8, "sha384": 9, "sha512": 10, "aesxcbc": 7,
                                        "aescmac": 7}.items()},
    **{k: {"key_exchange": v} for k, v in {
        "prfmd5": 2, "prfsha1": 5, "prfaesxcbc": 7, "prfaescmac": 7, "prfsha256": 8, "prfsha384": 9,
        "prfsha512": 10,
        "modp768": 1, "modp1024": 2, "modp1536": 3, "modp2048": 6, "modp3072": 8, "modp4096": 8,
        "modp6144": 8, "modp8192": 9, "modp1024s160": 1, "modp2048s224": 4, "modp2048s256": 4,
        "ecp192": 3, "ecp224": 5, "ecp256": 8, "ecp384": 9, "ecp521": 10, "ecp224bp": 5, "ecp256bp": 8,
        "ecp384bp": 9, "ecp512bp": 10, "x25519": 8, "x448": 9}.items()},
    **{k: {"post_quantum": v} for k, v in {"ppk": 9, "mlkem512": 8, "mlkem768": 9, "mlkem1024": 10}.items()},
}


def test_reference_list_names_every_catalogue_keyword() -> None:
    assert set(PROPOSED) == set(CATALOGUE)


def test_standards_2026_rates_every_catalogue_keyword_in_catalogue_order(standards: RatingTable) -> None:
    assert list(standards.ratings) == list(CATALOGUE)


@pytest.mark.parametrize("keyword", list(CATALOGUE))
def test_standards_2026_levels_match_reference(standards: RatingTable, keyword: str) -> None:
    rating = standards.ratings[keyword]
    levels = {d: rating.level(d) for d in relevant_dimensions(CATALOGUE[keyword].kind)}
    assert levels == PROPOSED[keyword]


#: RFC 8221 / RFC 8247 requirement levels, and "not listed" where the RFC is silent.
REQUIREMENT_LEVELS = {"MUST", "MUST-", "SHOULD", "MAY", "SHOULD NOT", "MUST NOT", "not listed"}


@pytest.mark.parametrize("keyword", list(CATALOGUE))
def test_standards_2026_row_cites_its_source(standards: RatingTable, keyword: str) -> None:
    rating = standards.ratings[keyword]
    assert rating.source == "standard"
    assert rating.requirement
    assert rating.requirement.split(" (")[0] in REQUIREMENT_LEVELS
    assert len(rating.reason) > 40
    assert "Performance" in rating.reason
    assert 0 < rating.performance <= 10


@pytest.mark.parametrize(
    ("keyword", "dimension", "level"),
    [("sha1", "integrity", 5), ("sha256", "integrity", 8), ("md5", "integrity", 2),
     ("aes128", "confidentiality", 8), ("modp2048", "key_exchange", 6), ("prfsha1", "key_exchange", 5),
     ("prfsha256", "key_exchange", 8)],
)
def test_standards_2026_pinned_levels(standards: RatingTable, keyword: str, dimension: str, level: int) -> None:
    assert standards.ratings[keyword].level(dimension) == level


@pytest.mark.parametrize(
    ("keyword", "requirement"),
    [("aes128", "MUST"), ("aes128gcm16", "MUST"), ("chacha20poly1305", "SHOULD"), ("3des", "SHOULD NOT"),
     ("des", "MUST NOT"), ("blowfish128", "MUST NOT"), ("sha256", "MUST"), ("sha1", "MUST-"),
     ("md5", "MUST NOT"), ("modp2048", "MUST"), ("ecp256", "SHOULD"), ("modp1024", "SHOULD NOT"),
     ("modp768", "MUST NOT"), ("x25519", "not listed")],
)
def test_standards_2026_requirement_levels(standards: RatingTable, keyword: str, requirement: str) -> None:
    assert standards.ratings[keyword].requirement == requirement


def test_standards_2026_where_it_departs_from_esaf(standards: RatingTable, esaf: RatingTable) -> None:
    """today's standards: 3DES 8 -> 3, Blowfish 9/10 -> 2; HMAC-MD5/SHA-1 security agrees."""
    assert (esaf.ratings["3des"].confidentiality, standards.ratings["3des"].confidentiality) == (8, 3)
    assert standards.ratings["blowfish128"].confidentiality == standards.ratings["blowfish192"].confidentiality == 2
    for keyword in ("md5", "sha1", "sha256", "aes128"):
        dim = relevant_dimensions(CATALOGUE[keyword].kind)[0]
        assert standards.ratings[keyword].level(dim) == esaf.ratings[keyword].level(dim)


def perf(table: RatingTable, *keywords: str) -> list[float]:
    return [table.ratings[k].performance for k in keywords]


def test_standards_2026_performance_follows_measured_speed(standards: RatingTable) -> None:
    # openssl speed (the lab set-up, today's standards): GCM > SHA-1 > SHA-256 > CBC > ChaCha > MD5 > Blowfish > 3DES
    assert perf(standards, "aes128gcm16", "sha1", "sha256", "aes128", "chacha20poly1305", "md5",
                "blowfish128", "3des") == sorted(perf(standards, "aes128gcm16", "sha1", "sha256", "aes128",
                                                      "chacha20poly1305", "md5", "blowfish128", "3des"),
                                                 reverse=True)
    assert standards.ratings["3des"].performance < standards.ratings["des"].performance
    assert standards.ratings["null"].performance == 10


def test_standards_2026_md5_is_slower_than_sha1_unlike_2006(standards: RatingTable, esaf: RatingTable) -> None:
    assert esaf.ratings["md5"].performance > esaf.ratings["sha1"].performance
    assert standards.ratings["md5"].performance < standards.ratings["sha1"].performance


def test_standards_2026_key_exchange_cost_order(standards: RatingTable) -> None:
    x25519, ecp256, modp2048, modp8192 = perf(standards, "x25519", "ecp256", "modp2048", "modp8192")
    assert x25519 > ecp256 > modp2048 > modp8192
    assert modp2048 - modp8192 > 2


def test_standards_2026_wider_keys_are_never_faster(standards: RatingTable) -> None:
    for family in ("aes{}", "aes{}ctr", "camellia{}", "aes{}gcm16", "aes{}ccm16"):
        speeds = perf(standards, *(family.format(b) for b in (128, 192, 256)))
        assert speeds == sorted(speeds, reverse=True), family


def test_standards_2026_description_states_the_performance_mapping(standards: RatingTable) -> None:
    assert "log10(MB/s)" in standards.description
    assert "log10(ops/s)" in standards.description
    assert "SP 800-57" in standards.source
    assert "RFC 8221" in standards.source
    assert "RFC 8247" in standards.source


# --------------------------------------------------------------------------- policies


def test_voip_is_small_packet_esp(policies: dict[str, Policy]) -> None:
    voip = policies["voip"]
    assert voip.traffic is not None
    assert voip.traffic.packet_size == 160
    assert voip.option is IpsecOption.ESP


def test_bulk_backup_is_8_8_8_esp_at_1400_bytes(policies: dict[str, Policy]) -> None:
    bulk = policies["bulk-backup"]
    assert bulk.min_levels.as_dict() == {"confidentiality": 8, "integrity": 8, "key_exchange": 8, "post_quantum": 0}
    assert bulk.objective_id == 3
    assert bulk.traffic is not None
    assert bulk.traffic.packet_size == 1400


def test_mobile_default_is_8_7_6_esp(policies: dict[str, Policy]) -> None:
    mobile = policies["mobile-default"]
    assert mobile.min_levels.as_dict() == {"confidentiality": 8, "integrity": 7, "key_exchange": 6, "post_quantum": 0}
    assert mobile.objective_id == 3


def test_integrity_only_is_objective_2_ah(policies: dict[str, Policy]) -> None:
    policy = policies["integrity-only"]
    assert policy.objective_id == 2
    assert policy.option is IpsecOption.AH
    assert policy.min_levels.confidentiality == 0


def test_high_security_denies_the_broken_algorithms(policies: dict[str, Policy]) -> None:
    policy = policies["high-security"]
    assert policy.min_levels.as_dict() == {"confidentiality": 10, "integrity": 9, "key_exchange": 9, "post_quantum": 0}
    assert {"3des", "des", "md5", "blowfish128", "blowfish192", "blowfish256"} <= policy.deny
