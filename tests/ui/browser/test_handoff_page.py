"""A phone opens a one-time link (``/ui/handoff#t=<secret>&k=<key>``) in headless chromium, against a
real ``qoss serve`` playing Host: the page fetches the sealed profile, opens it with the key from the
link's fragment and offers, byte for byte, the profile the client sealed, as a download of its media
type and file name, with the gateway's CA fingerprint; it does so with WebCrypto and, where the page
has no ``crypto.subtle`` (plain HTTP to another address than localhost), with the vendored
noble-ciphers. A sealed profile Host changed (one bit of its ciphertext, or its clear line) is refused
with a plain message and no download. The key reaches neither the server's log nor its audit, nor any
request the page makes; the link works once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import plistlib
import re
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from playwright.sync_api import Page, Request, expect
from sqlalchemy import select, update

from app.adapters.agent.crypto import KeyPair, seal, write_keys
from app.adapters.db.agent_rows import AgentHandoffRow
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.models import AuditRow
from app.domain.agent import Handoff, Kind, b64e
from app.services.agent.client_devices import ca_fingerprint, seal_profile
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import SERVER_ID, agent_server_config, register_keys
from tests.fixtures.secrets import register
from tests.ui.browser.conftest import NewContext, Watched, database_at, no_trouble, serve_env, serving_qoss

SSWAN = "application/vnd.strongswan.profile"
APPLE = "application/x-apple-aspen-config"
GATEWAY = "10.99.0.3"


@dataclass
class Host:
    base: str
    database_url: str
    user: KeyPair
    server: KeyPair
    log: Path


def _ca() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "qoss device CA")])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - timedelta(minutes=1))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)


CA = _ca()


def _profile(media_type: str) -> tuple[str, bytes]:
    """A profile of the shape qoss writes: the gateway's address and its CA inside."""
    if media_type == SSWAN:
        return "hq.sswan", json.dumps({
            "uuid": "8c5d5a0e-4f0b-4c45-9a43-1f6f3b0e2a11", "name": "hq", "type": "ikev2-cert",
            "remote": {"addr": GATEWAY, "id": "hq.qoss", "cert": base64.b64encode(CA).decode()},
            "local": {"id": "CN=phone", "p12": base64.b64encode(secrets.token_bytes(64)).decode()},
            "ike-proposal": "aes256gcm16-prfsha384-ecp384", "esp-proposal": "aes256gcm16-ecp384",
        }, indent=2).encode()
    return "hq.mobileconfig", plistlib.dumps({
        "PayloadType": "Configuration", "PayloadIdentifier": "qoss.hq", "PayloadVersion": 1,
        "PayloadUUID": "0C3D6A57-8F0F-4A77-9E44-3B1A8B3A2E10", "PayloadDisplayName": "hq",
        "PayloadContent": [
            {"PayloadType": "com.apple.security.root", "PayloadIdentifier": "qoss.hq.ca", "PayloadVersion": 1,
             "PayloadUUID": "A5E1C3E2-8D0C-4F67-8D4E-6C2B9A1F0D33", "PayloadContent": CA},
            {"PayloadType": "com.apple.vpn.managed", "PayloadIdentifier": "qoss.hq.vpn", "PayloadVersion": 1,
             "PayloadUUID": "3F4E2B1A-6D5C-4B3A-9E8F-7A6B5C4D3E2F",
             "IKEv2": {"RemoteAddress": GATEWAY, "RemoteIdentifier": "hq.qoss"}},
        ]})


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    where = tmp_path_factory.mktemp("handoff-page")
    url = database_at(where)
    config, server = agent_server_config(where)
    user = KeyPair.generate("dana")
    register_keys(user)
    write_keys(user, where / "user")
    with serving_qoss(where, url, serve_env(where, QOSS_AGENT_CONFIG=str(config)), "handoff-page") as base:
        admin = make_token(url, "admin", ["admin"])
        r = httpx.post(f"{base}/v1/agent/users", headers={"Authorization": f"Bearer {admin}"}, json={
            "user_id": "dana", **user.public.as_dict(), "objectives": [3]})
        assert r.status_code == 201, r.text
        yield Host(base, url, user, server, where / "serve.log")


def _link(host: Host, media_type: str) -> tuple[str, bytes, str, bytes]:
    """A one-time link as the client makes it: (link, profile, file name, key)."""
    name, profile = _profile(media_type)
    key = secrets.token_bytes(32)
    register(key)  # the secret sweep: never in the server's log or database
    handoff = Handoff(user_id="dana", host=SERVER_ID, nonce=secrets.token_bytes(16), timestamp=int(time.time()),
                      profile_name=name, media_type=media_type,
                      profile=seal_profile(key, media_type=media_type, name=name, profile=profile), ttl=600)
    wire = seal(kind=Kind.HANDOFF, to=SERVER_ID, body=handoff.body(), signer=host.user,
                recipient=host.server.public.kem)
    r = httpx.post(f"{host.base}/v1/agent/handoffs", json={"message": wire.decode("ascii")})
    assert r.status_code == 200, r.text
    secret = r.json()["message"].removeprefix("/v1/agent/handoffs/")
    return f"{host.base}/ui/handoff#t={secret}&k={b64e(key)}", profile, name, key


