"""Rating tables and policies as files: YAML documents in ``ratings/`` and ``policies/``, CSV for tables.

Pure I/O and format conversion around the domain's ``from_dict`` / ``as_dict``: the
domain validates, this module reads, parses and writes. Every document is capped at
:data:`MAX_DOCUMENT_BYTES` before it is parsed; every syntax error becomes the domain's
:class:`~app.domain.errors.InvalidRatingTable` or :class:`~app.domain.errors.InvalidPolicy`,
chained to the parser's exception and naming the line where the parser knows it.

Round trips are exact: ``parse_rating_table_yaml(dump_rating_table_yaml(t))``,
``parse_rating_table_csv(dump_rating_table_csv(t), name=t.name, ...)`` and
``parse_policy_yaml(dump_policy_yaml(p))`` give back equal content.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from app.domain.errors import InvalidInput, InvalidPolicy, InvalidRatingTable
from app.domain.policies import Policy
from app.domain.ratings import LEVEL_DIMENSIONS, Rating, RatingTable

__all__ = [
    "CSV_COLUMNS",
    "MAX_DOCUMENT_BYTES",
    "dump_policy_yaml",
    "dump_rating_table",
    "dump_rating_table_csv",
    "dump_rating_table_yaml",
    "load_policies",
    "load_policy",
    "load_rating_table",
    "load_rating_tables",
    "parse_policy_yaml",
    "parse_rating_table",
    "parse_rating_table_csv",
    "parse_rating_table_yaml",
]

#: Largest document (file or text) accepted, in bytes of UTF-8.
MAX_DOCUMENT_BYTES = 1 << 20

_MEASUREMENT_COLUMNS: tuple[str, ...] = (
    "throughput_mbps", "a_ns_per_byte", "b_ns", "machine", "backend", "date", "samples", "method", "spread",
)
_INT_MEASUREMENTS = frozenset({"samples"})
_TEXT_MEASUREMENTS = frozenset({"machine", "backend", "date", "method"})

#: The columns of a rating table in CSV, in order. An empty cell means "absent".
CSV_COLUMNS: tuple[str, ...] = (
    "algorithm", *LEVEL_DIMENSIONS, "performance", "requirement", "source", "reason", *_MEASUREMENT_COLUMNS,
)

_YAML_SUFFIXES = (".yaml", ".yml")

_E = TypeVar("_E", bound=InvalidInput)
_T = TypeVar("_T")
_Path = str | os.PathLike[str]


# --------------------------------------------------------------------------- rating tables


def load_rating_table(path: _Path) -> RatingTable:
    """Read and validate one rating table from a YAML file (:func:`_load_file`).

    Raises:
        InvalidRatingTable: the file is too large, not UTF-8, not YAML, or not a valid
            table; the message starts with the file name.
        OSError: the file cannot be read.
    """
    return _load_file(Path(path), RatingTable.from_dict, InvalidRatingTable)


def load_rating_tables(directory: _Path) -> list[RatingTable]:
    """Read every ``*.yaml`` / ``*.yml`` rating table in a directory.

    Args:
        directory: the directory (not searched recursively).

    Returns:
        The tables, sorted by name.

    Raises:
        InvalidRatingTable: a file is not a valid table (the message names it), or two
            files hold tables of the same name.
        OSError: the directory or a file cannot be read.
    """
    return _load_all(Path(directory), load_rating_table, lambda t: t.name, InvalidRatingTable)


def parse_rating_table_yaml(text: str, name: str | None = None) -> RatingTable:
    """Parse and validate a rating table from YAML text.

    Args:
        text: the YAML document, at most :data:`MAX_DOCUMENT_BYTES` of UTF-8.
        name: overrides the document's ``name`` when given.

    Raises:
        InvalidRatingTable: too large, not YAML (the message names the line), or not a
            valid table.
    """
    _check_size(text, InvalidRatingTable)
    return RatingTable.from_dict(_load_yaml(text, InvalidRatingTable), name=name)


def parse_rating_table(text: str, fmt: str, *, name: str | None = None, description: str = "",
                       source: str = "") -> RatingTable:
    """A rating table from YAML or CSV text (``fmt``); CSV needs the table's ``name``.

    Raises:
        InvalidRatingTable: an unknown format, a CSV without a name, or what the parser says.
    """
    if fmt == "yaml":
        return parse_rating_table_yaml(text, name=name)
    if fmt == "csv":
        if not name:
            raise InvalidRatingTable("a CSV import needs the table's name")
        return parse_rating_table_csv(text, name=name, description=description, source=source)
    raise InvalidRatingTable("format must be 'yaml' or 'csv'")


def dump_rating_table(table: RatingTable, fmt: str) -> str:
    """A rating table as YAML or CSV text (``fmt``)."""
    if fmt == "yaml":
        return dump_rating_table_yaml(table)
    if fmt == "csv":
        return dump_rating_table_csv(table)
    raise InvalidRatingTable("format must be 'yaml' or 'csv'")


def dump_rating_table_yaml(table: RatingTable) -> str:
    """A rating table as a YAML document that :func:`parse_rating_table_yaml` reads back exactly."""
    return _dump_yaml(table.as_dict())


def dump_rating_table_csv(table: RatingTable) -> str:
    """A rating table's rows as CSV with the :data:`CSV_COLUMNS` header.

    The table's name, description and source are not part of the CSV; give them to
    :func:`parse_rating_table_csv` when reading it back.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180; also makes a lone CR in a cell get quoted
    writer.writerow(CSV_COLUMNS)
    for rating in table.ratings.values():
        row = rating.as_dict()
        measurement: Mapping[str, Any] = row.pop("measurement", {})
        cells = {**row, **measurement}
        writer.writerow(_csv_cell(cells.get(column)) for column in CSV_COLUMNS)
    return out.getvalue()


