"""app.adapters.files reads our documents strictly: every key once, numbers as plain decimals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.adapters.files import load_policy, load_rating_table, parse_policy_yaml, parse_rating_table_csv
from app.adapters.files import parse_rating_table_yaml as parse
from app.domain.errors import InvalidPolicy, InvalidRatingTable

TABLE = "name: t\nratings:\n  - algorithm: aes128\n    confidentiality: {level}\n    performance: {performance}\n"


def test_a_key_twice_in_a_row_is_refused_naming_the_key_and_both_lines() -> None:
    text = "name: t\nratings:\n  - algorithm: aes128\n    confidentiality: 8\n    performance: 8\n" \
           "    confidentiality: 1\n"
    with pytest.raises(InvalidRatingTable, match=r"line 6.*'confidentiality'.*line 4"):
        parse(text)


def test_a_top_level_key_twice_is_refused() -> None:
    with pytest.raises(InvalidRatingTable, match="'ratings'"):
        parse("name: t\nratings: []\nratings:\n  - algorithm: aes128\n")


def test_a_key_twice_in_a_flow_mapping_is_refused() -> None:
    with pytest.raises(InvalidPolicy, match="'integrity'"):
        parse_policy_yaml("name: p\nmin_levels: {integrity: 8, integrity: 1}\n")


def test_keys_that_differ_only_in_quoting_are_the_same_key() -> None:
    with pytest.raises(InvalidPolicy, match="'name'"):
        parse_policy_yaml("name: p\n'name': q\n")


@pytest.mark.parametrize("level", ["1_0", "0x10", "010", "0b101", "1:30", "+0x1", "-0_1"])
def test_an_integer_that_is_not_a_plain_decimal_is_refused_naming_the_field(level: str) -> None:
    expected = rf"'confidentiality': {re.escape(repr(level))} is not a plain decimal"
    with pytest.raises(InvalidRatingTable, match=expected):
        parse(TABLE.format(level=level, performance=8))


@pytest.mark.parametrize("performance", ["7_5.0", "1:30.5", "1__0.0"])
def test_a_float_with_separators_is_refused_naming_the_field(performance: str) -> None:
    with pytest.raises(InvalidRatingTable, match="performance"):
        parse(TABLE.format(level=8, performance=performance))


def test_an_exponent_without_a_dot_is_text_and_refused_as_a_level() -> None:
    with pytest.raises(InvalidRatingTable, match="confidentiality: a level is an integer"):
        parse(TABLE.format(level="1e1", performance=8))


@pytest.mark.parametrize(("level", "performance", "expected"), [
    ("10", "8", (10, 8.0)), ("0", "7.5", (0, 7.5)), ("+3", "1.0e+1", (3, 10.0)), ("'8'", "8", None)])
def test_plain_decimals_are_read(level: str, performance: str, expected: tuple[int, float] | None) -> None:
    if expected is None:  # a quoted number is a string: no level
        with pytest.raises(InvalidRatingTable, match="confidentiality"):
            parse(TABLE.format(level=level, performance=performance))
        return
    rating = parse(TABLE.format(level=level, performance=performance)).ratings["aes128"]
    assert (rating.confidentiality, rating.performance) == expected


def test_a_policy_number_in_hex_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidPolicy, match="ike_lifetime"):
        parse_policy_yaml("name: p\nike_lifetime: 0xE10\n")


def test_files_on_disk_are_read_as_strictly(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(TABLE.format(level="1_0", performance=8))
    with pytest.raises(InvalidRatingTable, match=r"^t\.yaml: .*confidentiality"):
        load_rating_table(tmp_path / "t.yaml")
    (tmp_path / "p.yaml").write_text("name: p\nname: q\n")
    with pytest.raises(InvalidPolicy, match=r"^p\.yaml: .*'name'"):
        load_policy(tmp_path / "p.yaml")


@pytest.mark.parametrize(("cell", "column"), [("1_0", "confidentiality"), ("٣", "confidentiality"),
                                              ("7_5", "performance"), ("nan", "performance"),
                                              ("inf", "performance")])
def test_csv_numbers_are_plain_decimals(cell: str, column: str) -> None:
    text = f"algorithm,confidentiality,performance\naes128,{'8' if column == 'performance' else cell}," \
           f"{cell if column == 'performance' else '8'}\n"
    with pytest.raises(InvalidRatingTable, match=rf"line 2, column '{column}'"):
        parse_rating_table_csv(text, name="t")


def test_csv_exponents_from_measurements_still_read() -> None:
    text = "algorithm,confidentiality,performance,a_ns_per_byte,b_ns\naes128,8,8,1e-05,-2.5E+3\n"
    rating = parse_rating_table_csv(text, name="t").ratings["aes128"]
    assert rating.measurement is not None
    assert (rating.measurement.a_ns_per_byte, rating.measurement.b_ns) == (1e-05, -2500.0)
