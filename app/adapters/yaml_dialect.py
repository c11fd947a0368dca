"""The YAML our documents are written in: read strictly, written exactly.

Reading refuses what a small document turns into an attack or a silent surprise: aliases
(a few lines of them expand to billions of nodes), deep nesting, a key given twice, merge
keys, and numbers in anything but plain decimal notation; unquoted dates come back as text.
Writing uses block style and literal blocks for multi-line strings where YAML reads them
back exactly. Every YAML qoss reads comes through :func:`load_yaml`: API imports, ``qoss
ratings import``, files on disk.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import yaml

from app.domain.errors import InvalidInput

__all__ = ["dump_yaml", "load_yaml"]

_E = TypeVar("_E", bound=InvalidInput)

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


def load_yaml(text: str, error: type[_E]) -> Any:
    """One YAML document of ``text``, read strictly, dates as text.

    Raises:
        error: aliases, deep nesting, a duplicate or merge key, a number not in plain
            decimals, or not YAML (the message names the line where the parser knows it).
    """
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


def dump_yaml(document: Mapping[str, Any]) -> str:
    """``document`` as YAML that :func:`load_yaml` reads back exactly."""
    return yaml.dump(
        dict(document), Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100
    )