def parse_rating_table_csv(text: str, *, name: str, description: str = "", source: str = "") -> RatingTable:
    """Parse and validate a rating table from CSV text.

    The first row is the header: ``algorithm`` is required, the other
    :data:`CSV_COLUMNS` are optional and may come in any order; other columns are
    refused. An empty cell means the value is absent. Blank lines are skipped.

    Args:
        text: the CSV document, at most :data:`MAX_DOCUMENT_BYTES` of UTF-8.
        name: the table's name.
        description: the table's description.
        source: where the table's numbers come from.

    Raises:
        InvalidRatingTable: too large, not CSV, or not a valid table; the message names
            the line.
    """
    _check_size(text, InvalidRatingTable)
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
    return RatingTable.from_dict({"description": description, "source": source, "ratings": rows}, name=name)


# --------------------------------------------------------------------------- policies


def load_policy(path: _Path) -> Policy:
    """Read and validate one policy from a YAML file (:func:`_load_file`).

    Raises:
        InvalidPolicy: the file is too large, not UTF-8, not YAML, or not a valid
            policy; the message starts with the file name.
        OSError: the file cannot be read.
    """
    return _load_file(Path(path), Policy.from_dict, InvalidPolicy)


def load_policies(directory: _Path) -> list[Policy]:
    """Read every ``*.yaml`` / ``*.yml`` policy in a directory.

    Returns:
        The policies, sorted by name.

    Raises:
        InvalidPolicy: a file is not a valid policy (the message names it), or two files
            hold policies of the same name.
        OSError: the directory or a file cannot be read.
    """
    return _load_all(Path(directory), load_policy, lambda p: p.name, InvalidPolicy)


def parse_policy_yaml(text: str, name: str | None = None) -> Policy:
    """Parse and validate a policy from YAML text.

    Args:
        text: the YAML document, at most :data:`MAX_DOCUMENT_BYTES` of UTF-8.
        name: overrides the document's ``name`` when given.

    Raises:
        InvalidPolicy: too large, not YAML (the message names the line), or not a valid
            policy.
    """
    _check_size(text, InvalidPolicy)
    return Policy.from_dict(_load_yaml(text, InvalidPolicy), name=name)


