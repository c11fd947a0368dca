"""How a ``qoss`` command reaches a running service, as ``kubectl`` reaches its cluster.

The service is chosen, most specific first, by ``QOSS_URL`` and ``QOSS_TOKEN`` (each on its own),
then by a **context** of the configuration file: ``--context NAME`` (or ``QOSS_CONTEXT``), else
the file's ``current-context``; with none of them, ``http://127.0.0.1:8000`` and no token. The
file is ``QOSS_CONFIG``, else ``$XDG_CONFIG_HOME/qoss/config.yaml`` (``~/.config/qoss/``)::

    current-context: prod
    contexts:
      prod: {url: "https://qoss.example.net", token-file: /etc/qoss/prod.token, ca-file: /etc/qoss/ca.pem}
      lab: {url: "http://127.0.0.1:8000", token: "qoss_..."}

A file that holds a token itself is refused when anyone but its owner can read it (as ssh
refuses a private key); ``qoss context set`` writes it with mode 0600. Every change a command
asks for goes through the API, so it is checked, audited under the token's name and published
like any other client's. A refusal is one line on stderr (the service's error document, or why
the service could not be reached) and exit status 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import stat
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

__all__ = ["DEFAULT_URL", "Format", "Output", "Service", "config_path", "connect", "load_config", "render",
           "save_config", "show"]

DEFAULT_URL = "http://127.0.0.1:8000"


class Format(enum.StrEnum):
    """How a command prints what it got."""

    table = "table"
    json = "json"
    yaml = "yaml"


Output = Annotated[Format | None, typer.Option(
    "-o", "--output", help="table (the default on a terminal), json (the default otherwise) or yaml")]

_TIMEOUT = 60.0

#: ``qoss --context NAME``: set by the root command at every invocation (None: not given).
selected_context: str | None = None


def config_path() -> Path:
    """The configuration file: ``QOSS_CONFIG``, else ``$XDG_CONFIG_HOME/qoss/config.yaml``."""
    if os.environ.get("QOSS_CONFIG"):
        return Path(os.environ["QOSS_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "qoss" / "config.yaml"


def _refuse(message: str) -> NoReturn:
    typer.echo(f"qoss: {message}", err=True)
    raise typer.Exit(2)


def load_config(path: Path | None = None) -> dict[str, Any]:
    """The configuration file's content (empty when there is none); a file that cannot be read,
    is not a mapping of contexts, or holds a token others can read is refused in one line."""
    import yaml

    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except FileNotFoundError:
        return {"contexts": {}}
    except (OSError, UnicodeDecodeError) as exc:
        _refuse(f"{path}: cannot read it ({exc.__class__.__name__})")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        _refuse(f"{path}: not YAML")
    contexts = data.get("contexts") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(contexts or {}, dict) or not all(
            isinstance(c, dict) for c in (contexts or {}).values()):
        _refuse(f"{path}: expected 'contexts:' mapping each name to its url and token-file (or token)")
    data["contexts"] = contexts or {}
    if any("token" in c for c in data["contexts"].values()) and mode & (stat.S_IRWXG | stat.S_IRWXO):
        _refuse(f"{path} holds a token and others can read it: chmod 600 {path}")
    return data


def save_config(data: Mapping[str, Any], path: Path | None = None) -> Path:
    """Write the configuration file whole (mode 0600, replaced at once: never half-written)."""
    import yaml

    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    part = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            yaml.safe_dump(dict(data), out, sort_keys=False)
        os.replace(part, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            part.unlink()
    return path


@dataclass(frozen=True)
class Target:
    """Which service a command talks to: ``url``, ``token`` (None: anonymous), ``verify`` (TLS:
    True, or a CA file), and the context it came from (None: the environment or the default)."""

    url: str
    token: str | None
    verify: bool | str
    context: str | None


def chosen(context: str | None = None) -> Target:
    """The service the environment and configuration file choose (see the module's text)."""
    data = load_config()
    name = context or selected_context or os.environ.get("QOSS_CONTEXT") or data.get("current-context")
    entry: Mapping[str, Any] = {}
    if name:
        if name not in data["contexts"]:
            known = ", ".join(sorted(data["contexts"])) or "none"
            _refuse(f"no context {name!r} in {config_path()} (known: {known}); add it with 'qoss context set'")
        entry = data["contexts"][name]
    token = os.environ.get("QOSS_TOKEN") or entry.get("token")
    if not token and entry.get("token-file"):
        try:
            token = Path(str(entry["token-file"])).read_text(encoding="utf-8").strip()
        except OSError as exc:
            _refuse(f"context {name}: token-file {entry['token-file']}: cannot read it "
                    f"({(exc.strerror or type(exc).__name__).lower()})")
    url = str(os.environ.get("QOSS_URL") or entry.get("url") or DEFAULT_URL).rstrip("/")
    if not url.startswith(("http://", "https://")):
        _refuse(f"{url}: the service's URL starts with http:// or https://")
    ca = os.environ.get("QOSS_CA_FILE") or entry.get("ca-file")
    return Target(url=url, token=str(token) if token else None, verify=str(ca) if ca else True, context=name)


class Service:
    """One running qoss, reached over HTTP with one connection for the whole command."""

    def __init__(self, target: Target) -> None:
        import httpx

        self.target = target
        headers = {"User-Agent": "qoss-cli"}
        if target.token:
            headers["Authorization"] = f"Bearer {target.token}"
        self._http = httpx.Client(base_url=target.url, headers=headers, timeout=_TIMEOUT, verify=target.verify)

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, *, ok: tuple[int, ...] = (200, 201, 204), **kw: Any) -> Any:
        """Send one request; the answer's document (its text for a text answer, None for 204).
        Anything else is refused as the service said it, or as the transport failed."""
        answer = self.send(method, path, **kw)
        if answer.status_code not in ok:
            self.refused(answer)
        if answer.status_code == 204 or not answer.content:
            return None
        if answer.headers.get("content-type", "").startswith("application/json"):
            return answer.json()
        return answer.text

    def send(self, method: str, path: str, **kw: Any) -> Any:
        """One request, its answer as it came (a transport failure is refused in one line)."""
        import httpx

        try:
            return self._http.request(method, path, **kw)
        except httpx.TimeoutException:
            _refuse(f"{self.target.url} did not answer within {_TIMEOUT:g} s")
        except httpx.TransportError as exc:
            why = str(exc).split("] ")[-1] or type(exc).__name__
            _refuse(f"cannot reach qoss at {self.target.url} ({why}): start it ('qoss serve'), or choose the "
                    "service with QOSS_URL or 'qoss context use'")

    def refused(self, answer: Any) -> NoReturn:
        """Print the service's refusal, ``{"error": ..., "detail": ...}``, and exit 2."""
        try:
            body = answer.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "error" not in body:
            body = {"error": f"HTTP {answer.status_code}", "detail": answer.text[:200] or answer.reason_phrase}
        if answer.status_code == 401 and not self.target.token:
            body["hint"] = "no token: set QOSS_TOKEN, or a context's token-file ('qoss context set')"
        detail = body.get("detail")
        typer.echo(json.dumps(body) if isinstance(detail, str) or detail is None else json.dumps(body, indent=2),
                   err=True)
        raise typer.Exit(2)

    def revision(self, path: str) -> int:
        """The current revision of the document at ``path`` (its ETag)."""
        answer = self.send("GET", path)
        if answer.status_code != 200:
            self.refused(answer)
        return int(answer.headers["ETag"].strip('"'))


