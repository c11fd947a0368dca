"""app.domain.ratings: what a rating and a rating table accept, refuse, and answer."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.domain.algorithms import Kind
from app.domain.errors import InvalidRatingTable
from app.domain.ratings import Measurement, Rating, RatingTable, kind_family, relevant_dimensions, validate_name


def table_doc(*rows: dict[str, Any], name: str = "t") -> dict[str, Any]:
    return {"name": name, "ratings": list(rows)}


AES128 = {"algorithm": "aes128", "confidentiality": 8, "performance": 8}
SHA1 = {"algorithm": "sha1", "integrity": 5, "performance": 6}


# --------------------------------------------------------------------------- Rating


def test_rating_from_dict_keeps_what_it_was_given() -> None:
    rating = Rating.from_dict({**AES128, "source": "paper", "reason": "Niedermayer et al. Table 14",
                               "requirement": "MUST"})
    assert rating == Rating(algorithm="aes128", confidentiality=8, performance=8.0, source="paper",
                            reason="Niedermayer et al. Table 14", requirement="MUST")
    assert rating.kind is Kind.ENCRYPTION


def test_alias_is_stored_under_the_canonical_keyword() -> None:
    assert Rating.from_dict({"algorithm": "AES", "confidentiality": 8}).algorithm == "aes128"
    assert Rating.from_dict({"algorithm": "curve25519", "key_exchange": 8}).algorithm == "x25519"


def test_unknown_algorithm_is_refused_with_close_matches() -> None:
    with pytest.raises(InvalidRatingTable, match=r"ratings\[0\]: unknown algorithm 'sha265'.*sha256"):
        RatingTable.from_dict(table_doc({"algorithm": "sha265", "integrity": 8}))


@pytest.mark.parametrize("value", [11, -1, 8.5, True, "8"])
def test_level_out_of_range_or_not_an_integer_is_refused(value: Any) -> None:
    row = {"algorithm": "aes128", "confidentiality": value}
    with pytest.raises(InvalidRatingTable, match="confidentiality: a level is an integer from 0 to 10"):
        Rating.from_dict(row)


@pytest.mark.parametrize("level", [0, 10])
def test_levels_0_and_10_are_the_bounds(level: int) -> None:
    assert Rating.from_dict({"algorithm": "sha512", "integrity": level}).integrity == level


@pytest.mark.parametrize(
    ("row", "dimension"),
    [
        ({"algorithm": "aes128", "confidentiality": 8, "integrity": 5}, "integrity"),
        ({"algorithm": "sha1", "integrity": 5, "confidentiality": 5}, "confidentiality"),
        ({"algorithm": "modp2048", "key_exchange": 6, "integrity": 6}, "integrity"),
        ({"algorithm": "prfsha256", "key_exchange": 8, "confidentiality": 8}, "confidentiality"),
    ],
)
def test_level_for_the_wrong_kind_is_refused(row: dict[str, Any], dimension: str) -> None:
    with pytest.raises(InvalidRatingTable, match=f"has no {dimension} level"):
        Rating.from_dict(row)


@pytest.mark.parametrize(
    ("row", "missing"),
    [
        ({"algorithm": "aes128"}, "confidentiality"),
        ({"algorithm": "aes128gcm16", "confidentiality": 8}, "integrity"),
        ({"algorithm": "aes128gcm16"}, "confidentiality, integrity"),
        ({"algorithm": "sha256"}, "integrity"),
        ({"algorithm": "prfsha256"}, "key_exchange"),
        ({"algorithm": "x25519", "key_exchange": None}, "key_exchange"),
    ],
)
def test_missing_level_is_refused(row: dict[str, Any], missing: str) -> None:
    with pytest.raises(InvalidRatingTable, match=f"missing {missing} level"):
        Rating.from_dict(row)


def test_every_kind_is_rated_on_its_own_dimensions() -> None:
    assert relevant_dimensions(Kind.ENCRYPTION) == ("confidentiality",)
    assert relevant_dimensions(Kind.AEAD) == ("confidentiality", "integrity")
    assert relevant_dimensions(Kind.INTEGRITY) == ("integrity",)
    assert relevant_dimensions(Kind.PRF) == ("key_exchange",)
    assert relevant_dimensions(Kind.KEY_EXCHANGE) == ("key_exchange",)


@pytest.mark.parametrize("performance", [-0.1, 10.5, math.nan, math.inf, "fast", True])
def test_performance_outside_0_to_10_is_refused(performance: Any) -> None:
    with pytest.raises(InvalidRatingTable, match="performance"):
        Rating.from_dict({**AES128, "performance": performance})


def test_unknown_rating_field_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match=r"unknown fields \['speed'\]"):
        Rating.from_dict({**AES128, "speed": 3})


def test_unknown_fields_of_mixed_types_are_named_not_a_crash() -> None:
    with pytest.raises(InvalidRatingTable, match="unknown fields"):
        Rating.from_dict({**AES128, 1: "x", "y": 2})
    with pytest.raises(InvalidRatingTable, match="unknown fields"):
        RatingTable.from_dict({**table_doc(AES128), 1: "x", "y": 2})


def test_row_without_algorithm_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="'algorithm' is required"):
        Rating.from_dict({"confidentiality": 8})


def test_overlong_reason_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="reason: at most 2000 characters"):
        Rating.from_dict({**AES128, "reason": "x" * 2001})


def test_cost_is_inverse_performance_and_infinite_without_one() -> None:
    assert Rating(algorithm="aes128", confidentiality=8, performance=8.0).cost(None) == pytest.approx(0.125)
    assert Rating(algorithm="aes128", confidentiality=8, performance=0.0).cost(1400) == math.inf


def test_rating_as_dict_round_trips() -> None:
    row = {"algorithm": "aes128gcm16", "confidentiality": 8, "integrity": 8, "performance": 9.2,
           "source": "standard", "reason": "r", "requirement": "MUST",
           "measurement": {"throughput_mbps": 463.0, "a_ns_per_byte": 1.0, "b_ns": 500.0, "samples": 3}}
    rating = Rating.from_dict(row)
    assert rating.as_dict() == row
    assert Rating.from_dict(rating.as_dict()) == rating


# --------------------------------------------------------------------------- Measurement


def test_measurement_a_without_b_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="a_ns_per_byte and b_ns come together"):
        Rating.from_dict({**AES128, "measurement": {"a_ns_per_byte": 1.5}})


def test_measurement_b_without_a_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="a_ns_per_byte and b_ns come together"):
        Rating.from_dict({**AES128, "measurement": {"b_ns": 900}})


def test_measurement_linear_model_gives_ns_per_byte() -> None:
    m = Measurement(a_ns_per_byte=2.0, b_ns=1400.0)
    assert m.ns_per_byte(1400) == pytest.approx(3.0)
    assert m.ns_per_byte(140) == pytest.approx(12.0)
    assert Measurement(throughput_mbps=100.0).ns_per_byte(1400) is None


def test_rating_measured_cost_uses_the_packet_size() -> None:
    rating = Rating.from_dict({**AES128, "measurement": {"a_ns_per_byte": 1.0, "b_ns": 700}})
    assert rating.measured_cost(700) == pytest.approx(2.0)
    assert Rating.from_dict(AES128).measured_cost(700) is None


@pytest.mark.parametrize(
    ("measurement", "fragment"),
    [
        ({"throughput_mbps": -1}, "throughput_mbps"),
        ({"a_ns_per_byte": -1, "b_ns": 3}, "a_ns_per_byte"),
        ({"samples": -1}, "samples"),
        ({"samples": 2.5}, "samples"),
        ({"machine": 3}, "machine"),
        ({"colour": "red"}, "unknown measurement fields"),
        ([1, 2], "measurement must be a mapping"),
    ],
)
def test_bad_measurement_is_refused(measurement: Any, fragment: str) -> None:
    with pytest.raises(InvalidRatingTable, match=fragment):
        Rating.from_dict({**AES128, "measurement": measurement})


def test_negative_constant_overhead_is_allowed() -> None:
    """A regression line may cross zero slightly below the smallest size: b may be negative."""
    rating = Rating.from_dict({**AES128, "measurement": {"a_ns_per_byte": 1.0, "b_ns": -10}})
    assert rating.measurement == Measurement(a_ns_per_byte=1.0, b_ns=-10.0)


# --------------------------------------------------------------------------- RatingTable


def test_duplicate_row_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match=r"ratings\[1\]: sha1 is rated twice"):
        RatingTable.from_dict(table_doc(SHA1, SHA1))


def test_duplicate_through_an_alias_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="aes128 is rated twice"):
        RatingTable.from_dict(table_doc(AES128, {**AES128, "algorithm": "aes"}))


@pytest.mark.parametrize("ratings", [[], None, "aes128", {"aes128": AES128}])
def test_table_without_a_list_of_ratings_is_refused(ratings: Any) -> None:
    with pytest.raises(InvalidRatingTable, match="'ratings' must be a non-empty list"):
        RatingTable.from_dict({"name": "t", "ratings": ratings})


@pytest.mark.parametrize("name", [None, "", "Upper", "has space", "-leading", "x" * 65, 42, "ünï"])
def test_bad_table_name_is_refused(name: Any) -> None:
    with pytest.raises(InvalidRatingTable, match="name"):
        RatingTable.from_dict({"name": name, "ratings": [AES128]})


@pytest.mark.parametrize("name", ["esaf-2006", "standards-2026", "a", "lab_1.v2"])
def test_good_names_are_accepted(name: str) -> None:
    assert validate_name(name, InvalidRatingTable) == name


def test_unknown_table_field_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match=r"unknown fields \['version'\]"):
        RatingTable.from_dict({**table_doc(AES128), "version": 2})


def test_table_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="must be a mapping"):
        RatingTable.from_dict([AES128])  # type: ignore[arg-type]


def test_covers_is_by_family_encryption_and_aead_together() -> None:
    table = RatingTable.from_dict(table_doc(AES128, SHA1))
    assert table.covers(Kind.ENCRYPTION)
    assert table.covers(Kind.AEAD)
    assert table.covers(Kind.INTEGRITY)
    assert not table.covers(Kind.KEY_EXCHANGE)
    assert not table.covers(Kind.PRF)


def test_covers_key_exchange_only_when_a_group_is_rated() -> None:
    table = RatingTable.from_dict(table_doc({"algorithm": "modp2048", "key_exchange": 6, "performance": 6}))
    assert table.covers(Kind.KEY_EXCHANGE)
    assert not table.covers(Kind.PRF)
    assert not table.covers(Kind.ENCRYPTION)
    assert kind_family(Kind.AEAD) == kind_family(Kind.ENCRYPTION) == "cipher"


def test_table_keeps_row_order_and_revision() -> None:
    table = RatingTable.from_dict(table_doc(SHA1, AES128), revision=4)
    assert list(table.ratings) == ["sha1", "aes128"]
    assert table.revision == 4


def test_name_argument_overrides_the_document() -> None:
    assert RatingTable.from_dict(table_doc(AES128, name="doc"), name="given").name == "given"


def test_with_rating_and_without_return_new_tables() -> None:
    table = RatingTable.from_dict(table_doc(AES128))
    bigger = table.with_rating(Rating.from_dict(SHA1))
    assert set(bigger.ratings) == {"aes128", "sha1"}
    assert bigger.covers(Kind.INTEGRITY)
    assert set(table.ratings) == {"aes128"}
    smaller = bigger.without("aes128")
    assert set(smaller.ratings) == {"sha1"}
    assert not smaller.covers(Kind.ENCRYPTION)


def test_table_as_dict_round_trips() -> None:
    doc = {"name": "t", "description": "d", "source": "s",
           "ratings": [Rating.from_dict(AES128).as_dict(), Rating.from_dict(SHA1).as_dict()]}
    table = RatingTable.from_dict(doc)
    assert table.as_dict() == doc
    assert RatingTable.from_dict(table.as_dict()) == table