def dump_policy_yaml(policy: Policy) -> str:
    """A policy as a YAML document that :func:`parse_policy_yaml` reads back exactly.

    Fields that are unset (``None``) are left out.
    """
    return _dump_yaml({k: v for k, v in policy.as_dict().items() if v is not None})


# --------------------------------------------------------------------------- helpers


def _load_file(file: Path, from_dict: Callable[..., _T], error: type[_E]) -> _T:
    """One YAML document of a file, made into its object by ``from_dict(data, name=...)``.

    A document without a ``name`` takes the file's stem as its name; an error's message
    starts with the file name.
    """
    text = _read_capped(file, error)
    try:
        data = _load_yaml(text, error)
        name = file.stem if isinstance(data, Mapping) and "name" not in data else None
        return from_dict(data, name=name)
    except error as exc:
        raise error(f"{file.name}: {exc.message}") from exc


def _load_all(
    directory: Path, load: Callable[[Path], _T], name_of: Callable[[_T], str], error: type[_E]
) -> list[_T]:
    found: dict[str, tuple[_T, Path]] = {}
    for file in sorted(p for p in directory.iterdir() if p.suffix in _YAML_SUFFIXES and p.is_file()):
        item = load(file)
        name = name_of(item)
        if name in found:
            raise error(f"{file.name}: {name!r} is defined in {found[name][1].name} already")
        found[name] = (item, file)
    return [found[name][0] for name in sorted(found)]


def _read_capped(file: Path, error: type[_E]) -> str:
    with file.open("rb") as fh:
        data = fh.read(MAX_DOCUMENT_BYTES + 1)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise error(f"{file.name}: larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{file.name}: not UTF-8 text (byte {exc.start})") from exc


def _check_size(text: str, error: type[_E]) -> None:
    if not isinstance(text, str):
        raise error("the document must be text")
    # Cheap bound first: a str of n code points is at least n bytes of UTF-8.
    if len(text) > MAX_DOCUMENT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise error(f"document larger than {MAX_DOCUMENT_BYTES} bytes")


#: libyaml's parser where installed (the pure-Python one is slow on deep nesting).
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: A rating table or policy nests four levels deep; far deeper is an attack, not data.
_MAX_YAML_DEPTH = 32


def _check_yaml_shape(text: str, error: type[_E]) -> None:
    """Refuse YAML aliases (a few lines of them expand to billions of nodes) and deep nesting.

    Reads parse events only and stops at the first offence: nothing is built. A document
    that does not parse is left to the loader, which says what is wrong. Every YAML this
    module reads comes through here: API imports, ``qoss ratings import``, files on disk.
    """
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_YAML_LOADER):
            if isinstance(event, yaml.AliasEvent):
                raise error("YAML anchors and aliases (&name, *name) are not accepted")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > _MAX_YAML_DEPTH:
                    raise error(f"YAML nested deeper than {_MAX_YAML_DEPTH} levels is not accepted")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except (yaml.YAMLError, RecursionError):
        # A parser may refuse deep flow nesting itself while it looks ahead, before it has
        # produced the events counted above (libyaml does, at 1,000 levels): the refusal
        # still names our limit, whatever the parser's own.
        if _flow_depth(text) > _MAX_YAML_DEPTH:
            raise error(f"YAML nested deeper than {_MAX_YAML_DEPTH} levels is not accepted") from None
        return


#: Quoted scalars and comments (whose brackets do not nest), and flow brackets.
_FLOW_TOKENS = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|(?:^|(?<=\s))#[^\n]*|[\[\]{}]""", re.MULTILINE)


def _flow_depth(text: str) -> int:
    """How deep the document's flow collections (``[``, ``{``) nest, read from the text alone."""
    depth = deepest = 0
    for match in _FLOW_TOKENS.finditer(text):
        token = match.group()
        if token in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in ("]", "}"):
            depth = max(depth - 1, 0)
    return deepest


