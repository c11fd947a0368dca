"""A one-time link's profile is sealed by its client: Host keeps and serves only what it can neither
read nor change undetected (no ``remote.addr``, no gateway address), refuses a profile in clear or
one whose sealed line names another file, and what it serves opens, byte for byte, with the key in
the link's fragment; a changed bit does not open."""

from __future__ import annotations

import secrets
import time

import pytest
from cryptography.exceptions import InvalidTag

from app.adapters.agent.crypto import KeyPair, seal
from app.adapters.db.agent_rows import AgentHandoffRow
from app.adapters.db.engine import make_engine, make_session_factory
from app.domain.agent import Handoff, Kind
from app.services.agent.client_devices import seal_profile
from tests.api.test_agent_roles import enroll
from tests.api.test_handoff_revoked import Roles, roles, waiting
from tests.fixtures.agent_roles import SERVER_ID
from tests.fixtures.handoff import open_sealed_profile

__all__ = ["roles"]  # Host and Target with an administrator's client, shared

pytestmark = pytest.mark.anyio

GATEWAY = "10.99.0.3"
PROFILE = (b'{"uuid":"5c1e","name":"hq","type":"ikev2-cert","remote":{"addr":"' + GATEWAY.encode()
           + b'","id":"hq.qoss","cert":"MIIB"},"local":{"id":"CN=dev","p12":"MIIC"}}')
SSWAN = "application/vnd.strongswan.profile"


def handoff_of(user: KeyPair, server: KeyPair, profile: bytes, *, name: str = "hq.sswan") -> dict[str, str]:
    handoff = Handoff(user_id=user.name, host=SERVER_ID, nonce=secrets.token_bytes(16), timestamp=int(time.time()),
                      profile_name=name, media_type=SSWAN, profile=profile, ttl=600)
    wire = seal(kind=Kind.HANDOFF, to=SERVER_ID, body=handoff.body(), signer=user, recipient=server.public.kem)
    return {"message": wire.decode("ascii")}


def stored(database_url: str) -> list[bytes]:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            return [bytes(row.profile) for row in s.query(AgentHandoffRow)]
    finally:
        engine.dispose()


async def test_a_profile_in_clear_is_refused_and_nothing_is_kept(roles: Roles) -> None:
    c, server, settings = roles
    alice = await enroll(c, "alice")
    r = await c.post("/v1/agent/handoffs", json=handoff_of(alice, server, PROFILE))
    assert (r.status_code, r.json()["error"]) == (422, "InvalidInput"), r.text
    assert "sealed" in r.json()["detail"]
    assert waiting(settings.database_url) == 0


async def test_a_sealed_line_naming_another_file_is_refused(roles: Roles) -> None:
    c, server, settings = roles
    bob = await enroll(c, "bob")
    key = secrets.token_bytes(32)
    other = seal_profile(key, media_type=SSWAN, name="other.sswan", profile=PROFILE)
    r = await c.post("/v1/agent/handoffs", json=handoff_of(bob, server, other))
    assert (r.status_code, r.json()["error"]) == (422, "InvalidInput"), r.text
    assert waiting(settings.database_url) == 0


async def test_host_keeps_and_serves_only_what_it_cannot_read_and_it_opens_whole_with_the_links_key(
        roles: Roles) -> None:
    c, server, settings = roles
    carol = await enroll(c, "carol")
    key = secrets.token_bytes(32)
    r = await c.post("/v1/agent/handoffs", json=handoff_of(
        carol, server, seal_profile(key, media_type=SSWAN, name="hq.sswan", profile=PROFILE)))
    assert r.status_code == 200, r.text
    (kept,) = stored(settings.database_url)
    for text in (b"remote", b"addr", GATEWAY.encode(), b"hq.qoss", b"CN=dev", b"ikev2-cert"):
        assert text not in kept
    got = await c.get(r.json()["message"])
    assert got.status_code == 200
    assert got.content == kept
    assert got.headers["content-type"] == "application/octet-stream"
    assert open_sealed_profile(key, got.content) == PROFILE  # byte for byte
    with pytest.raises(InvalidTag):
        open_sealed_profile(secrets.token_bytes(32), got.content)  # another key


@pytest.mark.parametrize("where", ["line", "nonce", "ciphertext", "tag"])
def test_a_sealed_profile_changed_anywhere_does_not_open(where: str) -> None:
    key = secrets.token_bytes(32)
    sealed = bytearray(seal_profile(key, media_type=SSWAN, name="hq.sswan", profile=PROFILE))
    line = sealed.index(b"\n") + 1
    at = {"line": line - 6, "nonce": line + 3, "ciphertext": line + 12 + 20, "tag": len(sealed) - 1}[where]
    sealed[at] ^= 0x01
    with pytest.raises(InvalidTag):
        open_sealed_profile(key, bytes(sealed))

