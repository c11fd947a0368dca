"""How a ``qoss`` command reaches a running service, as ``kubectl`` reaches its cluster.

The service is chosen, most specific first, by ``QOSS_URL`` and ``QOSS_TOKEN`` (each on its own),
then by a **context** of the configuration file: ``--context NAME`` (or ``QOSS_CONTEXT``), else
the file's ``current-context``; with none of them, ``http://127.0.0.1:8000`` and no token. A
token is only ever sent to a service someone named (a flag, ``QOSS_URL`` or a context): a token
with no URL named is refused before anything is sent, never taken to the default address. The
file is ``QOSS_CONFIG`` (which must exist when named), else ``$XDG_CONFIG_HOME/qoss/config.yaml``
(``~/.config/qoss/``)::

    current-context: prod
    contexts:
      prod: {url: "https://qoss.example.net", token-file: /etc/qoss/prod.token, ca-file: /etc/qoss/ca.pem}
      lab: {url: "http://127.0.0.1:8000", token: "qoss_..."}

A file that holds a token itself is refused when anyone but its owner can read it (as ssh
refuses a private key); ``qoss context set`` writes it with mode 0600. Every change a command
asks for goes through the API, so it is checked, audited under the token's name and published
like any other client's. A refusal is one line on stderr (the service's error document, or why
the service could not be reached or is not qoss's API) and exit status 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import ssl
import stat
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

__all__ = ["DEFAULT_URL", "Format", "Output", "Service", "Target", "chosen", "config_path", "connect", "load_config",
           "refuse", "render", "save_config", "show"]

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


def refuse(message: str) -> NoReturn:
    """Stop the command: ``qoss: MESSAGE``, one line on stderr, exit status 2."""
    typer.echo(f"qoss: {message}", err=True)
    raise typer.Exit(2)


def load_config(path: Path | None = None, *, creating: bool = False) -> dict[str, Any]:
    """The configuration file's content (empty when there is none); a file that cannot be read,
    is not a mapping of contexts, or holds a token others can read is refused in one line, and
    so is a ``QOSS_CONFIG`` that names no file, unless the command is ``creating`` it."""
    import yaml

    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except FileNotFoundError:
        if os.environ.get("QOSS_CONFIG") and not creating:
            refuse(f"QOSS_CONFIG names {path}, which does not exist: make it with 'qoss context set', or unset "
                   "QOSS_CONFIG")
        return {"contexts": {}}
    except (OSError, UnicodeDecodeError) as exc:
        refuse(f"{path}: cannot read it ({exc.__class__.__name__})")
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        refuse(f"{path}: not YAML")
    contexts = data.get("contexts") if isinstance(data, dict) else None
    if not isinstance(data, dict) or not isinstance(contexts or {}, dict) or not all(
            isinstance(c, dict) for c in (contexts or {}).values()):
        refuse(f"{path}: expected 'contexts:' mapping each name to its url and token-file (or token)")
    data["contexts"] = contexts or {}
    if any("token" in c for c in data["contexts"].values()) and mode & (stat.S_IRWXG | stat.S_IRWXO):
        refuse(f"{path} holds a token and others can read it: chmod 600 {path}")
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
    True, or the context trusting the CA file named), the context it came from (None: the
    environment or the default), and who named the URL (``QOSS_URL``, a flag, ``context NAME``;
    None: the default address)."""

    url: str
    token: str | None
    verify: bool | ssl.SSLContext
    context: str | None
    url_from: str | None = None