_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"
#: An integer as our documents write it: plain decimal digits, no leading zero, an optional sign.
_PLAIN_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)", re.ASCII)
_NOT_PLAIN = "is not a plain decimal number (write 10, not 1_0, 0x10, 0o12, 010 or 0:10)"


class _StrictLoader(_YAML_LOADER):  # type: ignore[misc]
    """The safe loader, stricter: a key given twice in one mapping is refused (YAML keeps the
    last one silently), so are merge keys (``<<``), and so is an int or float YAML 1.1 reads
    from anything but plain decimal notation (``1_0`` is 10, ``010`` is 8, ``0x10`` 16, ``1:30`` 90)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                raise yaml.constructor.ConstructorError(
                    None, None, "merge keys (<<) are not accepted", key_node.start_mark)
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = first.get(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if earlier is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {str(key)[:64]!r} (first at line {earlier.start_mark.line + 1})",
                    key_node.start_mark)
            first[key] = key_node
            _check_number(value_node, f"{str(key)[:64]!r}: ")
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]

    def construct_plain_int(self, node: yaml.ScalarNode) -> int:
        _check_number(node, "")
        return super().construct_yaml_int(node)  # type: ignore[no-any-return]

    def construct_plain_float(self, node: yaml.ScalarNode) -> float:
        _check_number(node, "")
        return super().construct_yaml_float(node)  # type: ignore[no-any-return]


_StrictLoader.add_constructor(_INT_TAG, _StrictLoader.construct_plain_int)
_StrictLoader.add_constructor(_FLOAT_TAG, _StrictLoader.construct_plain_float)


def _check_number(node: yaml.Node, where: str) -> None:
    if not isinstance(node, yaml.ScalarNode):
        return
    value = str(node.value)
    if (node.tag == _INT_TAG and not _PLAIN_INT.fullmatch(value)) or (
            node.tag == _FLOAT_TAG and ("_" in value or ":" in value)):
        raise yaml.constructor.ConstructorError(None, None, f"{where}{value[:40]!r} {_NOT_PLAIN}", node.start_mark)


def _load_yaml(text: str, error: type[_E]) -> Any:
    _check_yaml_shape(text, error)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - the safe loader, stricter
    except yaml.MarkedYAMLError as exc:
        raise error(f"not valid YAML{_yaml_where(exc)}") from exc
    except yaml.YAMLError as exc:
        raise error(f"not valid YAML: {exc}") from exc
    except RecursionError as exc:
        raise error("not valid YAML: nested too deeply") from exc
    return _dates_to_text(data)


def _yaml_where(exc: yaml.MarkedYAMLError) -> str:
    """The parser's complaint with its line, and the construct it was in with that one's line."""
    text = ""
    if exc.problem_mark is not None:
        text += f" at line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
    text += f": {exc.problem or 'syntax error'}"
    if exc.context:
        text += f" ({exc.context}"
        if exc.context_mark is not None:
            text += f" at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1}"
        text += ")"
    return text


def _dates_to_text(value: Any) -> Any:
    """YAML reads an unquoted ``2026-01-05`` as a date; the domain wants the text."""
    if isinstance(value, dt.date):  # datetime is a date too
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _dates_to_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dates_to_text(v) for v in value]
    return value


class _Dumper(yaml.SafeDumper):
    """Block style, multi-line strings as literal blocks where YAML allows it exactly."""


#: Characters YAML 1.1 reads as line breaks: outside double quotes they would be folded or normalised.
_ODD_BREAKS = frozenset("\r\x85\u2028\u2029")


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if _ODD_BREAKS.intersection(value):
        style: str | None = '"'  # escaped as \r, \N, \L, \P: exact
    elif "\n" in value:
        style = "|"  # the emitter falls back to quotes where a literal block would not be exact
    else:
        style = None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def _dump_yaml(document: Mapping[str, Any]) -> str:
    return yaml.dump(
        dict(document), Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100
    )


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


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
            value = cell
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
