"""What charon's log lines and socket errors say, for error messages: the lines that explain a
failed ``initiate`` or ``terminate`` (``NO_PROPOSAL_CHOSEN`` ...), with every secret scrubbed."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = []


#: Log lines of an ``initiate``/``terminate`` that explain a failure.
_REASON = re.compile(
    r"\b(?:[A-Z0-9]+_)*(?:CHOSEN|FAILED|UNACCEPTABLE|REQUIRED|INVALID[A-Z_]*)\b|notify|fail|unable|giving up|"
    r"retransmit|timed? ?out|not (?:found|established)|no (?:matching|acceptable|trusted|shared|config)",
    re.IGNORECASE,
)
#: Message traces, which name every payload and would drown the reason.
_TRACE = re.compile(r"^(?:generating|parsed|sending packet|received packet) ")
_MAX_REASONS = 8


def _log_lines(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """charon's log lines in decoded ``control-log`` events."""
    return [str(e["msg"]) for e in events if e.get("msg")]


def _scrub(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "<secret>")
    return text


def _reasons(log: Sequence[str]) -> list[str]:
    picked = [line for line in log if _REASON.search(line) and not _TRACE.match(line)] or list(log[-3:])
    out: list[str] = []
    for line in picked:
        if line not in out:
            out.append(line)
    return out[-_MAX_REASONS:]


def _unreachable_reason(exc: OSError, timeout: float) -> str:
    if isinstance(exc, FileNotFoundError):
        return "no such socket (is charon running?)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (charon is not listening)"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or str(exc) or type(exc).__name__


