"""Target's sessions and the edits of rating tables and policies: what each session was
negotiated under (its provenance), what an edit does to it, and closing the sessions an edit
leaves below their objective's minimums.

A session's suite is also held by the client's own charon, so Target cannot move it alone: a
session whose suite falls below its minimums is closed by Target with the reason (its record
``closed``, its SAs terminated and its conn, secret and pool unloaded, an event and an audit
record naming the edit, the old suite and the one a new connect gets); the client's status then
reports it closed, and a new connect gets the new suite. A session that is merely offered a
cheaper or different suite keeps its suite until the client connects again.

Which edits count: those made in Target's own database, whose rating tables and policies its
negotiation reads. Every process playing Target reads that database's event log
(:meth:`SessionFollower.follow`, from Target's sweeper); a session is closed once, by whichever
process gets there first.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from app.domain.agent import AgentSessionState, ClientRequest
from app.domain.agent.platforms import PLATFORMS, post_quantum_refusal
from app.domain.agent.ports import AgentSession, AgentStore
from app.domain.errors import QossError
from app.domain.negotiation import Backend, NegotiationResult
from app.domain.policies import Levels
from app.domain.ports import UnitOfWork, UnitOfWorkFactory
from app.domain.requests import NegotiationSpec, PeerSpec
from app.services.events import kinds_after
from app.services.negotiation import run_negotiation
from app.services.rekey import ImpactKind, judge

__all__ = ["SessionFollower", "SessionImpact", "active_sessions", "assess_session", "assess_sessions",
           "close_reason", "negotiate_session", "platform_policy", "session_inputs", "session_provenance"]

log = logging.getLogger("qoss.agent.target")

#: The events of edits a session's negotiation may depend on, and how a reason names them.
_EDITS = {"rating_table.revision": "rating table", "rating_table.deleted": "rating table",
          "policy.revision": "policy", "policy.deleted": "policy"}
_SUITE_FIELDS = ("protocol", "encryption", "integrity", "key_exchange", "aead", "post_quantum")


# --------------------------------------------------------------------------- provenance


def session_inputs(request: ClientRequest, *, policy: str | None, rating_table: str | None,
                   capabilities: tuple[frozenset[str], str | None]) -> dict[str, Any]:
    """What decides a session's negotiation, as a document: the client's objective, minimums and
    algorithms, AH and transport mode asked for; Target's policy, rating table, algorithms and
    back end. Kept in the session's provenance, so it can be negotiated again after an edit."""
    info = request.request_info
    algorithms, backend = capabilities
    return {"objective_id": request.objective_id, "min_levels": dict(info.min_levels),
            "supports": list(info.supports) if info.supports else None, "ah": info.ah,
            "transport": info.transport, "policy": policy, "rating_table": rating_table,
            "target_supports": sorted(algorithms), "backend": backend,
            **({"platform": info.platform} if info.platform is not None else {})}


def platform_policy(platform: str) -> str:
    """The stored policy that says what ``platform``'s VPN client can negotiate (its record's
    capability table, :data:`app.domain.agent.platforms.PLATFORMS`)."""
    return PLATFORMS[platform].policy


def negotiate_session(*, uow: UnitOfWork, inputs: Mapping[str, Any], default_table: str,
                      pinned: Sequence[str] | None = None, check: bool = False) -> NegotiationResult:
    """Negotiate a session from its inputs (:func:`session_inputs`): the client a peer with its
    objective, minimums and algorithms, Target a peer with its policy and algorithms (it agrees to
    Native, Objective-ID 1, unless its policy asks for protection).

    ``pinned``: also only these algorithms (the suite the session runs on), to ask whether that
    suite still meets the minimums (``NoFeasibleSuite`` if not). ``check``: each table's revision
    read now (:func:`~app.services.negotiation.run_negotiation`).
    """
    libipsec = inputs["backend"] == "kernel-libipsec"
    objective = inputs["objective_id"]
    supports = inputs["supports"]
    peers = [
        PeerSpec(name="client", objective_id=objective, min_levels=Levels.from_dict(inputs["min_levels"]),
                 supports=tuple(supports) if supports is not None else None),
        PeerSpec(name="target", policy=inputs["policy"], supports=tuple(inputs["target_supports"]),
                 objective_id=1 if objective == 1 else None),
    ]
    if inputs.get("platform"):
        # A device's VPN client is a peer too: its platform table (a stored policy) says what it
        # can negotiate.
        peers.append(PeerSpec(name=inputs["platform"], policy=platform_policy(inputs["platform"])))
    if pinned is not None:
        peers.append(PeerSpec(name="current-suite", supports=tuple(pinned)))
    body = NegotiationSpec(
        rating_table=inputs["rating_table"], peers=tuple(peers),
        backend=Backend(name=inputs["backend"] or "strongswan", ah=inputs["ah"] and not libipsec,
                        ah_esp_bundle=False, transport=inputs["transport"] and not libipsec))
    return run_negotiation(uow=uow, request=body, default_table=default_table, check=check)


