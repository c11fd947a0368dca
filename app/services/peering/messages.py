"""Peers' messages on the wire: signed and sealed as the tunnel agent's are, sent over HTTP.

A message is a canonical JSON document (``app.domain.peering``), signed with this side's
Ed25519 key and sealed (HPKE) to the peer: hybrid to its ML-KEM-768 and X25519 keys when it
registered an ML-KEM-768 key (X-Wing, as the tunnel agent's messages), else to its X25519 key
alone; its answer comes back the same way, sealed to the sender. A message that carries a
post-quantum preshared key is only ever sealed hybrid. Receiving, a message is opened, its sender looked up among the
registered peers, its signature checked with that peer's key, its time checked against the
freshness window and its nonce against every nonce seen within it (a replay is refused).
Sending, a :class:`Messenger` seals a message to its peer, posts it and opens and checks the
answer; a peer's refusal comes back as an error that names the peer.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from app.domain.agent import AgentRejected, Kind, canonical
from app.domain.agent.ports import AgentCrypto, AgentKeys
from app.domain.errors import InvalidInput, NotFound, PeerError, PeerNoFeasibleSuite, PeerRefused, PeerUnreachable
from app.domain.peering import FRESHNESS, Peer, Teardown
from app.domain.ports import UnitOfWork
from app.services.peering.config import PeeringConfig

__all__ = ["Messenger", "PeerKeysSource", "PeerLink", "Received", "first_sight", "new_nonce", "open_message", "refusal",
           "seal_message"]

log = logging.getLogger("qoss.peering")

#: The largest answer read from a peer.
MAX_ANSWER = 64 * 1024


class PeerLink(Protocol):
    """How a message reaches a peer: ``post(url, data, timeout)`` -> (status, body).

    Raises:
        PeerUnreachable: no answer (PeerTimeout: none in time).
    """

    def post(self, peer: str, url: str, data: bytes, timeout: float) -> tuple[int, bytes]: ...


#: This side's peering key pair, named as given, read (or made, the first time) through a unit of work.
PeerKeysSource = Callable[[UnitOfWork, str], AgentKeys]


def new_nonce() -> str:
    return secrets.token_urlsafe(18)


def seal_message(keys: AgentKeys, peer: Peer, kind: Kind, document: dict[str, Any], *,
                 post_quantum: bool = False) -> bytes:
    """``document`` signed by ``keys`` and sealed to ``peer``: the wire bytes.

    Raises:
        NoPostQuantumKey: ``post_quantum`` (``document`` carries a post-quantum preshared key) and
            the peer registered no ML-KEM-768 key.
    """
    return keys.seal(kind=kind, to=peer.name, body=canonical(document), recipient=peer.kem_key,
                     recipient_mlkem=peer.mlkem_key, post_quantum=post_quantum)


class Received:
    """A message opened and checked: its kind, its document and its sender."""

    __slots__ = ("document", "kind", "peer")

    def __init__(self, kind: Kind, document: dict[str, Any], peer: Peer) -> None:
        self.kind, self.document, self.peer = kind, document, peer


def open_message(data: bytes, *, keys: AgentKeys, crypto: AgentCrypto, kinds: Sequence[Kind],
                 find: Callable[[str], Peer], sender: str | None = None, now: float | None = None,
                 hybrid_only: bool = False) -> Received:
    """Open ``data`` with ``keys``, find its sender (``find``: a registered peer by name; with
    ``sender``, it must be that one) and check its signature and time. The nonce is the
    caller's to check (:func:`first_sight`), in the transaction that acts on the message.
    ``hybrid_only``: the message is expected to carry a post-quantum preshared key, and one
    sealed with X25519 alone is refused.

    Raises:
        AgentRejected: malformed, not for this side, sealed with X25519 alone where
            ``hybrid_only``, unknown sender, bad signature, not fresh.
    """
    kind, body, tag = keys.open_sealed(data, kinds=kinds, hybrid_only=hybrid_only)
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise AgentRejected("not a JSON document") from exc
    name = document.get("sender") if isinstance(document, dict) else None
    if not isinstance(name, str) or (sender is not None and name != sender):
        raise AgentRejected("not from the expected peer")
    try:
        peer = find(name)
    except NotFound as exc:
        raise AgentRejected("not from a registered peer") from exc
    crypto.verify(peer.sign_key, kind, body, tag)
    stamp = document.get("timestamp")
    clock = time.time() if now is None else now
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool) or abs(clock - float(stamp)) > FRESHNESS:
        raise AgentRejected("not fresh")
    return Received(kind, document, peer)


def first_sight(uow: UnitOfWork, received: Received) -> None:
    """Record the message's nonce (in ``uow``'s transaction).

    Raises:
        AgentRejected: seen before (a replay).
        InvalidInput: no nonce.
    """
    nonce = received.document.get("nonce")
    if not isinstance(nonce, str) or not 16 <= len(nonce) <= 64:
        raise InvalidInput("a message carries a nonce")
    keep = datetime.now(UTC) + timedelta(seconds=2 * FRESHNESS)
    if not uow.peers.first_sight(received.peer.name, nonce, keep_until=keep):
        raise AgentRejected("a replayed message")


def refusal(peer: str, status: int, body: bytes) -> PeerRefused:
    """What a peer's error answer says, as an error naming the peer (its own words, shortened)."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, AttributeError):
        detail = None
    said = detail if isinstance(detail, str) else f"HTTP {status}"
    return PeerRefused(peer, f"refused ({status}): {said[:300]}", status=status)


