"""One-time invitations at Host: an administrator invites a user's phone; the phone redeems the
invitation with keys it made itself, signed by the new key; Host enrols them and grants one device
enrolment of the invitation's platform. The secret is answered once and kept nowhere (only its
SHA-256), never in a listing or the audit; a guessed, used, expired or revoked invitation is
refused and counts as a failed authentication of its address; a redemption whose signature is not
the keys' spends nothing."""

from __future__ import annotations

import hashlib
import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select, update

from app.adapters.agent.crypto import KeyPair, seal
from app.adapters.db.agent_rows import AgentInvitationRow, AgentUserRow
from app.adapters.db.engine import make_engine, make_session_factory
from app.domain.agent import ClientRequest, Kind, RequestInfo, b64e, canonical
from app.main import create_app
from app.settings import Settings
from tests.api.conftest import make_token
from tests.api.test_handoff_revoked import Roles, everything_recorded, roles
from tests.fixtures.agent_roles import SERVER_ID, agent_server_config, register_keys

__all__ = ["roles"]  # Host and Target with an administrator's client, shared

pytestmark = pytest.mark.anyio


async def invite(c: httpx.AsyncClient, user: str, platform: str = "android", **more: object) -> tuple[str, str]:
    """(the invitation's secret, its id)."""
    r = await c.post("/v1/agent/invitations", json={"user_id": user, "platform": platform, **more})
    assert r.status_code == 201, r.text
    link = r.json()["link"]
    assert link.startswith("http://qoss.test/ui/join#i=")
    return link.split("#i=", 1)[1], r.json()["id"]


def redemption(secret: str, phone: KeyPair, *, platform: str = "android", signer: KeyPair | None = None,
               host: str = SERVER_ID, ts: int | None = None) -> dict[str, str]:
    """What the phone's page posts: the canonical body and its signature by the new Ed25519 key."""
    public = phone.public.as_dict()
    body = canonical({"host": host, "invitation": secret, "platform": platform, "ts": ts or int(time.time()),
                      "sign_public_key": public["sign_public_key"], "kem_public_key": public["kem_public_key"]})
    return {"body": body.decode("ascii"), "signature": b64e((signer or phone).sign(Kind.INVITATION, body))}


def phone_keys(name: str) -> KeyPair:
    keys = KeyPair.generate(name)
    register_keys(keys)
    return keys


async def redeem(c: httpx.AsyncClient, payload: dict[str, str]) -> httpx.Response:
    """Anonymously, as the phone does."""
    return await c.post("/v1/agent/invitations/redeem", json=payload, headers={"Authorization": ""})


async def joined(c: httpx.AsyncClient, user: str) -> KeyPair:
    """The keys of a phone that redeemed a new invitation for ``user``."""
    secret, _ = await invite(c, user)
    phone = phone_keys(user)
    assert (await redeem(c, redemption(secret, phone))).status_code == 200
    return phone


def device_request(user: KeyPair, server: KeyPair, *, platform: str | None) -> dict[str, str]:
    request = ClientRequest(kind=Kind.CONNECT, request_id=secrets.token_bytes(16), user_id=user.name, objective_id=3,
                            request_info=RequestInfo(target=SERVER_ID, platform=platform), host=SERVER_ID,
                            timestamp=int(time.time()))
    wire = seal(kind=Kind.CONNECT, to=SERVER_ID, body=request.body(), signer=user, recipient=server.public.kem)
    return {"message": wire.decode("ascii")}


def users(database_url: str) -> int:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            return s.scalar(select(func.count()).select_from(AgentUserRow)) or 0
    finally:
        engine.dispose()


async def enroll(c: httpx.AsyncClient, name: str) -> KeyPair:
    """A user enrolled with keys of their own (``qoss agent keygen``)."""
    user = phone_keys(name)
    public = user.public.as_dict()
    r = await c.post("/v1/agent/users", json={"user_id": name, "objectives": [3], "sign_public_key":
                                              public["sign_public_key"], "kem_public_key": public["kem_public_key"]})
    assert r.status_code == 201, r.text
    return user


def expire(database_url: str, invitation_id: str) -> None:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            s.execute(update(AgentInvitationRow).where(AgentInvitationRow.id == invitation_id)
                      .values(expires_at=datetime.now(UTC) - timedelta(seconds=1)))
            s.commit()
    finally:
        engine.dispose()


