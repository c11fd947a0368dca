"""A rating table's rows as CSV (RFC 4180): one row per algorithm under the :data:`CSV_COLUMNS`
header, an empty cell for an absent value, numbers in plain decimals. The table's name,
description and source are not part of the CSV.

A spreadsheet runs a cell that starts with ``=``, ``+``, ``-`` or ``@`` as a formula (some
also one that starts with a tab or carriage return), so a text cell the table's authors wrote,
such as a reason of ``=HYPERLINK(...)``, could act when an operator opens the export. Every text cell that
starts with one of :data:`FORMULA_TRIGGERS`, after any number of ``'``, is written with one
more ``'`` in front (OWASP's advice: the spreadsheet shows it as text). Reading CSV takes
that one ``'`` off again, so an export reads back as it was; numbers are written as numbers,
``-0.5`` included.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from app.domain.errors import InvalidRatingTable
from app.domain.ratings import LEVEL_DIMENSIONS, Rating, RatingTable

__all__ = ["CSV_COLUMNS", "FORMULA_TRIGGERS", "rows_from_csv", "table_to_csv"]

_MEASUREMENT_COLUMNS: tuple[str, ...] = (
    "throughput_mbps", "a_ns_per_byte", "b_ns", "machine", "backend", "date", "samples", "method", "spread",
)
_INT_MEASUREMENTS = frozenset({"samples"})
_TEXT_MEASUREMENTS = frozenset({"machine", "backend", "date", "method"})

#: The columns of a rating table in CSV, in order. An empty cell means "absent".
CSV_COLUMNS: tuple[str, ...] = (
    "algorithm", *LEVEL_DIMENSIONS, "performance", "requirement", "source", "reason", *_MEASUREMENT_COLUMNS,
)

#: First characters that make a spreadsheet read a cell as a formula: ``= + - @``, tab and
#: carriage return, and their full-width forms (U+FF1D, U+FF0B, U+FF0D, U+FF20) some spreadsheets also take.
FORMULA_TRIGGERS: frozenset[str] = frozenset("=+-@\t\r\uff1d\uff0b\uff0d\uff20")

#: The guard a text cell gets in front of a trigger (and ``'`` already there).
_GUARD = "'"

_T = TypeVar("_T")


def table_to_csv(table: RatingTable) -> str:
    """A rating table's rows as CSV with the :data:`CSV_COLUMNS` header."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180; also makes a lone CR in a cell get quoted
    writer.writerow(CSV_COLUMNS)
    for rating in table.ratings.values():
        row = rating.as_dict()
        measurement: Mapping[str, Any] = row.pop("measurement", {})
        cells = {**row, **measurement}
        writer.writerow(_csv_cell(cells.get(column)) for column in CSV_COLUMNS)
    return out.getvalue()


def rows_from_csv(text: str) -> list[dict[str, Any]]:
    """The rating rows of CSV text, each checked as a rating, none rated twice.

    The first row is the header: ``algorithm`` is required, the other
    :data:`CSV_COLUMNS` are optional and may come in any order; other columns are
    refused. An empty cell means the value is absent. Blank lines are skipped.

    Raises:
        InvalidRatingTable: not CSV, or not valid rows; the message names the line.
    """
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""), strict=True)
    try:
        header = next((r for r in reader if r), None)
        if header is None:
            raise InvalidRatingTable("CSV: no header row")
        columns = _csv_header(header, reader.line_num)
        rows: list[dict[str, Any]] = []
        seen: dict[str, int] = {}
        for cells in reader:
            if not any(c.strip() for c in cells):
                continue
            line = reader.line_num
            if len(cells) > len(columns):
                raise InvalidRatingTable(f"CSV line {line}: {len(cells)} cells but {len(columns)} columns")
            row = _csv_row(dict(zip(columns, cells, strict=False)), line)
            rating = Rating.from_dict(row, f"CSV line {line}")
            if rating.algorithm in seen:
                raise InvalidRatingTable(
                    f"CSV line {line}: {rating.algorithm} is rated twice (first on line {seen[rating.algorithm]})"
                )
            seen[rating.algorithm] = line
            rows.append(row)
    except csv.Error as exc:
        raise InvalidRatingTable(f"CSV line {reader.line_num}: {exc}") from exc
    return rows


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return _GUARD + value if _guarded(value) else value
    return str(value)


def _guarded(text: str) -> bool:
    """Whether a text cell starts with a formula trigger, after any number of guards: those
    cells are written with one guard more, and read with one guard less."""
    return text.lstrip(_GUARD)[:1] in FORMULA_TRIGGERS


def _text_cell(cell: str) -> str:
    return cell[1:] if cell.startswith(_GUARD) and _guarded(cell) else cell


def _csv_header(header: list[str], line: int) -> list[str]:
    columns = [c.strip() for c in header]
    unknown = [c for c in columns if c not in CSV_COLUMNS]
    if unknown:
        raise InvalidRatingTable(f"CSV line {line}: unknown columns {unknown}; known: {list(CSV_COLUMNS)}")
    duplicated = sorted({c for c in columns if columns.count(c) > 1})
    if duplicated:
        raise InvalidRatingTable(f"CSV line {line}: columns {duplicated} appear twice")
    if "algorithm" not in columns:
        raise InvalidRatingTable(f"CSV line {line}: the 'algorithm' column is required")
    return columns


def _csv_row(cells: Mapping[str, str], line: int) -> dict[str, Any]:
    row: dict[str, Any] = {}
    measurement: dict[str, Any] = {}
    for column, cell in cells.items():
        if cell == "":
            continue
        where = f"CSV line {line}, column {column!r}"
        if column in LEVEL_DIMENSIONS or column in _INT_MEASUREMENTS:
            value: Any = _parse_number(cell, int, where)
        elif column in ("performance", *_MEASUREMENT_COLUMNS) and column not in _TEXT_MEASUREMENTS:
            value = _parse_number(cell, float, where)
        else:
            value = _text_cell(cell)
        if column in _MEASUREMENT_COLUMNS:
            measurement[column] = value
        else:
            row[column] = value
    if measurement:
        row["measurement"] = measurement
    return row


#: Numbers in a CSV cell: ASCII decimal digits (``int()`` and ``float()`` also take ``1_0``,
#: other scripts' digits, ``nan`` and ``inf``); floats may carry an exponent (``repr`` writes one).
_CSV_INT = re.compile(r"[-+]?[0-9]+", re.ASCII)
_CSV_FLOAT = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)


def _parse_number(cell: str, kind: Callable[[str], _T], where: str) -> _T:
    text = cell.strip()
    if not (_CSV_INT if kind is int else _CSV_FLOAT).fullmatch(text):
        expected = "an integer" if kind is int else "a number"
        raise InvalidRatingTable(f"{where}: {cell[:40]!r} is not {expected} in plain decimals")
    return kind(text)