def session_provenance(*, uow: UnitOfWork, inputs: Mapping[str, Any], result: NegotiationResult) -> dict[str, Any]:
    """What a session was negotiated under: its inputs, the revision of each rating table the
    negotiation just read through ``uow`` (the tables it used, normally no query) and of Target's
    stored policy, and the suite's cost."""
    tables = {name: uow.tables.recent(name).revision for name in sorted(set(result.tables.values()))}
    policy = inputs.get("policy")
    platform = inputs.get("platform")
    return {"request": dict(inputs), "tables": tables,
            "policy_revision": uow.policies.get(policy)[1] if policy else None, "cost": result.cost,
            **({"platform_revision": uow.policies.get(platform_policy(platform))[1]} if platform else {})}


# --------------------------------------------------------------------------- assessment


@dataclass(frozen=True)
class SessionImpact:
    """What an edit does to one agent session (its ticket and user)."""

    ticket: str
    user: str
    objective_id: int
    kind: ImpactKind
    old: Mapping[str, Any]
    new: Mapping[str, Any] | None
    reason: str
    #: The running suite's algorithms the new negotiation rejects (noncompliant only).
    rejected: tuple[str, ...] = ()
    #: A device enrolment: its platform (its profile goes stale when the session is closed).
    platform: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"ticket": self.ticket, "user": self.user, "objective_id": self.objective_id, "kind": self.kind,
                "old": dict(self.old), "new": dict(self.new) if self.new is not None else None,
                "reason": self.reason, "platform": self.platform}


def active_sessions(store: AgentStore) -> list[AgentSession]:
    """Target's active sessions that run IPsec (a Native one has no suite to assess)."""
    with store.unit() as uow:
        return [s for s in uow.sessions.select(state=AgentSessionState.ACTIVE, limit=100_000)
                if s.protection == "esp"]


def assess_session(uow: UnitOfWork, session: AgentSession, *, default_table: str) -> SessionImpact:
    """Negotiate ``session`` again under its provenance, with the tables and policies as ``uow``
    sees them now (an uncommitted edit included)."""
    suite = session.suite
    old = {"suite": {k: suite.get(k) for k in _SUITE_FIELDS}, "proposals": suite.get("proposals"),
           "cost": (session.provenance or {}).get("cost")}

    def impact(kind: ImpactKind, new: Mapping[str, Any] | None, reason: str,
               rejected: tuple[str, ...] = ()) -> SessionImpact:
        return SessionImpact(session.ticket, session.user_id, session.objective_id, kind, old, new, reason, rejected,
                             session.platform)

    if session.provenance is None:
        return impact("unassessed", None, "made before qoss recorded what sessions are negotiated under: it "
                                          "follows edits from its next connect")
    inputs = session.provenance["request"]
    # A post-quantum mechanism is in no proposal string (a PPK is the conn's ppk_id): it is part of
    # the running suite all the same.
    mechanism = suite.get("post_quantum")
    verdict = judge(dict(suite.get("proposals") or {}), lambda pinned: negotiate_session(
        uow=uow, inputs=inputs, default_table=default_table, check=True,
        pinned=[*pinned, mechanism] if pinned is not None and mechanism else pinned))
    platform = session.platform
    if verdict.kind == "noncompliant" and platform is not None and platform in PLATFORMS:
        # A device whose platform has no post-quantum setting cannot follow an edit that asks for one.
        cannot = post_quantum_refusal(platform, _post_quantum_minimum(uow, inputs))
        if cannot is not None:
            return impact("noncompliant", None, f"its platform cannot follow: {cannot}", verdict.rejected)
    return impact(verdict.kind, verdict.new, verdict.reason, verdict.rejected)


def _post_quantum_minimum(uow: UnitOfWork, inputs: Mapping[str, Any]) -> int:
    """The post-quantum minimum a session's negotiation asks for now: the client's own, and its
    Target's and platform's stored policies' as ``uow`` sees them (an uncommitted edit included)."""
    levels = [int((inputs.get("min_levels") or {}).get("post_quantum", 0))]
    names = [inputs.get("policy"), platform_policy(inputs["platform"]) if inputs.get("platform") else None]
    for name in filter(None, names):
        try:
            levels.append(uow.policies.get(name)[0].min_levels.post_quantum)
        except QossError:  # a policy deleted since: the negotiation says what that means
            continue
    return max(levels)


