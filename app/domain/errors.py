"""The project's exceptions: one root, each leaf also the builtin a caller would catch.

    QossError
    ├── InvalidInput (ValueError)                 -> 422
    │   ├── UnknownAlgorithm (KeyError)
    │   ├── InvalidRatingTable
    │   ├── InvalidPolicy
    │   └── UnsupportedMediaType                  -> 415
    ├── NotFound (LookupError)                    -> 404
    ├── Conflict                                  -> 409
    │   ├── AlreadyExists
    │   └── StaleRevision
    │       └── EditConflict
    ├── NegotiationError
    │   ├── NoFeasibleSuite (ValueError)          -> 409
    │   └── UnsupportedProtection (ValueError)    -> 409
    └── GatewayError
        ├── GatewayUnreachable (ConnectionError)  -> 503
        ├── GatewayRejected (RuntimeError)        -> 502
        └── TunnelVerificationFailed (RuntimeError) -> 502
    PeerError (names the peer)
    ├── PeerUnreachable (ConnectionError)         -> 503
    │   └── PeerTimeout (TimeoutError)            -> 504
    ├── PeerRefused (RuntimeError)                -> 502
    └── PeerNoFeasibleSuite (NegotiationError)    -> 409

The HTTP status of each is decided in one place, ``app.web.errors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "AlreadyExists",
    "Conflict",
    "EditConflict",
    "GatewayError",
    "GatewayRejected",
    "GatewayUnreachable",
    "InvalidInput",
    "InvalidPolicy",
    "InvalidRatingTable",
    "NegotiationError",
    "NoFeasibleSuite",
    "NotFound",
    "PeerError",
    "PeerNoFeasibleSuite",
    "PeerRefused",
    "PeerTimeout",
    "PeerUnreachable",
    "PlatformCannot",
    "QossError",
    "StaleRevision",
    "TunnelVerificationFailed",
    "UnknownAlgorithm",
    "UnmetRequirement",
    "UnsupportedMediaType",
    "UnsupportedProtection",
]


class QossError(Exception):
    """Root of every error qoss raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def detail(self) -> Any:
        """What an API client is told: JSON-serialisable, never a secret."""
        return self.message


class InvalidInput(QossError, ValueError):
    """Input that cannot be accepted as it stands."""


class UnknownAlgorithm(InvalidInput, KeyError):
    """A keyword that is not in the algorithm catalogue."""

    def __init__(self, keyword: str, close_matches: list[str]) -> None:
        hint = f"; did you mean {', '.join(close_matches)}?" if close_matches else ""
        super().__init__(f"unknown algorithm {keyword!r}{hint}")
        self.keyword = keyword
        self.close_matches = close_matches

    def __str__(self) -> str:  # KeyError would quote the message otherwise
        return self.message

    def detail(self) -> Any:
        return {"message": self.message, "keyword": self.keyword, "close_matches": self.close_matches}


class InvalidRatingTable(InvalidInput):
    """A rating table whose content is not valid."""


class InvalidPolicy(InvalidInput):
    """A policy whose content is not valid."""


class UnsupportedMediaType(InvalidInput):
    """Content of a media type this service does not take (a device profile's handoff)."""


class NotFound(QossError, LookupError):
    """A named object that does not exist."""


class Conflict(QossError):
    """A request that conflicts with the current state."""


class AlreadyExists(Conflict):
    """An object of that name exists already."""


class StaleRevision(Conflict):
    """A write based on a revision that is no longer the current one (If-Match failed)."""

    def __init__(self, name: str, expected: int, current: int) -> None:
        super().__init__(f"{name}: revision {expected} is stale, the current revision is {current}")
        self.current = current


class EditConflict(StaleRevision):
    """An edit based on an older revision that changes a value someone else changed since,
    to another value: nothing of it is written.

    ``conflicts`` are ``{"algorithm", "field", "base", "theirs", "mine"}`` entries (see
    :class:`app.domain.merge.FieldConflict`); ``theirs`` is the value at revision ``current``.
    """

    def __init__(self, name: str, expected: int, current: int, conflicts: list[dict[str, Any]],
                 kind: str = "table") -> None:
        clashes = "; ".join(_clash(c, current) for c in conflicts)
        QossError.__init__(self, f"{name}: changed since revision {expected}: {clashes}")
        self.name = name
        self.expected = expected
        self.current = current
        self.conflicts = conflicts
        self.kind = kind

    def detail(self) -> Any:
        return {"message": self.message, self.kind: self.name, "based_on": self.expected,
                "revision": self.current, "conflicts": self.conflicts}