def chosen(context: str | None = None, *, url: str | None = None) -> Target:
    """The service the environment and configuration file choose (see the module's text);
    ``url``: the one a command's ``--url`` names, before all others.

    A token with no URL named, a CA file that cannot be read, or a URL that is not HTTP(S) is
    refused in one line (exit 2) before anything is sent."""
    data = load_config()
    name = context or selected_context or os.environ.get("QOSS_CONTEXT") or data.get("current-context")
    entry: Mapping[str, Any] = {}
    if name:
        if name not in data["contexts"]:
            known = ", ".join(sorted(data["contexts"])) or "none"
            refuse(f"no context {name!r} in {config_path()} (known: {known}); add it with 'qoss context set'")
        entry = data["contexts"][name]
    token = os.environ.get("QOSS_TOKEN") or entry.get("token")
    token_from = "QOSS_TOKEN" if os.environ.get("QOSS_TOKEN") else f"context {name}'s token"
    if not token and entry.get("token-file"):
        try:
            token = Path(str(entry["token-file"])).read_text(encoding="utf-8").strip()
        except OSError as exc:
            refuse(f"context {name}: token-file {entry['token-file']}: cannot read it "
                   f"({(exc.strerror or type(exc).__name__).lower()})")
    named = [(url, "--url"), (os.environ.get("QOSS_URL"), "QOSS_URL"), (entry.get("url"), f"context {name}")]
    given, url_from = next(((str(u), source) for u, source in named if u), (None, None))
    if given is None and token:
        refuse(f"a token is set ({token_from}) but no service is named: set QOSS_URL (e.g. {DEFAULT_URL}) or "
               "choose a context ('qoss context use NAME'); a token is never sent to a default address")
    target = str(given or DEFAULT_URL).rstrip("/")
    if not target.startswith(("http://", "https://")):
        refuse(f"{target}: the service's URL starts with http:// or https://")
    verify: bool | ssl.SSLContext
    if os.environ.get("QOSS_CA_FILE"):
        verify = _trusting(os.environ["QOSS_CA_FILE"], "QOSS_CA_FILE")
    elif entry.get("ca-file"):
        verify = _trusting(str(entry["ca-file"]), f"context {name}'s ca-file")
    else:
        verify = True
    return Target(url=target, token=str(token) if token else None, verify=verify, context=name,
                  url_from=url_from)


def _trusting(ca_file: str, named_by: str) -> ssl.SSLContext:
    """A TLS context that trusts the CA certificates of ``ca_file`` (PEM); a file that is not
    there, cannot be read or holds no certificate is refused in one line naming ``named_by``."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except FileNotFoundError:
        refuse(f"{named_by} names {ca_file}, which does not exist")
    except ssl.SSLError:
        refuse(f"{named_by} names {ca_file}, which holds no PEM CA certificate")
    except OSError as exc:
        refuse(f"{named_by} names {ca_file}, which cannot be read "
               f"({(exc.strerror or type(exc).__name__).lower()})")


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
        """One request, its answer as it came. A transport failure is refused in one line, and
        so is an answer no qoss API gives (an HTML page, a redirect): the URL is not the API's."""
        import httpx

        try:
            answer = self._http.request(method, path, **kw)
        except httpx.TimeoutException:
            refuse(f"{self.target.url} did not answer within {_TIMEOUT:g} s")
        except httpx.TransportError as exc:
            why = str(exc).split("] ")[-1] or type(exc).__name__
            refuse(f"cannot reach qoss at {self.target.url} ({why}): start it ('qoss serve'), or choose the "
                   "service with QOSS_URL or 'qoss context use'")
        kind = answer.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind in ("text/html", "application/xhtml+xml") or answer.is_redirect:
            what = "an HTML page" if not answer.is_redirect else f"a redirect (HTTP {answer.status_code})"
            named = f" (named by {self.target.url_from})" if self.target.url_from else ""
            refuse(f"{self.target.url}{named} is not qoss's API: {method} {path} answered {what}; name the "
                   "service's address without a page's path (e.g. http://HOST:8000, not .../ui)")
        return answer

    def refused(self, answer: Any, hints: Mapping[str, str] | None = None) -> NoReturn:
        """Print the service's refusal, ``{"error": ..., "detail": ...}``, and exit 2; ``hints``:
        a ``hint`` to add to an error of that name (what to do instead)."""
        try:
            body = answer.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or "error" not in body:
            body = {"error": f"HTTP {answer.status_code}", "detail": answer.text[:200] or answer.reason_phrase}
        if hints and body.get("error") in hints:
            body["hint"] = hints[body["error"]]
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