async def test_a_phone_redeems_an_invitation_once_and_its_keys_are_enrolled(roles: Roles) -> None:
    c, _, _ = roles
    secret, invitation = await invite(c, "amy")
    phone = phone_keys("amy")
    r = await redeem(c, redemption(secret, phone))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert {k: answer[k] for k in ("user_id", "platform", "objective", "invitation_id")} == {
        "user_id": "amy", "platform": "android", "objective": 3, "invitation_id": invitation}
    assert answer["host"]["id"] == SERVER_ID
    assert SERVER_ID in answer["host"]["targets"]
    assert r.headers["cache-control"] == "no-store"
    users = {u["user_id"]: u for u in (await c.get("/v1/agent/users")).json()}
    assert users["amy"]["sign_public_key"] == phone.public.as_dict()["sign_public_key"]
    again = await redeem(c, redemption(secret, phone))
    assert (again.status_code, again.json()["error"]) == (404, "InvitationRefused"), again.text
    assert "used" in again.json()["detail"]
    listed = (await c.get("/v1/agent/invitations")).json()
    assert [(i["id"], i["state"]) for i in listed] == [(invitation, "used")]


async def test_nobody_reads_an_invitations_secret_back(roles: Roles, settings: Settings) -> None:
    c, _, _ = roles
    enroller = make_token(settings.database_url, "enroller", ["agent:enroll"])
    r = await c.post("/v1/agent/invitations", json={"user_id": "bea", "platform": "apple", "expires_in": 600},
                     headers={"Authorization": f"Bearer {enroller}"})
    assert r.status_code == 201, r.text
    secret = r.json()["link"].split("#i=", 1)[1]
    digest = hashlib.sha256(secret.encode()).hexdigest()
    for path in ("/v1/agent/invitations", "/v1/agent/invitations?user_id=bea"):
        listed = await c.get(path, headers={"Authorization": f"Bearer {enroller}"})
        assert listed.status_code == 200
        assert secret not in listed.text
        assert digest not in listed.text
        assert listed.json()[0]["created_by"] == "enroller"
        assert listed.json()[0]["state"] == "waiting"
    await redeem(c, redemption(secret, phone_keys("bea"), platform="apple"))
    recorded = everything_recorded(settings.database_url)
    assert secret not in recorded
    assert f"link={digest[:12]}" in recorded
    reader = make_token(settings.database_url, "reader", ["tunnels:read"])
    assert (await c.get("/v1/agent/invitations", headers={"Authorization": f"Bearer {reader}"})).status_code == 403


