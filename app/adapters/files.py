"""Rating tables and policies as files: YAML documents in ``ratings/`` and ``policies/``, CSV for tables.

Pure I/O and format conversion around the domain's ``from_dict`` / ``as_dict``: the
domain validates, this module reads, parses and writes. Every document is capped at
:data:`MAX_DOCUMENT_BYTES` before it is parsed, and a file is read only if it is a regular
file, never more than the cap and one byte (:func:`read_document`); every syntax error becomes the domain's
:class:`~app.domain.errors.InvalidRatingTable` or :class:`~app.domain.errors.InvalidPolicy`,
chained to the parser's exception and naming the line where the parser knows it. The YAML
is read and written by :mod:`app.adapters.yaml_dialect`, a table's CSV rows by
:mod:`app.adapters.rating_csv`.

Round trips are exact: ``parse_rating_table_yaml(dump_rating_table_yaml(t))``,
``parse_rating_table_csv(dump_rating_table_csv(t), name=t.name, ...)`` and
``parse_policy_yaml(dump_policy_yaml(p))`` give back equal content.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from app.adapters.rating_csv import rows_from_csv, table_to_csv
from app.adapters.yaml_dialect import dump_yaml, load_yaml
from app.domain.errors import InvalidInput, InvalidPolicy, InvalidRatingTable
from app.domain.policies import Policy
from app.domain.ratings import RatingTable

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "decode_document",
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
    "read_document",
]

#: Largest document (file or text) accepted, in bytes of UTF-8: 1 MiB, the API's default
#: ``max_body_bytes``.
MAX_DOCUMENT_BYTES = 1 << 20

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
    return RatingTable.from_dict(load_yaml(text, InvalidRatingTable), name=name)


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
    return dump_yaml(table.as_dict())


def dump_rating_table_csv(table: RatingTable) -> str:
    """A rating table's rows as CSV with the :data:`~app.adapters.rating_csv.CSV_COLUMNS` header.

    The table's name, description and source are not part of the CSV; give them to
    :func:`parse_rating_table_csv` when reading it back.
    """
    return table_to_csv(table)


def parse_rating_table_csv(text: str, *, name: str, description: str = "", source: str = "") -> RatingTable:
    """Parse and validate a rating table from CSV text.

    The first row is the header: ``algorithm`` is required, the other
    :data:`~app.adapters.rating_csv.CSV_COLUMNS` are optional and may come in any order; other columns are
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
    rows = rows_from_csv(text)
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
    return Policy.from_dict(load_yaml(text, InvalidPolicy), name=name)


def dump_policy_yaml(policy: Policy) -> str:
    """A policy as a YAML document that :func:`parse_policy_yaml` reads back exactly.

    Fields that are unset (``None``) are left out.
    """
    return dump_yaml({k: v for k, v in policy.as_dict().items() if v is not None})


# --------------------------------------------------------------------------- reading files


def read_document(path: _Path, error: type[InvalidInput] = InvalidInput) -> str:
    """The text of a document file: a regular file of at most :data:`MAX_DOCUMENT_BYTES` of UTF-8.

    The file is opened without waiting (a FIFO without a writer does not hang) and refused
    unless it is a regular file: a FIFO, a device such as ``/dev/zero``, a socket or a
    directory is never read. At most the cap and one byte are read, whatever the file's size
    says or becomes meanwhile.

    Raises:
        error: not a regular file, larger than the cap, or not UTF-8; the message starts
            with the path.
        OSError: the file cannot be opened.
    """
    where = os.fspath(path)
    if not stat.S_ISREG(os.stat(where).st_mode):  # not even opened: opening some devices acts
        raise error(f"{where}: not a regular file")
    fd = os.open(where, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with open(fd, "rb", closefd=True) as fh:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):  # replaced since the first look
            raise error(f"{where}: not a regular file")
        if found.st_size > MAX_DOCUMENT_BYTES:
            raise error(f"{where}: larger than {MAX_DOCUMENT_BYTES} bytes")
        data = fh.read(MAX_DOCUMENT_BYTES + 1)
    return decode_document(data, where, error)


def decode_document(data: bytes, where: str, error: type[InvalidInput] = InvalidInput) -> str:
    """Bytes read of a document (at most the cap and one byte) as its text.

    Raises:
        error: more than :data:`MAX_DOCUMENT_BYTES`, or not UTF-8; the message starts with ``where``.
    """
    if len(data) > MAX_DOCUMENT_BYTES:
        raise error(f"{where}: larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (byte {exc.start})") from exc


# --------------------------------------------------------------------------- helpers


def _load_file(file: Path, from_dict: Callable[..., _T], error: type[_E]) -> _T:
    """One YAML document of a file, made into its object by ``from_dict(data, name=...)``.

    A document without a ``name`` takes the file's stem as its name; an error's message
    starts with the file name.
    """
    text = read_document(file, error)
    try:
        data = load_yaml(text, error)
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


def _check_size(text: str, error: type[_E]) -> None:
    if not isinstance(text, str):
        raise error("the document must be text")
    # Cheap bound first: a str of n code points is at least n bytes of UTF-8.
    if len(text) > MAX_DOCUMENT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise error(f"document larger than {MAX_DOCUMENT_BYTES} bytes")
