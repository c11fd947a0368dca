"""The tunnel agent over HTTP: Host (client requests, enrolment) and Target (endorsed requests).

Which routes answer depends on the roles this process plays (``QOSS_AGENT_CONFIG``); the
others answer 404. Client and Host-to-Target messages authenticate themselves (signed and
sealed), so those routes take no bearer token; they are rate limited per source address
before anything else, and Host limits each verified user as well
(``agent_user_rate``/``agent_user_burst``). Every rejection is the same 403 with the same
text; the audit log records the reason, the first of each kind from a source on its own and
the rest counted (:func:`refused_in_bulk`, :func:`refusal_kind`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from app.domain.agent import AgentSessionState
from app.domain.agent.ports import WaitingHandoff
from app.domain.errors import InvalidInput, NotFound
from app.domain.ports import error_label
from app.domain.ratelimit import RateLimited
from app.services.agent.host import HostAgent, link_id
from app.services.agent.invitations import (
    INVITATION_DEFAULT_TTL,
    INVITATION_MAX_TTL,
    InvitationRefused,
    invitation_link_id,
    join_link,
)
from app.services.agent.target import Outcome, TargetAgent
from app.web.deps import Principal, UserIdPath, in_worker_thread, require
from app.web.routing import QossRoute
from app.web.runtime import Runtime, runtime
from app.web.schemas import EnrollIn, MessageIn, MessageOut, error_responses

__all__ = [
    "MESSAGE_PATHS",
    "InvitationIn",
    "RedeemIn",
    "answer_body",
    "handle_message",
    "refusal_kind",
    "refused_in_bulk",
    "router",
]

router = APIRouter(tags=["agent"], route_class=QossRoute)

UserId = UserIdPath


_MESSAGE_ERRORS: dict[int | str, dict[str, Any]] = {
    200: {"model": MessageOut}, **error_responses(403, 404, 409, 422, 429, 502, 503),
}


#: What an accepted message's audit detail starts with: the ``kind`` label of ``qoss_agent_joins_total``.
_KINDS = frozenset({"connect", "disconnect", "revoke", "device", "revoke-device", "devices", "admin-devices",
                    "admin-revoke-device"})

#: The message routes (path -> what answers), for :func:`handle_message` and the app's fast path.
MESSAGE_PATHS = {
    "/v1/agent/requests": "host",
    "/v1/agent/target/requests": "target",
    "/v1/agent/target/revocations": "revocation",
}


def _host(parts: Runtime) -> HostAgent:
    host = parts.agent_host
    if host is None:
        raise NotFound("this server does not play the agent's Host role")
    return host


def _target(parts: Runtime) -> TargetAgent:
    target = parts.agent_target
    if target is None:
        raise NotFound("this server does not play the agent's Target role")
    return target


async def handle_message(state: Runtime, path: str, data: bytes, source: str, note: Callable[[str], None],
                         record: Callable[[Outcome], None] | None = None) -> Outcome:
    """One sealed message to the route at ``path`` (:data:`MESSAGE_PATHS`): the outcome to answer.

    ``record``: called with the outcome in the worker thread that answered the message, right
    after it (the answer's audit record, written there rather than in a thread of its own).

    The per-address limit comes first; Host then limits each verified user (``note`` gets the
    audit detail of that refusal). Shared by the routes below and the app's fast path
    (:mod:`app.api.agent_fast`), so both answer alike. Accepted messages are counted by role
    and kind (``qoss_agent_joins_total``), refused ones by role and the error's name
    (``qoss_agent_refusals_total``).

    Raises:
        NotFound: this server does not play the role. RateLimited, AgentRejected and the
        handlers' other errors.
    """
    role = MESSAGE_PATHS[path]
    metrics = state.metrics
    try:
        outcome = await _handle(state, role, data, source, note, record)
    except Exception as exc:
        metrics.count("qoss_agent_refusals_total", role=role, reason=error_label(exc))
        raise
    kind = outcome.audit.removeprefix("relayed ").split(" ", 1)[0]
    metrics.count("qoss_agent_joins_total", role=role, kind=kind if kind in _KINDS else "other")
    return outcome


async def _handle(state: Runtime, role: str, data: bytes, source: str, note: Callable[[str], None],
                  record: Callable[[Outcome], None] | None) -> Outcome:
    # In the worker thread with the message: on PostgreSQL a limit asks the database. The
    # address is limited before anything else, even where this server does not play the role.
    limit_address = partial(state.agent_limiter.take, f"agent:{source}", who="this address")
    if (state.agent_host if role == "host" else state.agent_target) is None:
        await in_worker_thread(limit_address)
    agent: HostAgent | TargetAgent = _host(state) if role == "host" else _target(state)
    if isinstance(agent, HostAgent):
        host: HostAgent = agent
        limiter = state.agent_user_limiter

        def admit(user_id: str) -> None:
            try:
                limiter.take(f"agent-user:{user_id}", who="this user")
            except RateLimited:
                note(f"rate limited: user={user_id}")
                raise

        def relay() -> Outcome:
            limit_address()
            return _recorded(host.handle(data, admit=admit), record)
        return await in_worker_thread(relay)
    target: TargetAgent = agent

    def answer() -> Outcome:
        limit_address()
        return _recorded(target.handle(data) if role == "target" else target.revoke(data), record)
    return await in_worker_thread(answer)


def refused_in_bulk(status: int) -> bool:
    """Whether an answer to an agent message is a refusal anyone can send without end: any 4xx
    but 409 (which only a verified user's request gets: nothing met its minimums).

    Such refusals are counted with those of their kind from their source, one audit entry
    per window (:meth:`app.adapters.db.audit.Auditor.refused`, under :func:`refusal_kind`),
    on the fast path as on the full stack; an answered message, a 409 and a 5xx each have an
    entry of their own.
    """
    return 400 <= status < 500 and status != 409


_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*:?")


def refusal_kind(route: str, detail: str) -> str:
    """What a refusal of an agent message is counted under, beside its source, outcome and method:
    its route and the kind of its reason, the first words of its audit detail up to the first
    that is not a plain word (``AgentRejected: unknown user``, ``AgentRejected: replayed request``,
    ``rate limited:``, ``NotFound``). A flood of one reason is one entry per window; each other
    reason from that source still has its first entry of its own. The words are the code's, not
    the sender's, so the kinds are few."""
    words: list[str] = []
    for word in detail.split(" ", 3)[:3]:
        if not _WORD.fullmatch(word):
            break
        words.append(word)
    return f"{route} {' '.join(words)}"


def _recorded(outcome: Outcome, record: Callable[[Outcome], None] | None) -> Outcome:
    if record is not None:
        record(outcome)
    return outcome


def answer_body(outcome: Outcome) -> bytes:
    """The answer as :class:`MessageOut`'s JSON, encoded once (no response-model validation: the
    sealed message is ASCII that needs no escaping, checked by ``json.dumps``)."""
    return b'{"message":' + json.dumps(outcome.answer.decode("ascii")).encode("ascii") + b"}"


async def _message(path: str, body: MessageIn, request: Request) -> Response:
    def note(detail: str) -> None:
        request.state.audit_detail = detail

    source = request.client.host if request.client else "unknown"
    outcome = await handle_message(runtime(request), path, body.message.encode("utf-8"), source, note)
    request.state.audit_detail = outcome.audit
    return Response(answer_body(outcome), media_type="application/json")


@router.post("/agent/requests", response_model=None, responses=_MESSAGE_ERRORS)
async def client_request(body: MessageIn, request: Request) -> Response:
    """Host: a client's sealed request (connect or disconnect); the answer is Target's, sealed to the client.

    403 for every failed check (the same text each time), 409 when nothing meets the
    minimums, 429 (with Retry-After) when the source address or the user sends too fast,
    502/503 when Target or its charon fails.
    """
    return await _message("/v1/agent/requests", body, request)


@router.post("/agent/target/requests", response_model=None, responses=_MESSAGE_ERRORS)
async def target_request(body: MessageIn, request: Request) -> Response:
    """Target: a Host's endorsement of a client request; the answer is sealed to the client."""
    return await _message("/v1/agent/target/requests", body, request)


@router.post("/agent/target/revocations", response_model=None, responses=_MESSAGE_ERRORS)
async def target_revocation(body: MessageIn, request: Request) -> Response:
    """Target: a Host revoked a user; their tunnels come down. The answer is how many."""
    return await _message("/v1/agent/target/revocations", body, request)


#: A handoff carries a whole profile (a .mobileconfig is ~7 KB, sealed twice over in base64).
_MAX_HANDOFF = 160_000


@router.post("/agent/handoffs", response_model=None, responses={**_MESSAGE_ERRORS, **error_responses(413, 415)})
async def client_handoff(request: Request) -> Response:
    """Host: an enrolled user's device profile, sealed and signed, kept for one download; the answer's
    ``message`` is the link's path (``/v1/agent/handoffs/<secret>``), for a phone to scan.

    Only a profile that holds everything a phone needs is kept (415 for any other media type,
    :data:`~app.services.agent.host.HANDOFF_TYPES`), for at most ten minutes (422 beyond). Limited
    per source address and, once verified, per user (429, ``agent_user_rate``/``agent_user_burst``).
    """
    parts = runtime(request)
    body = await request.body()
    if len(body) > _MAX_HANDOFF:
        raise HTTPException(413, f"a handoff is at most {_MAX_HANDOFF} bytes")
    try:
        message = json.loads(body)["message"]
        if not isinstance(message, str) or not message.isascii():
            raise TypeError
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInput('the body is {"message": "<the sealed handoff>"}') from exc
    source = request.client.host if request.client else "unknown"

    def admit(user_id: str) -> None:
        try:
            parts.agent_user_limiter.take(f"agent-handoff:{user_id}", who="this user")
        except RateLimited:
            request.state.audit_detail = f"rate limited: user={user_id}"
            raise

    def keep() -> Outcome:
        parts.agent_limiter.take(f"agent:{source}", who="this address")  # before anything else
        return _host(parts).handoff(message.encode("ascii"), admit=admit)
    outcome = await in_worker_thread(keep)
    request.state.audit_detail = outcome.audit
    return Response(answer_body(outcome), media_type="application/json")


#: What a sealed profile is served with: a download, never a page of the API's origin.
_PROFILE_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
                    "Content-Security-Policy": "default-src 'none'; sandbox", "Referrer-Policy": "no-referrer"}


@router.get("/agent/handoffs/{token}", response_model=None, responses=error_responses(404, 429),
            response_class=Response)
async def fetch_handoff(token: Annotated[str, Path(min_length=1, max_length=1024)], request: Request) -> Response:
    """Host: a device's profile, once, from the link its user made (no token: the link is the secret),
    sealed as its client sealed it (``application/octet-stream``,
    :mod:`app.domain.agent.sealed_profile`): the page the link opens (``/ui/handoff``) decrypts it
    with the key in the link's fragment, which never reaches Host.

    404 for a link unknown, used, expired or made by a user revoked since; a link's failed fetches
    count as failed authentications of their address (429 once it has failed too often). Every
    fetch is audited, named by :func:`~app.services.agent.host.link_id`, never by its secret.
    """
    request.state.audit_read = True  # a fetch spends the link: recorded like a change
    parts = runtime(request)
    source = request.client.host if request.client else ""

    def take() -> WaitingHandoff | None:
        parts.auth_failures.check(source)  # before anything else
        found = parts.agent_host.take_handoff(token) if parts.agent_host is not None else None
        if found is None:
            parts.auth_failures.failed(source)
        return found
    found = await in_worker_thread(take)
    if found is None:
        _host(parts)
        raise NotFound("no such link (unknown, used or expired)")
    request.state.audit_detail = (f"handoff fetched: user={found.user_id} profile={found.profile_name} "
                                  f"link={link_id(token)}")
    return Response(found.profile, media_type="application/octet-stream", headers={
        "Content-Disposition": f'attachment; filename="{found.profile_name}.sealed"', **_PROFILE_HEADERS})


@router.get("/agent/sessions", dependencies=[Depends(require("tunnels:read"))],
            responses=error_responses(401, 403, 404))
async def target_sessions(request: Request, state: AgentSessionState | None = None,
                          limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict[str, Any]]:
    """Target: the tunnels it set up for clients, newest first."""
    target = _target(runtime(request))
    return await in_worker_thread(target.sessions, state=state, limit=limit)


@router.get("/agent/revocations", dependencies=[Depends(require("tunnels:read"))],
            responses=error_responses(401, 403, 404))
async def target_revocations(request: Request,
                             limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict[str, Any]]:
    """Target: its own revocation list (users and signing keys it refuses whatever a Host says), newest first."""
    target = _target(runtime(request))
    return await in_worker_thread(target.revocations, limit=limit)


@router.get("/agent/pool", dependencies=[Depends(require("tunnels:read"))],
            responses=error_responses(401, 403, 404))
async def target_pool(request: Request) -> dict[str, Any]:
    """Target: its virtual-IP pool (size, leased, free), the per-user device quota, and the users
    holding the most addresses, each by Host."""
    return await in_worker_thread(_target(runtime(request)).pool)


@router.post("/agent/users", status_code=201, dependencies=[Depends(require("agent:enroll"))],
             responses=error_responses(401, 403, 404, 409, 422))
async def enroll_user(body: EnrollIn, request: Request) -> dict[str, Any]:
    """Host: enrol a user's public keys and the Objective-IDs they may ask for."""
    host = _host(runtime(request))
    return await in_worker_thread(host.enroll, user_id=body.user_id, sign_public_key=body.sign_public_key,
                                   kem_public_key=body.kem_public_key, objectives=body.objectives,
                                   mlkem_public_key=body.mlkem_public_key)


@router.get("/agent/users", dependencies=[Depends(require("agent:enroll"))],
            responses=error_responses(401, 403, 404))
async def list_users(request: Request) -> list[dict[str, Any]]:
    """Host: the enrolled users (public keys only)."""
    return await in_worker_thread(_host(runtime(request)).users)


@router.delete("/agent/users/{user_id}", dependencies=[Depends(require("agent:enroll"))],
               responses=error_responses(401, 403, 404))
async def revoke_user(user_id: UserId, request: Request) -> dict[str, Any]:
    """Host: revoke a user; every target is told to take the user's tunnels down (per-target outcome)."""
    return await in_worker_thread(_host(runtime(request)).revoke, user_id)


#: A device's ticket in a path.
_Ticket = Annotated[str, Path(min_length=32, max_length=32, pattern=r"^[0-9a-f]{32}$")]


@router.get("/agent/users/{user_id}/devices", dependencies=[Depends(require("agent:enroll"))],
            responses=error_responses(401, 403, 404))
async def user_devices(user_id: UserId, request: Request) -> dict[str, Any]:
    """Host: a user's devices at every target, each with its state (``active``, ``stale`` with the
    reason, ``revoked``, ``expired``, ``ended``), as each target says; ``unanswered`` names the
    targets that could not be asked, and why."""
    return await in_worker_thread(_host(runtime(request)).user_devices, user_id)


@router.delete("/agent/users/{user_id}/devices/{ticket}", dependencies=[Depends(require("agent:enroll"))],
               responses=error_responses(401, 403, 404, 502, 503))
async def revoke_user_device(user_id: UserId, ticket: _Ticket, request: Request) -> dict[str, Any]:
    """Host: revoke one of a user's devices: its live tunnel ends at once and its certificate is
    refused from then on. 404 when no target holds it as an active device of that user."""
    request.state.audit_detail = f"revoke device user={user_id} ticket={ticket}"
    return await in_worker_thread(_host(runtime(request)).revoke_device, user_id=user_id, ticket=ticket)


# --------------------------------------------------------------------------- invitations

_ID_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"


class InvitationIn(BaseModel):
    """A one-time invitation for a user's phone: whom, which platform, how long it lives (seconds),
    optionally the Objective-IDs and minimums, and Host's address as the phone reaches it."""

    model_config = ConfigDict(extra="forbid")
    user_id: Annotated[str, Field(min_length=1, max_length=63, pattern=_ID_PATTERN)]
    platform: Annotated[str, Field(min_length=1, max_length=24, pattern=r"^[a-z]+$")]
    expires_in: Annotated[int, Field(ge=60, le=INVITATION_MAX_TTL)] = INVITATION_DEFAULT_TTL
    objectives: Annotated[list[Annotated[int, Field(ge=1, le=4)]], Field(min_length=1, max_length=4)] | None = None
    minimums: Annotated[dict[Annotated[str, Field(max_length=16)], Annotated[int, Field(ge=0, le=10)]],
                        Field(max_length=3)] | None = None
    link_base: Annotated[str, Field(max_length=200, pattern=r"^https?://[^\s#?]+$")] | None = None


class RedeemIn(BaseModel):
    """A phone redeems an invitation: ``body`` is the canonical JSON it signed with its new Ed25519
    key (``host``, ``invitation``, ``sign_public_key``, ``kem_public_key``, ``platform``, ``ts``),
    ``signature`` that signature (unpadded base64url)."""

    model_config = ConfigDict(extra="forbid")
    body: Annotated[str, Field(min_length=2, max_length=1024)]
    signature: Annotated[str, Field(min_length=86, max_length=86, pattern=r"^[A-Za-z0-9_-]+$")]


_NO_STORE = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


@router.post("/agent/invitations", status_code=201, responses=error_responses(401, 403, 404, 409, 422))
async def create_invitation(body: InvitationIn, request: Request, response: Response,
                            who: Annotated[Principal, Depends(require("agent:enroll"))]) -> dict[str, Any]:
    """Host: a one-time invitation for a user's phone. The answer carries its link once (the secret
    in the link's fragment); Host keeps only the secret's SHA-256, so nobody can read it back.

    409 when the user is enrolled with keys of their own (invite the phone under a user id of its
    own); 422 for a platform other than android, apple, windows or networkmanager, or a lifetime
    beyond 24 hours.
    """
    host = _host(runtime(request))
    secret, listed = await in_worker_thread(
        host.invitations.invite, user_id=body.user_id, platform=body.platform, ttl=body.expires_in,
        created_by=who.name or "unknown", objectives=body.objectives, minimums=body.minimums)
    request.state.audit_detail = (f"invitation id={listed['id']} user={body.user_id} platform={body.platform} "
                                  f"ttl={body.expires_in} link={invitation_link_id(secret)}")
    response.headers.update(_NO_STORE)
    base = body.link_base or str(request.base_url)
    return {"link": join_link(base, secret), "expires_at": listed["expires_at"], "id": listed["id"],
            "user_id": listed["user_id"], "platform": listed["platform"]}


@router.get("/agent/invitations", dependencies=[Depends(require("agent:enroll"))],
            responses=error_responses(401, 403, 404))
async def list_invitations(request: Request, user_id: Annotated[str | None, Query(max_length=63)] = None,
                           limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[dict[str, Any]]:
    """Host: the invitations, newest first, with their state (``waiting``, ``used``, ``expired``,
    ``revoked``). No secret: Host keeps none."""
    host = _host(runtime(request))
    return await in_worker_thread(host.invitations.list, user_id=user_id, limit=limit)


@router.delete("/agent/invitations/{invitation_id}", dependencies=[Depends(require("agent:enroll"))],
               responses=error_responses(401, 403, 404, 409))
async def revoke_invitation(invitation_id: Annotated[str, Path(min_length=1, max_length=32,
                                                                pattern=r"^[0-9a-f]+$")],
                            request: Request) -> dict[str, Any]:
    """Host: revoke an invitation nobody redeemed yet (409 if it was used or revoked already)."""
    host = _host(runtime(request))
    return await in_worker_thread(host.invitations.revoke, invitation_id)


@router.post("/agent/invitations/redeem", responses=error_responses(403, 404, 409, 422, 429))
async def redeem_invitation(body: RedeemIn, request: Request, response: Response) -> dict[str, Any]:
    """Host: a phone redeems an invitation with the keys it just made (no token: the invitation's
    secret is the credential, and the body is signed by the new Ed25519 key).

    Host spends the invitation, enrols the keys for the invitation's user and grants them one
    device enrolment of its platform, in one transaction. 404 for an invitation unknown, used,
    expired or revoked (the detail says which), each a failed authentication of the address
    (429 once it has failed too often); 403 for a signature that is not the keys', a body for
    another Host or not fresh; 409 for another platform than the invitation's, or a user enrolled
    with other keys. Limited per address as the agent's messages are.
    """
    parts = runtime(request)
    source = request.client.host if request.client else ""
    request.state.audit_read = True  # a redemption spends the invitation: recorded like a change

    def redeem() -> dict[str, Any]:
        parts.auth_failures.check(source)  # before anything else
        parts.agent_limiter.take(f"agent:{source}", who="this address")
        host = _host(parts)
        try:
            redeemed = host.invitations.redeem(body.body.encode("utf-8"), body.signature)
        except InvitationRefused as exc:
            parts.auth_failures.failed(source)
            request.state.audit_detail = f"invitation refused: {exc.state}"
            raise
        request.state.audit_detail = redeemed.audit
        return {**redeemed.as_dict(), "host": host.published()}
    response.headers.update(_NO_STORE)
    return await in_worker_thread(redeem)