def _phone(new_context: NewContext, *, without_subtle: bool = False) -> tuple[Page, Watched, list[Request]]:
    context = new_context(viewport={"width": 390, "height": 844}, accept_downloads=True)
    if without_subtle:  # as on plain HTTP to a LAN address: no WebCrypto
        context.add_init_script("Object.defineProperty(Crypto.prototype, 'subtle', { get: () => undefined });")
    page = context.new_page()
    sent: list[Request] = []
    page.on("request", lambda request: sent.append(request))
    return page, Watched(page), sent


def _recorded(database_url: str) -> str:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            return repr([(r.action, r.object, r.detail) for r in s.scalars(select(AuditRow))])
    finally:
        engine.dispose()


@pytest.mark.parametrize(("media_type", "without_subtle"), [(SSWAN, False), (APPLE, False), (SSWAN, True)],
                         ids=["sswan", "mobileconfig", "sswan-without-webcrypto"])
def test_the_page_offers_the_clients_profile_byte_for_byte_and_the_key_never_reaches_the_server(
        host: Host, new_context: NewContext, screenshots: Path, media_type: str, without_subtle: bool) -> None:
    link, profile, name, key = _link(host, media_type)
    page, watched, sent = _phone(new_context, without_subtle=without_subtle)
    page.goto(link)
    expect(page.locator("#handoff-result")).to_be_visible()
    expect(page.locator("#handoff-title")).to_be_focused()
    page.screenshot(path=screenshots / f"handoff-page-390-{name.rsplit('.', 1)[1]}.png", full_page=True)
    download = page.get_by_role("link", name=f"Download {name}")
    assert download.get_attribute("download") == name
    assert download.get_attribute("type") == media_type  # the Blob's type too (the page's CSP hides the Blob)
    assert (download.get_attribute("href") or "").startswith("blob:")
    with page.expect_download() as started:
        download.click()
    assert started.value.suggested_filename == name
    assert Path(started.value.path()).read_bytes() == profile  # byte for byte
    shown = page.locator('dd[data-fact="Gateway\'s CA (SHA-256)"]').inner_text()
    assert shown == ca_fingerprint(CA) == ":".join(f"{b:02X}" for b in hashlib.sha256(CA).digest())
    assert "#" not in page.url  # the key left the address bar and the history

    # The key went nowhere: no request the page made, not the server's log, not its audit.
    secret = link.split("#t=", 1)[1].split("&", 1)[0]
    for request in sent:
        assert request.url.startswith((f"{host.base}/", "blob:")), request.url
        assert b64e(key) not in request.url
        assert b64e(key).encode() not in (request.post_data_buffer or b"")
    assert [r.url for r in sent if "/v1/" in r.url] == [f"{host.base}/v1/agent/handoffs/{secret}"]
    for where in (host.log.read_text(errors="replace"), _recorded(host.database_url)):
        assert b64e(key) not in where
        assert "&k=" not in where
        assert secret not in where

    # Once: the same link again is refused, plainly.
    again, again_watched, _ = _phone(new_context)
    again.goto(link)
    expect(again.get_by_role("alert")).to_contain_text("unknown, used or expired")
    expect(again.locator("#handoff-result")).to_be_hidden()
    no_trouble(watched)
    assert not again_watched.dialogs


@pytest.mark.parametrize("where", ["ciphertext", "line"])
def test_a_profile_host_changed_is_refused_and_the_page_says_so(host: Host, new_context: NewContext,
                                                                screenshots: Path, where: str) -> None:
    link, profile, name, _ = _link(host, SSWAN)
    engine = make_engine(host.database_url)
    try:
        with make_session_factory(engine)() as s:
            (row,) = s.scalars(select(AgentHandoffRow)).all()
            kept = bytearray(row.profile)
            assert GATEWAY.encode() not in kept
            if where == "ciphertext":
                kept[-20] ^= 0x01  # one bit of what the gateway's address was sealed into
            else:
                kept[:kept.index(b"\n")] = b"qoss-handoff/1 application/vnd.strongswan.profile hx.sswan"
            s.execute(update(AgentHandoffRow).where(AgentHandoffRow.digest == row.digest).values(profile=bytes(kept)))
            s.commit()
    finally:
        engine.dispose()
    page, watched, _ = _phone(new_context)
    page.goto(link)
    expect(page.get_by_role("alert")).to_contain_text("This profile was changed after your computer sealed it")
    expect(page.get_by_role("alert")).to_contain_text("Do not use it")
    page.screenshot(path=screenshots / "handoff-page-390-changed.png", full_page=True)
    expect(page.locator("#handoff-result")).to_be_hidden()
    expect(page.get_by_role("link", name=re.compile("^Download"))).to_have_count(0)
    assert profile not in page.content().encode()
    no_trouble(watched)
    del name


def test_a_link_without_its_key_spends_nothing(host: Host, new_context: NewContext) -> None:
    link, _, _, _ = _link(host, SSWAN)
    page, _, sent = _phone(new_context)
    page.goto(link.split("&k=", 1)[0])
    expect(page.get_by_role("alert")).to_contain_text("This link is incomplete")
    assert not [r.url for r in sent if "/v1/" in r.url]
    whole, _, _ = _phone(new_context)
    whole.goto(link)
    expect(whole.locator("#handoff-result")).to_be_visible()

