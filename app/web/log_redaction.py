"""Secrets in query strings, and in the one path that carries one, kept out of the logs.

uvicorn's access log writes each request's path with its query string as the client sent it,
so ``GET /v1/tunnels?access_token=qoss_...`` would put the token in the log (qoss reads tokens
from the ``Authorization`` header only, but a client may still send one in the URL). A
:class:`QuerySecretFilter` on a logger replaces the value of every query parameter whose name
is a secret's (:data:`SECRET_PARAMETER`: ``access_token``, ``token``, ``api_key``,
``password``, ``secret``, ...) with :data:`REDACTED` in each record's message and arguments,
before any handler formats it; so is the token of a one-time profile link
(``/v1/agent/handoffs/<token>``, :data:`SECRET_PATH`), though it is spent once fetched.
:func:`install_query_secret_filter` puts it on uvicorn's
loggers; a logger's filters outlive a ``logging.config.dictConfig`` of it, such as the one
``uvicorn.Config`` runs.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_plus

__all__ = [
    "REDACTED",
    "SECRET_PARAMETER",
    "SECRET_PATH",
    "UVICORN_LOGGERS",
    "QuerySecretFilter",
    "install_query_secret_filter",
    "redact_query_secrets",
]

#: What a secret parameter's value becomes in a log.
REDACTED = "REDACTED"

#: The names (percent-decoded, any case) of query parameters whose values are secrets.
SECRET_PARAMETER = re.compile(
    r"token|secret|passw|passphrase|psk|credential|signature|session|cookie|bearer|jwt|auth(?!or)"
    r"|api[-_.]?key|access[-_.]?key|private[-_.]?key|^key$|^sig$|^code$",
    re.IGNORECASE,
)

#: A path whose last segment is a secret: a device profile's one-time download link.
SECRET_PATH = re.compile(r"(?P<path>/v1/agent/handoffs/)[A-Za-z0-9_-]{20,64}")

#: The loggers :func:`install_query_secret_filter` guards by default: uvicorn's access log
#: (its arguments are ``(client, method, path with query, HTTP version, status)``) and its error log.
UVICORN_LOGGERS: tuple[str, ...] = ("uvicorn.access", "uvicorn.error")

# A parameter after "?" or "&": its name up to "=", its value up to the next "&" or white space.
_PARAMETER = re.compile(r"(?P<lead>[?&])(?P<name>[^=&?#\s]+)=(?P<value>[^&\s]*)")


def _redact_parameter(match: re.Match[str]) -> str:
    if not match["value"] or not SECRET_PARAMETER.search(unquote_plus(match["name"])):
        return match[0]
    return f"{match['lead']}{match['name']}={REDACTED}"


def redact_query_secrets(text: str) -> str:
    """``text`` with the value of every secret query parameter replaced by :data:`REDACTED`.

    >>> redact_query_secrets("/v1/tunnels?limit=5&access_token=qoss_0a_b")
    '/v1/tunnels?limit=5&access_token=REDACTED'

    And a one-time link's token (:data:`SECRET_PATH`).
    """
    if "/v1/agent/handoffs/" in text:
        text = SECRET_PATH.sub(lambda m: m["path"] + REDACTED, text)
    if "=" not in text:
        return text
    return _PARAMETER.sub(_redact_parameter, text)


def _redact(value: Any) -> Any:
    return redact_query_secrets(value) if isinstance(value, str) else value


class QuerySecretFilter(logging.Filter):
    """Redacts secret query parameters in a record's message and arguments; lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_query_secrets(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_redact(arg) for arg in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {key: _redact(arg) for key, arg in record.args.items()}
        return True


def install_query_secret_filter(names: tuple[str, ...] = UVICORN_LOGGERS) -> None:
    """Put a :class:`QuerySecretFilter` on each named logger that has none yet (idempotent).

    A logger's filter sees the records logged to that logger itself, which is how uvicorn logs
    its access lines.
    """
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuerySecretFilter) for f in logger.filters):
            logger.addFilter(QuerySecretFilter())