def _clash(conflict: dict[str, Any], current: int) -> str:
    """One conflict in words: the row and field, their value at ``current`` and the edit's."""
    row, field = conflict["algorithm"], conflict["field"]
    if field == "*":  # a whole row: one side removed it, the other changed it
        if conflict["theirs"] is None:
            return f"{row} was removed at revision {current}, you changed it"
        return f"{row} was changed at revision {current}, you removed it"
    where = f"{row} {field}" if row else field
    return f"{where} is {_shown(conflict['theirs'])} at revision {current}, yours is {_shown(conflict['mine'])}"


def _shown(value: Any) -> str:
    return "none" if value is None else repr(value) if isinstance(value, str) else str(value)


class NegotiationError(QossError):
    """Negotiation could not produce a suite."""


@dataclass(frozen=True)
class UnmetRequirement:
    """One requirement no candidate met: which peer asked, for what, and the best on offer."""

    peer: str
    requirement: str
    level: int
    best_available: int | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "peer": self.peer,
            "requirement": self.requirement,
            "level": self.level,
            "best_available": self.best_available,
        }


class NoFeasibleSuite(NegotiationError, ValueError):
    """No suite meets every peer's minimums with the algorithms all peers support."""

    def __init__(self, unmet: list[UnmetRequirement], notes: list[str] | None = None) -> None:
        parts = [
            f"{u.requirement} {u.level} for {u.peer} (best available: {u.best_available})" for u in unmet
        ]
        reason = "; ".join(parts) or (notes[-1] if notes else "no candidate algorithms")
        super().__init__("no feasible suite: " + reason)
        self.unmet = unmet
        self.notes = notes or []

    def detail(self) -> Any:
        return {
            "message": self.message,
            "unmet": [u.as_dict() for u in self.unmet],
            "notes": self.notes,
        }


class PlatformCannot(NegotiationError, ValueError):
    """A device's platform cannot negotiate (or cannot express in its profile) a suite that meets
    the minimums; the message names the platform and what is missing."""


class UnsupportedProtection(NegotiationError, ValueError):
    """The objectives ask for protection the back end cannot give and the policy is strict."""


class GatewayError(QossError):
    """A strongSwan gateway could not do what was asked."""


class GatewayUnreachable(GatewayError, ConnectionError):
    """The gateway's VICI socket cannot be reached."""

    def __init__(self, socket_path: str, reason: str) -> None:
        super().__init__(f"strongSwan unreachable at {socket_path}: {reason}")
        self.socket_path = socket_path


class GatewayRejected(GatewayError, RuntimeError):
    """strongSwan refused a command; the message is strongSwan's own."""


class TunnelVerificationFailed(GatewayError, RuntimeError):
    """strongSwan negotiated something other than what qoss chose."""


class PeerError(QossError):
    """Another qoss (a peer) could not do its part of a tunnel; the message names the peer."""

    def __init__(self, peer: str, message: str) -> None:
        super().__init__(f"peer {peer}: {message}")
        self.peer = peer


class PeerUnreachable(PeerError, ConnectionError):
    """The peer's API does not answer (503): nothing of the tunnel was loaded here."""


class PeerTimeout(PeerUnreachable, TimeoutError):
    """The peer did not answer in time (504)."""


class PeerRefused(PeerError, RuntimeError):
    """The peer refused (502): its peering with this side, or what was asked of it.

    ``status``: the HTTP status the peer answered with, where the refusal is one (None: an
    answer that did not check out)."""

    def __init__(self, peer: str, message: str, *, status: int | None = None) -> None:
        super().__init__(peer, message)
        self.status = status


class PeerNoFeasibleSuite(PeerError, NegotiationError):
    """No suite this side offered meets the peer's requirements (409); the peer says no more."""