def assess_sessions(uow: UnitOfWork, sessions: Iterable[AgentSession], *, default_table: str) -> list[SessionImpact]:
    """:func:`assess_session` for each of ``sessions``, in one unit of work."""
    return [assess_session(uow, s, default_table=default_table) for s in sessions]


# --------------------------------------------------------------------------- after an edit


def _proposal(suite: Mapping[str, Any] | None) -> str:
    proposals = (suite or {}).get("proposals") or {}
    return str(proposals.get("esp") or proposals.get("ah") or "nothing")


def close_reason(impact: SessionImpact, cause: str) -> str:
    """Why Target closed a session (at most 200 characters, always ending in what to do)."""
    what = (", ".join(impact.rejected) or _proposal(impact.old))[:80]
    again = "its profile is stale: enrol the device again" if impact.platform else "connect again"
    tail = f" puts {what} below objective {impact.objective_id}'s minimums: {again}"
    return f"{cause[:200 - len(tail)]}{tail}"


class SessionFollower:
    """Reads the event log of Target's database for edits of rating tables and policies and
    closes the sessions they leave below their minimums, with the reason (see the module).

    Args:
        store: Target's sessions.
        units: Target's database (rating tables, policies, the event log, the audit log).
        finish: ends one session (ticket, state, reason) in the store and in charon; None if it
            was no longer active.
        concurrency: sessions closed at once.
    """

    def __init__(self, *, store: AgentStore, units: UnitOfWorkFactory,
                 finish: Callable[[str, AgentSessionState, str], AgentSession | None], default_table: str,
                 concurrency: int = 8) -> None:
        self._store, self._units, self._finish = store, units, finish
        self._default_table = default_table
        self._concurrency = concurrency
        self._last: int | None = None

    def follow(self) -> list[str]:
        """Look at the edits made since the last look (the first look only notes where the log
        is) and act on them; the tickets closed."""
        with self._units() as uow:
            if self._last is None:
                self._last = uow.events.last_id()
                return []
            events, self._last = kinds_after(uow, self._last, _EDITS)
        causes = [f"{_EDITS[e['kind']]} {e['subject']}" + (f" revision {e['data']['revision']}"
                                                           if e["data"].get("revision") else " deleted")
                  for e in events]
        if not causes:
            return []
        return self.run_once("; ".join(dict.fromkeys(causes)))

    def run_once(self, cause: str) -> list[str]:
        """Assess every active session and close the noncompliant ones (``concurrency`` at once;
        one's failure never stops the others); the tickets closed."""
        sessions = active_sessions(self._store)
        if not sessions:
            return []
        with self._units() as uow:
            impacts = assess_sessions(uow, sessions, default_table=self._default_table)
        todo = [i for i in impacts if i.kind == "noncompliant"]
        with ThreadPoolExecutor(max_workers=self._concurrency, thread_name_prefix="qoss-agent-close") as pool:
            closed = list(pool.map(lambda i: self._close(i, cause), todo))
        return [i.ticket for i, done in zip(todo, closed, strict=True) if done]

    def _close(self, impact: SessionImpact, cause: str) -> bool:
        reason = close_reason(impact, cause)
        try:
            if self._finish(impact.ticket, AgentSessionState.CLOSED, reason) is None:
                return False  # ended meanwhile, or closed by another process
            detail = (f"closed: {reason}; was {_proposal(impact.old)}, a new connect gets "
                      f"{_proposal(impact.new)}")
            with self._units() as uow:
                uow.events.append("agent.session.closed", impact.ticket, {
                    "user": impact.user, "objective_id": impact.objective_id, "cause": cause, "reason": reason,
                    "old": dict(impact.old), "new": dict(impact.new) if impact.new is not None else None},
                    scope="tunnels:read")
                uow.audit.append(request_id=f"rekey-{secrets.token_hex(6)}", token_id=None, token_name=None,
                                 scopes=[], source="local", action="DELETE",
                                 object=f"/v1/agent/sessions/{impact.ticket}", outcome=200, detail=detail[:200])
                uow.commit()
        except Exception as exc:  # one session's failure never stops the others
            why = exc.message if isinstance(exc, QossError) else f"{type(exc).__name__}: {exc}"
            log.warning("agent session %s (below its minimums after %s) not closed: %s", impact.ticket, cause, why)
            return False
        log.info("agent session %s of %s closed: %s", impact.ticket, impact.user, reason)
        return True