async def test_a_guessed_invitation_is_refused_and_counts_as_a_failed_authentication(
        settings: Settings, admin_token: str, tmp_path: Path) -> None:
    config, _ = agent_server_config(tmp_path)
    app = create_app(settings.model_copy(update={"agent_config": config, "auth_failure_burst": 3,
                                                 "auth_failure_rate": 0.001}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://qoss.test") as c:
        statuses = [(await redeem(c, redemption(secrets.token_urlsafe(32), phone_keys("eve")))).status_code
                    for _ in range(4)]
        assert statuses == [404, 404, 404, 429]
    assert users(settings.database_url) == 0


async def test_a_redemption_not_signed_by_its_keys_spends_nothing(roles: Roles) -> None:
    c, _, _ = roles
    secret, _ = await invite(c, "cal")
    phone, thief = phone_keys("cal"), phone_keys("mallory")
    forged = await redeem(c, redemption(secret, phone, signer=thief))
    assert (forged.status_code, forged.json()["error"]) == (403, "AgentRejected"), forged.text
    other_host = await redeem(c, redemption(secret, phone, host="another-host"))
    assert other_host.status_code == 403
    stale = await redeem(c, redemption(secret, phone, ts=int(time.time()) - 600))
    assert stale.status_code == 403
    assert (await c.get("/v1/agent/users")).json() == []
    assert (await redeem(c, redemption(secret, phone))).status_code == 200


async def test_an_expired_invitation_is_refused(roles: Roles) -> None:
    c, _, settings = roles
    secret, invitation = await invite(c, "dan", expires_in=60)
    expire(settings.database_url, invitation)
    r = await redeem(c, redemption(secret, phone_keys("dan")))
    assert (r.status_code, r.json()["detail"]) == (404, "this invitation expired")
    assert [i["state"] for i in (await c.get("/v1/agent/invitations")).json()] == ["expired"]


async def test_a_revoked_invitation_is_refused(roles: Roles) -> None:
    c, _, _ = roles
    secret, invitation = await invite(c, "eli")
    revoked = await c.delete(f"/v1/agent/invitations/{invitation}")
    assert revoked.status_code == 200
    assert revoked.json()["state"] == "revoked"
    r = await redeem(c, redemption(secret, phone_keys("eli")))
    assert (r.status_code, r.json()["detail"]) == (404, "this invitation was revoked")
    assert (await c.delete(f"/v1/agent/invitations/{invitation}")).status_code == 409
    assert (await c.delete("/v1/agent/invitations/00000000")).status_code == 404


async def test_another_platform_than_the_invitations_spends_nothing(roles: Roles) -> None:
    c, _, _ = roles
    secret, _ = await invite(c, "fay", platform="apple")
    phone = phone_keys("fay")
    r = await redeem(c, redemption(secret, phone, platform="android"))
    assert r.status_code == 409
    assert "for apple" in r.json()["detail"]
    assert (await redeem(c, redemption(secret, phone, platform="apple"))).status_code == 200


@pytest.mark.parametrize(("payload", "where"), [
    ({"user_id": "gus", "platform": "swanctl"}, "platform"),
    ({"user_id": "gus", "platform": "android", "expires_in": 86401}, "expires_in"),
    ({"user_id": "gus", "platform": "android", "expires_in": 59}, "expires_in"),
    ({"user_id": "Gus!", "platform": "android"}, "user_id"),
    ({"user_id": "gus", "platform": "android", "minimums": {"speed": 3}}, "minimums"),
    ({"user_id": "gus", "platform": "android", "link_base": "javascript:alert(1)"}, "link_base"),
])
async def test_a_bad_invitation_is_refused_and_nothing_is_kept(roles: Roles, payload: dict[str, object],
                                                               where: str) -> None:
    c, _, _ = roles
    r = await c.post("/v1/agent/invitations", json=payload)
    assert r.status_code == 422, r.text
    assert where in r.text
    assert (await c.get("/v1/agent/invitations")).json() == []


async def test_oversized_or_malformed_redemptions_are_refused(roles: Roles) -> None:
    c, _, _ = roles
    secret, _ = await invite(c, "hal")
    phone = phone_keys("hal")
    good = redemption(secret, phone)
    for payload in ({**good, "body": good["body"] + " " * 2000}, {**good, "signature": good["signature"][:-2]},
                    {**good, "extra": "x"}, {"body": "{}", "signature": good["signature"]},
                    {**good, "body": good["body"].replace('{"host"', '{ "host"')}):
        r = await redeem(c, payload)
        assert r.status_code in (403, 422), (payload, r.text)
    assert (await c.get("/v1/agent/users")).json() == []
    assert (await redeem(c, good)).status_code == 200


async def test_a_user_with_keys_of_their_own_is_not_invited(roles: Roles) -> None:
    c, _, _ = roles
    await enroll(c, "ida")
    r = await c.post("/v1/agent/invitations", json={"user_id": "ida", "platform": "android"})
    assert r.status_code == 409
    assert "ida-phone" in r.json()["detail"]
    assert (await c.get("/v1/agent/invitations")).json() == []


async def test_a_second_invitation_is_for_the_same_phone_only(roles: Roles) -> None:
    c, _, _ = roles
    phone = await joined(c, "jo")
    second, _ = await invite(c, "jo")
    other = await redeem(c, redemption(second, phone_keys("jo")))
    assert other.status_code == 409
    assert "another device" in other.json()["detail"]
    assert (await redeem(c, redemption(second, phone))).status_code == 200


async def test_invited_keys_enrol_their_granted_device_only(roles: Roles) -> None:
    c, server, _ = roles
    phone = await joined(c, "kim")
    tunnel = await c.post("/v1/agent/requests", json=device_request(phone, server, platform=None))
    assert tunnel.status_code == 403, tunnel.text
    other = await c.post("/v1/agent/requests", json=device_request(phone, server, platform="apple"))
    assert other.status_code == 403, other.text
    # The granted enrolment reaches the target (which has no charon here: 503); an enrolment that
    # failed gives its grant back, so the phone may try again.
    for _ in range(2):
        granted = await c.post("/v1/agent/requests", json=device_request(phone, server, platform="android"))
        assert granted.status_code == 503, granted.text
    listed = (await c.get("/v1/agent/invitations")).json()
    assert listed[0]["enrolled_at"] is None


async def test_revoking_a_user_withdraws_their_waiting_invitations(roles: Roles) -> None:
    c, _, _ = roles
    await joined(c, "lou")
    waiting, _ = await invite(c, "lou")
    assert (await c.delete("/v1/agent/users/lou")).status_code == 200
    r = await redeem(c, redemption(waiting, phone_keys("lou")))
    assert (r.status_code, r.json()["detail"]) == (404, "this invitation was revoked")
    assert [i["state"] for i in (await c.get("/v1/agent/invitations")).json()] == ["revoked", "used"]
