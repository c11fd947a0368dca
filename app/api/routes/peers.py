"""Peers: other qoss services this one negotiates tunnels with (``QOSS_PEER_NAME`` set).

An administrator reads this side's identity (``GET /v1/peering/identity``), gives it to the
other side's administrator out of band, and registers the other side (``POST /v1/peers``) with
its identity, the gateways and networks of this side it may ask for, and the minimum levels
this side demands of any tunnel with it. Peers talk to each other on ``POST
/v1/peering/messages``: anonymous at the HTTP level, every message signed and sealed, from a
registered peer only, fresh and never replayed.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from app.api.routes.agent import refusal_kind as agent_refusal_kind
from app.domain.errors import InvalidInput, NotFound
from app.domain.peering import PeerState
from app.domain.ports import UnitOfWork
from app.domain.ratelimit import RateLimited
from app.services.peering import Peering
from app.web.deps import UnitDep, in_unit, in_worker_thread, reader, require
from app.web.peering import PeerIn, PeerStateIn, peer_out
from app.web.routing import QossRoute
from app.web.runtime import runtime
from app.web.schemas import Name, error_responses

__all__ = ["MAX_MESSAGE", "answer_message", "refusal_kind", "router"]

router = APIRouter(tags=["peers"], route_class=QossRoute)
_WRITE = [Depends(require("peers:write"))]
_READ = [Depends(reader)]
_ERRORS = error_responses(404, 409, 422)
#: The largest message a peer may send.
MAX_MESSAGE = 64 * 1024
#: The audit detail of a message refused for its sender's rate, before the sender's name.
_RATE_LIMITED = "rate limited: peer="


def _peering(request: Request) -> Peering:
    peering = runtime(request).peering
    if peering is None:
        raise NotFound("this service has no peers: set QOSS_PEER_NAME to take part in peering")
    return peering


@router.get("/peering/identity", dependencies=_WRITE, responses=_ERRORS)
async def identity(request: Request) -> dict[str, str]:
    """This side's name and public keys: what the other side's administrator registers."""
    return await in_worker_thread(_peering(request).identity)


@router.post("/peers", dependencies=_WRITE, status_code=201, responses=_ERRORS)
def register_peer(body: PeerIn, request: Request, uow: UnitDep) -> dict[str, Any]:
    """Register a peer (both sides register each other). Its gateways must be this side's."""
    peering = _peering(request)
    return peer_out(peering.register(uow=uow, peer=body.to_peer()))


@router.get("/peers", dependencies=_READ, responses=_ERRORS)
def list_peers(request: Request, uow: UnitDep) -> list[dict[str, Any]]:
    """Every registered peer."""
    _peering(request)
    unheard = uow.peers.unheard_counts()
    return [peer_out(p, unheard) for p in uow.peers.list()]


@router.get("/peers/{name}", dependencies=_READ, responses=_ERRORS)
def get_peer(name: Name, request: Request, uow: UnitDep) -> dict[str, Any]:
    """One peer."""
    _peering(request)
    return peer_out(uow.peers.get(name), uow.peers.unheard_counts())


@router.patch("/peers/{name}", dependencies=_WRITE, responses=_ERRORS)
def set_peer_state(name: Name, body: PeerStateIn, request: Request, uow: UnitDep) -> dict[str, Any]:
    """Suspend (no new tunnels; running ones stay), resume, or revoke (every tunnel it carries
    ends, on both sides) a peering."""
    peer = _peering(request).set_state(uow=uow, name=name, state=PeerState(body.state))
    return peer_out(peer, uow.peers.unheard_counts())


@router.post("/peering/messages", responses=error_responses(403, 404, 409, 413, 422, 429))
async def peer_message(request: Request) -> Response:
    """A peer's signed and sealed message; the answer is sealed to it. Anonymous at the HTTP level:
    the message itself says who sent it, and only a registered peer's is acted on."""
    _peering(request)
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_MESSAGE):
        raise InvalidInput(f"a peer's message is at most {MAX_MESSAGE} bytes")
    data = b""
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_MESSAGE:
            raise InvalidInput(f"a peer's message is at most {MAX_MESSAGE} bytes")
    return Response(await answer_message(request, data), media_type="application/json")


async def answer_message(request: Request, data: bytes) -> bytes:
    """A peer's message's work, for this route and its fast path (:mod:`app.api.peering_fast`): the
    source's rate, then the message acted on in one worker thread with the request's units of work
    (:func:`in_unit`: a confirm's change and the request's audit record in one commit), its
    sender held to its own rate once the message shows who sent it (``peer_rate``/``peer_burst``;
    a refusal's audit detail names the peer, :func:`refusal_kind` counts each peer's apart)."""
    peering = _peering(request)
    parts = runtime(request)
    source = request.client.host if request.client else "unknown"

    def admit(peer: str) -> None:
        try:
            parts.peer_limiter.take(peer, who="this peer")
        except RateLimited:
            request.state.audit_detail = f"{_RATE_LIMITED}{peer}"
            raise

    def act(uow: UnitOfWork, reads: UnitOfWork) -> bytes:
        # In the worker thread: on PostgreSQL the limits ask the database.
        parts.agent_limiter.take(f"peer:{source}", who="this address")
        return peering.receive(data, uow=uow, reads=reads, admit=admit)
    return await in_unit(request, act)


def refusal_kind(route: str, detail: str) -> str:
    """What a refusal of a peer's message is counted under: a peer held to its rate under its own
    name (``rate limited: peer=site-a``: registered peers only, so the kinds stay few), so that
    one peer's flood is one entry per window and another peer's refusals behind the same address
    have their own; any other refusal as the agent's are (:func:`app.api.routes.agent.refusal_kind`).
    Which refusals are counted so is the agent's rule too (:func:`app.api.routes.agent.refused_in_bulk`:
    any 4xx but 409, which only a registered peer's offer or move gets)."""
    if detail.startswith(_RATE_LIMITED):
        return f"{route} {detail[:120]}"
    return agent_refusal_kind(route, detail)