class Messenger:
    """This side's messages to its peers: each one sealed and posted, its answer opened and checked.

    Args:
        config: this service's name as its peers know it (the sender of what it sends) and the seconds
            one message may take to be answered.
        link: how a message reaches a peer.
        keys: this side's peering keys (read once, made on first use).
        crypto: checks the answers' signatures.
        clock: the time, in seconds since the epoch.
    """

    def __init__(self, *, config: PeeringConfig, link: PeerLink, keys: Callable[[], AgentKeys], crypto: AgentCrypto,
                 clock: Callable[[], float]) -> None:
        self._config = config
        self._link = link
        self._keys = keys
        self._crypto = crypto
        self._clock = clock

    def ask(self, peer: Peer, kind: Kind, document: dict[str, Any], expect: Kind, *,
            hybrid_only: bool = False) -> Received:
        """Send ``document`` to ``peer``; its answer, opened and checked (``hybrid_only``: an answer
        sealed with X25519 alone is refused, as one that carries a post-quantum preshared key must be).

        Raises:
            PeerUnreachable, PeerTimeout, PeerRefused, PeerNoFeasibleSuite.
        """
        keys = self._keys()
        status, body = self._link.post(peer.name, f"{peer.url.rstrip('/')}/v1/peering/messages",
                                       seal_message(keys, peer, kind, document), self._config.timeout)
        if status == 409:
            raise PeerNoFeasibleSuite(peer.name, "none of the suites this side offered meets its requirements")
        if status != 200:
            raise refusal(peer.name, status, body)
        if len(body) > MAX_ANSWER:
            raise PeerRefused(peer.name, "answered with more than a message")
        try:
            return open_message(body, keys=keys, crypto=self._crypto, kinds=(expect,), find=lambda _: peer,
                                sender=peer.name, now=self._clock(), hybrid_only=hybrid_only)
        except AgentRejected as exc:
            raise PeerRefused(peer.name, f"its answer does not check out ({exc.message})") from exc

    def tell(self, peer: Peer, tunnel_id: str, reason: str) -> bool:
        """Tell ``peer`` to take its end of ``tunnel_id`` down (a fresh message); whether it heard:
        it acknowledged, or refused it as a peer does (a 4xx: it has no such tunnel with this
        side, or no longer takes this side's messages; logged). False: no answer, or one that
        says to try later (429, or a 5xx, as a proxy in front of a peer that is down answers)."""
        message = Teardown(tunnel_id=tunnel_id, sender=self._config.name, timestamp=self._clock(), nonce=new_nonce(),
                           reason=reason[:200])
        try:
            self.ask(peer, Kind.PEER_TEARDOWN, message.as_dict(), Kind.PEER_ACK)
        except (PeerError, NotFound) as exc:
            later = isinstance(exc, PeerRefused) and (exc.status is None or exc.status == 429 or exc.status >= 500)
            if isinstance(exc, PeerUnreachable) or later:
                log.warning("tunnel %s: peer %s did not hear its end is to be taken down: %s", tunnel_id, peer.name,
                            exc)
                return False
            log.info("tunnel %s: peer %s was told to take its end down: %s", tunnel_id, peer.name, exc)
        return True