@contextlib.contextmanager
def connect(context: str | None = None) -> Iterator[Service]:
    """The chosen service for the length of a command."""
    service = Service(chosen(context))
    try:
        yield service
    finally:
        service.close()


_INSTANT = re.compile(r"^(\d{4}-\d\d-\d\d)T(\d\d:\d\d:\d\d)(?:\.\d+)?(?:\+00:00|Z)$")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str) and (instant := _INSTANT.match(value)):
        return f"{instant[1]} {instant[2]}Z"  # UTC to the second: a table is read by people
    if isinstance(value, list) and all(not isinstance(v, dict | list) for v in value):
        return ",".join(str(v) for v in value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"), default=str)
    return str(value)


def _table(rows: list[Mapping[str, Any]], columns: list[str] | None) -> str:
    if not rows:
        return "(none)\n"
    columns = columns or [k for k, v in rows[0].items() if not isinstance(v, dict)][:8]
    cells = [[c.upper().replace("_", " ") for c in columns]] + [[_cell(r.get(c)) for c in columns] for r in rows]
    cells = [[cell if len(cell) <= 60 else cell[:59] + "…" for cell in row] for row in cells]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines) + "\n"


def render(value: Any, output: Format | None, columns: list[str] | None = None) -> str:
    """``value`` as ``output`` asks (None: a table on a terminal, JSON otherwise): a list of
    records is a table of their ``columns`` (default: their first plain fields), one record a
    list of its fields."""
    import yaml

    fmt = output or (Format.table if sys.stdout.isatty() else Format.json)
    if fmt is Format.json:
        return json.dumps(value, indent=2, default=str) + "\n"
    if fmt is Format.yaml:
        return str(yaml.safe_dump(json.loads(json.dumps(value, default=str)), sort_keys=False))
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return _table(value, columns)
    if isinstance(value, dict):
        width = max((len(k) for k in value), default=0)
        return "".join(f"{k.ljust(width)}  {_cell(v)}\n" for k, v in value.items())
    return f"{_cell(value)}\n"


def show(value: Any, output: Format | None, columns: list[str] | None = None) -> None:
    """Print ``value`` (:func:`render`)."""
    typer.echo(render(value, output, columns), nl=False)
