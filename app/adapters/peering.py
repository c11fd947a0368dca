"""Peering's edges: a peer's API over HTTP (kept-alive connections, bounded timeouts, every
transport failure an error naming the peer), and this side's peering keys."""

from __future__ import annotations

import threading

import httptools
import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from app.adapters.agent.crypto import KeyPair
from app.adapters.agent.transport import RemoteRefused, plain_post
from app.domain.errors import PeerTimeout, PeerUnreachable
from app.domain.ports import UnitOfWork

__all__ = ["HttpPeerLink", "peering_keys"]

#: The server keys (``server_keys``) this side's peering key pair is kept under.
_SIGN_KEY, _KEM_KEY, _MLKEM_KEY = "peering-sign", "peering-kem", "peering-mlkem768"


def peering_keys(uow: UnitOfWork, name: str) -> KeyPair:
    """This side's peering key pair, named ``name``: Ed25519, X25519 and ML-KEM-768 (its 64-byte
    seed), each made by the first caller and kept in the database's server keys, so every replica
    signs and opens alike; never sent anywhere. A database whose peering keys predate ML-KEM keys
    gains one beside them (give the peer the identity again: it now has ``mlkem_public_key``)."""
    sign = uow.server_keys.get_or_create(_SIGN_KEY, lambda: Ed25519PrivateKey.generate().private_bytes_raw().hex())
    kem = uow.server_keys.get_or_create(_KEM_KEY, lambda: X25519PrivateKey.generate().private_bytes_raw().hex())
    mlkem = uow.server_keys.get_or_create(_MLKEM_KEY,
                                          lambda: MLKEM768PrivateKey.generate().private_bytes_raw().hex())
    return KeyPair(name, Ed25519PrivateKey.from_private_bytes(bytes.fromhex(sign)),
                   X25519PrivateKey.from_private_bytes(bytes.fromhex(kem)),
                   MLKEM768PrivateKey.from_seed_bytes(bytes.fromhex(mlkem)))

#: The largest answer read from a peer (a sealed message is a few kilobytes).
_MAX_ANSWER = 256 * 1024


class HttpPeerLink:
    """Posts sealed messages to peers' ``/v1/peering/messages``.

    Args:
        client: the httpx client to send with (else one shared by this link, made on first use).
        plain: a plain ``http://`` peer is reached over kept-alive connections written and read
            directly (:func:`app.adapters.agent.transport.plain_post`, as the agent's messages go:
            a fraction of httpx's work per message); the ``fast_paths`` setting. Else, and for
            ``https://`` or a proxy from the environment, httpx.
    """

    def __init__(self, client: httpx.Client | None = None, *, plain: bool = False) -> None:
        self._client = client
        self._plain = plain and client is None
        self._lock = threading.Lock()

    def _shared(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(limits=httpx.Limits(max_connections=64), follow_redirects=False)
            return self._client

    def post(self, peer: str, url: str, data: bytes, timeout: float) -> tuple[int, bytes]:
        """POST ``data`` to ``url``; (status, body).

        Raises:
            PeerTimeout: no answer within ``timeout`` seconds (connecting, sending or reading).
            PeerUnreachable: the connection failed, or the answer was too large.
        """
        if self._plain:
            try:
                answer = plain_post(url, data, timeout)
            except TimeoutError as exc:
                raise PeerTimeout(peer, f"no answer from {url} within {timeout:g} s") from exc
            except RemoteRefused as exc:
                raise PeerUnreachable(peer, "answered with more than a message") from exc
            except (OSError, httptools.HttpParserError) as exc:
                raise PeerUnreachable(peer, f"{url} does not answer ({type(exc).__name__})") from exc
            if answer is not None:
                status, body = answer
                if len(body) > _MAX_ANSWER:
                    raise PeerUnreachable(peer, "answered with more than a message")
                return status, body
        try:
            with self._shared().stream("POST", url, content=data, timeout=timeout,
                                       headers={"content-type": "application/json"}) as answer_stream:
                body = b""
                for chunk in answer_stream.iter_bytes():
                    body += chunk
                    if len(body) > _MAX_ANSWER:
                        raise PeerUnreachable(peer, "answered with more than a message")
                return answer_stream.status_code, body
        except httpx.TimeoutException as exc:
            raise PeerTimeout(peer, f"no answer from {url} within {timeout:g} s") from exc
        except httpx.HTTPError as exc:
            raise PeerUnreachable(peer, f"{url} does not answer ({type(exc).__name__})") from exc

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
