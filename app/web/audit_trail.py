"""Which requests leave an audit record, and when it is written: one set of rules for the full
stack (the guard in :mod:`app.main`) and the routes that bypass it (:mod:`app.web.bypass`).

- A change made in the request's unit of work was recorded in its transaction
  (:func:`app.web.deps.get_unit`); any other 2xx answer to a change is recorded before the
  answer is sent (:func:`record_change`).
- Refusals and computations are queued after the answer (:func:`audit`); a refusal anyone can
  send in bulk is counted with those of its kind from its source, one entry per window
  (:meth:`app.adapters.db.audit.Auditor.refused`), under the rule of its bypass route if it has
  one (:class:`RefusalRule`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.types import Scope

from app.adapters.db.audit import PendingRecord
from app.web.deps import in_worker_thread
from app.web.provenance import audit_fields
from app.web.runtime import runtime_of

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["RefusalRule", "audit", "audited_read", "changes", "record_change"]

_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
#: Requests that change nothing even though their method could: their records are batched.
_COMPUTES = frozenset({("POST", "/v1/negotiations")})
#: Refusals recorded whatever the method (a read refused is a security decision too).
_REFUSED = frozenset({401, 403, 413, 429})


@dataclass(frozen=True)
class RefusalRule:
    """How a route's refusals are counted, for routes that carry no token (the agent's messages).

    Attributes:
        in_bulk: whether an answer with this status is a refusal anyone can send without end.
        kind: what such a refusal is counted under, from the route's label and the audit detail.
    """

    in_bulk: Callable[[int], bool]
    kind: Callable[[str, str], str]


def changes(request: Request, status: int) -> bool:
    """Whether the answer ``status`` to ``request`` leaves a record of its own (a change, a
    refusal, or a read the route asked to have recorded)."""
    return request.method not in _SAFE or status in _REFUSED or audited_read(request)


def audited_read(request: Request) -> bool:
    """Whether a route asked for its read to be recorded like a change (``request.state.audit_read``:
    a one-time link's download spends the link), a failure counted like any refusal."""
    return bool(getattr(request.state, "audit_read", False))


async def record_change(request: Request, status: int) -> bool:
    """Before a 2xx answer to a change leaves: make sure its record is in the database.

    Returns whether the request's record is written (then nothing is queued for it).
    """
    pending: PendingRecord | None = getattr(request.state, "audit", None)
    if pending is not None and pending.committed is not None:
        return bool(pending.committed["outcome"] == status)  # else a later failure: queued as well
    if (request.method in _SAFE and not audited_read(request)) or not 200 <= status < 300 \
            or (request.method, request.url.path) in _COMPUTES:
        return False
    parts = runtime_of(request.app)
    if parts is None:
        return False
    await in_worker_thread(parts.auditor.write, audit_fields(request, status))
    return True


def audit(request: Request, outcome: int) -> None:
    """Queue the audit record of one request: who, what, the outcome (never a body or a secret).

    A refusal anyone can send in bulk (401, 403, 413, 429, or any 4xx to a request without a
    valid token; for a route with a :class:`RefusalRule`, as its rule says) is counted with
    those of its kind from its source instead, one entry per window.
    """
    parts = runtime_of(request.app)
    if parts is None:
        return
    fields = audit_fields(request, outcome)
    rule = _refusal_rule(request.app, request.scope)
    route = parts.request_timer.labels.label(request.scope)
    if rule is not None:
        if rule.in_bulk(outcome):
            parts.auditor.refused(fields, route=rule.kind(route, fields["detail"]))
        else:
            parts.auditor.record(**fields)
    elif outcome in _REFUSED or (400 <= outcome < 500 and fields["token_id"] is None):
        parts.auditor.refused(fields, route=route)
    else:
        parts.auditor.record(**fields)


def _refusal_rule(app: Starlette, scope: Scope) -> RefusalRule | None:
    """The refusal rule of the bypass route this request is for, whichever way it was answered."""
    bypass: Any = getattr(app.state, "bypass", None)
    if bypass is None:
        return None
    rule: RefusalRule | None = bypass.refusal_rule(scope)
    return rule
