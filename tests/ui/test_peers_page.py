"""Peers in the console (``/ui/peers``): the list for any session; with ``peers:write`` this
side's identity to hand over, registration (the fields of ``POST /v1/peers``, refused fields shown
beside them, nothing kept), and suspend / resume / revoke after a confirmation, every change
behind CSRF, through the same service as the API and audited as it is. Hostile values render as
text. A peered tunnel's page names its peer, and taking it down here tells the peer, as the API
does. The charon is a fake that speaks VICI; the other qoss is a recorder on 127.0.0.1."""

from __future__ import annotations

import asyncio
import html
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.adapters.agent.crypto import KeyPair
from app.adapters.db.engine import make_engine, make_session_factory
from app.adapters.db.unit_of_work import sql_units_of_work
from app.domain.tunnels import PeerEnd, TunnelRecord, TunnelState
from app.settings import Settings
from app.web.peering import PeerIn
from tests.ui.conftest import Site, client_of, gateway_site, rows, sign_in

pytestmark = pytest.mark.anyio

_B = KeyPair.generate("site-b")
#: Its identity's keys, as its administrator hands them over.
_KEYS = {k: v for k, v in _B.public.as_dict().items() if k in PeerIn.model_fields}
#: An X25519 key no message can be sealed to (a low-order point): 32 zero bytes.
_LOW_ORDER = "A" * 43


class Recorder(ThreadingHTTPServer):
    """The other qoss on 127.0.0.1: notes every POST's path and answers 503 (it says nothing a
    message could be opened from)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Record)
        self.posts: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Record(BaseHTTPRequestHandler):
    server: Recorder

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.posts.append(self.path)
        self.send_response(503)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _site(settings: Settings, tmp_path: Path, **updates: Any) -> AbstractAsyncContextManager[Site]:
    """An app (``site-a`` unless told otherwise) with the gateway ``left`` on a fake charon, and an
    admin's API client."""
    return gateway_site(settings, tmp_path, up=False, **{"reconcile_on_start": False, "peer_name": "site-a",
                                                         "peer_timeout": 2.0, **updates})


@pytest.fixture
async def site(settings: Settings, tmp_path: Path) -> AsyncIterator[Site]:
    async with _site(settings, tmp_path) as s:
        yield s


def _peers(settings: Settings) -> list[tuple[Any, ...]]:
    return rows(settings, "SELECT name, state FROM peers ORDER BY name")


async def _audit(site: Site, like: str) -> list[tuple[Any, ...]]:
    await asyncio.to_thread(site.app.state.runtime.auditor.flush)
    return await asyncio.to_thread(rows, site.settings, "SELECT action, object, outcome, token_name, detail "
                                   "FROM audit_events WHERE object LIKE :like ORDER BY id", like=like)


def _form(csrf: str, **changes: str) -> dict[str, str]:
    form = {"csrf": csrf, "name": "site-b", "url": "https://qoss.site-b.example/", **_KEYS,
            "gateway:left": "on", "networks": "10.1.0.0/24", "level:confidentiality": "5", "level:integrity": "",
            "level:key_exchange": ""}
    form.update(changes)
    return {k: v for k, v in form.items() if v is not None}


async def _register_api(site: Site, url: str = "http://127.0.0.1:9", name: str = "site-b") -> None:
    r = await site.api.post("/v1/peers", json={"name": name, "url": url, **_KEYS, "gateways": ["left"],
                                               "networks": ["10.1.0.0/24"], "min_levels": {"integrity": 4}})
    assert r.status_code == 201, r.text


def _add_peered_tunnel(settings: Settings, tunnel_id: str, site_name: str = "site-b") -> None:
    """A peered tunnel's record, as the peering service writes it for the initiator's end."""
    engine = make_engine(settings.database_url)
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            uow.tunnels.add(TunnelRecord(
                id=tunnel_id, initiator="left", responder=None, local_ts=("10.1.0.0/24",),
                remote_ts=("10.2.0.0/24",), state=TunnelState.UP,
                negotiation={"suite": {"protocol": "esp"}, "proposals": {"esp": "aes128gcm16-x25519"}},
                peer=PeerEnd("10.99.0.2", f"{tunnel_id}.gw-b", f"{tunnel_id}.left", site=site_name, gateway="gw-b",
                             role="initiator")))
            uow.commit()
    finally:
        engine.dispose()


async def test_without_peering_the_page_says_how_to_turn_it_on(settings: Settings, tmp_path: Path,
                                                                token: Callable[..., str]) -> None:
    async with _site(settings, tmp_path, peer_name=None) as s, client_of(s.app) as client:
        csrf = await sign_in(client, token("netadmin", ["peers:write"]))
        listing = await client.get("/ui/peers")
        assert listing.status_code == 200
        assert "Peering is off on this service" in listing.text
        assert "QOSS_PEER_NAME" in listing.text
        assert "Register a peer" not in listing.text
        assert (await client.post("/ui/peers", data=_form(csrf))).status_code == 404


async def test_the_navigation_leads_to_the_peers_page(site: Site, token: Callable[..., str]) -> None:
    async with client_of(site.app) as client:
        await sign_in(client, token("reader", ["tunnels:read"]))
        tables = await client.get("/ui/tables")
        assert '<a href="/ui/peers">Peers</a>' in tables.text
        assert '<a href="/ui/peers" aria-current="page">Peers</a>' in (await client.get("/ui/peers")).text


async def test_without_peers_write_the_list_shows_but_no_identity_no_form_and_every_change_is_refused(
        site: Site, token: Callable[..., str]) -> None:
    await _register_api(site)
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("reader", ["tunnels:read"]))
        listing = await client.get("/ui/peers")
        assert listing.status_code == 200
        assert '<tr id="peer-site-b">' in listing.text
        assert "http://127.0.0.1:9" in listing.text
        assert "integrity 4" in listing.text
        for absent in ("Our identity", "Register a peer", "/ui/peers/site-b/suspend", "/ui/peers/site-b/revoke",
                       "sign_public_key"):
            assert absent not in listing.text, absent
        assert (await client.post("/ui/peers", data=_form(csrf, name="site-c"))).status_code == 403
        for action in ("suspend", "resume", "revoke"):
            assert (await client.get(f"/ui/peers/site-b/{action}")).status_code == 403
            assert (await client.post(f"/ui/peers/site-b/{action}", data={"csrf": csrf})).status_code == 403
    assert _peers(site.settings) == [("site-b", "active")]


async def test_our_identity_is_shown_to_copy(site: Site, token: Callable[..., str]) -> None:
    identity = (await site.api.get("/v1/peering/identity")).json()
    async with client_of(site.app) as client:
        await sign_in(client, token("netadmin", ["peers:write"]))
        listing = await client.get("/ui/peers")
        shown = html.unescape(listing.text)
        assert identity["name"] == "site-a"
        for value in identity.values():
            assert value in shown
        assert 'id="identity-text"' in listing.text
        assert 'data-copy="identity-text"' in listing.text
        assert '<script src="/ui/static/copy.js" defer></script>' in listing.text
        assert "private" not in shown.lower().replace("public keys only", "")
        script = await client.get("/ui/static/copy.js")
        assert script.status_code == 200
        assert "clipboard" in script.text


async def test_registering_a_peer_goes_through_the_api_service_and_is_audited(
        site: Site, token: Callable[..., str]) -> None:
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("netadmin", ["peers:write", "tunnels:read"]))
        answer = await client.post("/ui/peers", data=_form(csrf, networks="10.1.0.0/25, 10.1.0.128/25"))
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/ui/peers?registered=site-b"
        listing = await client.get(answer.headers["location"])
        assert "Peer site-b is registered" in listing.text
        assert '<tr id="peer-site-b">' in listing.text
        assert "confidentiality 5" in listing.text
    stored = (await site.api.get("/v1/peers/site-b")).json()
    assert stored["url"] == "https://qoss.site-b.example"
    assert stored["gateways"] == ["left"]
    assert stored["networks"] == ["10.1.0.0/25", "10.1.0.128/25"]
    assert stored["min_levels"]["confidentiality"] == 5
    assert stored["min_levels"]["integrity"] == 0
    assert stored["sign_public_key"] == _KEYS["sign_public_key"]
    assert await _audit(site, "/ui/peers") == [("POST", "/ui/peers", 303, "netadmin",
                                                "peer site-b registered (https://qoss.site-b.example)")]


async def test_an_optional_key_left_empty_registers_the_peer_without_it(site: Site, token: Callable[..., str]) -> None:
    optional = [k for k, f in PeerIn.model_fields.items() if k.endswith("_public_key") and not f.is_required()]
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("netadmin", ["peers:write"]))
        answer = await client.post("/ui/peers", data=_form(csrf, **{k: "" for k in optional}))
        assert answer.status_code == 303, answer.text
    stored = (await site.api.get("/v1/peers/site-b")).json()
    for key in optional:
        assert stored.get(key) is None


@pytest.mark.parametrize(("changes", "status", "field", "message"), [
    ({"url": "ftp://qoss.site-b.example"}, 422, "url", "an http(s) URL with a host"),
    ({"url": "https://admin:hunter2@qoss.site-b.example"}, 422, "url", "no query, fragment or user"),
    ({"url": "javascript:alert(1)//"}, 422, "url", "an http(s) URL"),
    ({"url": "https://qoss.site-b.example/?next=1"}, 422, "url", "no query"),
    ({"name": "Site B"}, 422, "name", "String should match pattern"),
    ({"sign_public_key": "tooshort"}, 422, "sign_public_key", "at least 43 characters"),
    ({"kem_public_key": _LOW_ORDER}, 422, "kem_public_key", "not an X25519 key a message can be sealed to"),
    ({"sign_public_key": "!" * 43}, 422, "keys", "a public key is 32 bytes in unpadded base64url"),
    ({"gateway:left": "", "gateway:elsewhere": "on"}, 404, "gateways", "elsewhere"),
    ({"gateway:left": ""}, 422, "gateways", "at least 1 item"),
    ({"networks": "10.1.0.0/33"}, 422, "networks", "not a network"),
    ({"level:confidentiality": "11"}, 422, "level-confidentiality", "less than or equal to 10"),
    ({"level:integrity": "eight"}, 422, "level-integrity", "valid integer"),
])
async def test_a_refused_field_is_shown_beside_it_and_nothing_is_registered(
        site: Site, token: Callable[..., str], changes: dict[str, str], status: int, field: str,
        message: str) -> None:
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("netadmin", ["peers:write"]))
        answer = await client.post("/ui/peers", data=_form(csrf, **changes))
        assert answer.status_code == status, answer.text
        page = answer.text
        assert 'role="alert" id="peer-error"' in page
        start = page.index(f'id="error-{field}"')
        assert message in html.unescape(page[start:page.index("</p>", start)])
        if field not in ("keys", "gateways"):
            assert f'aria-describedby="error-{field}' in page
        assert f'value="{html.escape(_KEYS["kem_public_key"])}"' in page or "kem_public_key" in changes
        assert "hunter2" not in page or changes.get("url", "").startswith("https://admin:hunter2")
    assert _peers(site.settings) == []
    assert [row[2] for row in await _audit(site, "/ui/peers")] == [status]


async def test_a_name_taken_is_refused_beside_the_name(site: Site, token: Callable[..., str]) -> None:
    await _register_api(site)
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("netadmin", ["peers:write"]))
        answer = await client.post("/ui/peers", data=_form(csrf, url="https://other.example"))
        assert answer.status_code == 409
        assert 'id="error-name"' in answer.text
        assert "site-b" in answer.text
    assert (await site.api.get("/v1/peers/site-b")).json()["url"] == "http://127.0.0.1:9"


async def test_a_form_without_this_consoles_csrf_token_changes_nothing(site: Site, token: Callable[..., str]) -> None:
    await _register_api(site)
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("netadmin", ["peers:write"]))
        for wrong in ({"csrf": ""}, {"csrf": "x" * 43}):
            answer = await client.post("/ui/peers", data={**_form(csrf, name="site-c"), **wrong})
            assert answer.status_code == 403
            assert "CSRF" in answer.text
            for action in ("suspend", "revoke"):
                assert (await client.post(f"/ui/peers/site-b/{action}", data=wrong)).status_code == 403
    assert _peers(site.settings) == [("site-b", "active")]


async def test_suspend_resume_and_revoke_ask_first_and_revoking_ends_the_tunnels_it_carries(
        site: Site, token: Callable[..., str], recorder: Recorder) -> None:
    await _register_api(site, url=recorder.url)
    await asyncio.to_thread(_add_peered_tunnel, site.settings, "peered01")
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("netadmin", ["peers:write", "tunnels:read"]))
        listing = await client.get("/ui/peers")
        row = listing.text[listing.text.index('<tr id="peer-site-b">'):]
        row = row[:row.index("</tr>")]
        assert '1:' in row
        assert 'href="/ui/tunnels/peered01"' in row

        ask = await client.get("/ui/peers/site-b/suspend")
        assert ask.status_code == 200
        assert "The 1 tunnel it carries stay up" in ask.text
        assert 'action="/ui/peers/site-b/suspend"' in ask.text
        done = await client.post("/ui/peers/site-b/suspend", data={"csrf": csrf})
        assert done.status_code == 303
        assert "Peer site-b is suspended." in (await client.get(done.headers["location"])).text
        assert _peers(site.settings) == [("site-b", "suspended")]

        resumed = await client.post("/ui/peers/site-b/resume", data={"csrf": csrf})
        assert resumed.status_code == 303
        assert _peers(site.settings) == [("site-b", "active")]

        ask = await client.get("/ui/peers/site-b/revoke")
        assert "Revoking ends the 1 tunnel it carries, on both sides" in ask.text
        revoked = await client.post("/ui/peers/site-b/revoke", data={"csrf": csrf})
        assert revoked.status_code == 303
        assert _peers(site.settings) == [("site-b", "revoked")]
        assert (await site.api.get("/v1/tunnels")).json() == []
        assert recorder.posts == ["/v1/peering/messages"]  # the peer was told
        assert any(c.command == "terminate" for c in site.charon.calls)
        # It answered 503, as a proxy in front of a peer that is down does: not heard, told again later.
        row = (await client.get("/ui/peers")).text
        row = row[row.index('<tr id="peer-site-b">'):]
        assert "1 teardown not heard yet" in row[:row.index("</tr>")]
        assert (await site.api.get("/v1/peers/site-b")).json()["unheard_teardowns"] == 1
        assert [p["unheard_teardowns"] for p in (await site.api.get("/v1/peers")).json()] == [1]

        again = await client.post("/ui/peers/site-b/resume", data={"csrf": csrf})
        assert again.status_code == 409
        assert "is revoked" in html.unescape(again.text)
    assert [(r[0], r[2], r[3], r[4]) for r in await _audit(site, "/ui/peers/site-b/%")] == [
        ("POST", 303, "netadmin", "peer site-b suspended"), ("POST", 303, "netadmin", "peer site-b resumed"),
        ("POST", 303, "netadmin", "peer site-b revoked"), ("POST", 409, "netadmin", "Conflict")]


async def test_a_peers_url_and_a_forms_values_render_as_text(site: Site, token: Callable[..., str]) -> None:
    hostile = 'https://x.example/"><script>alert(1)</script><img src=x onerror=alert(2)>'
    await _register_api(site, url=hostile)
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("netadmin", ["peers:write"]))
        listing = await client.get("/ui/peers")
        assert "<script>alert(1)" not in listing.text
        assert "<img src=x" not in listing.text
        assert html.escape(hostile.rstrip("/"), quote=False).replace('"', "&#34;") in listing.text
        refused = await client.post("/ui/peers", data=_form(
            csrf, name='<img src=x onerror=alert(3)>', sign_public_key='"><script>alert(4)</script>',
            networks="</textarea><script>alert(5)</script>"))
        assert refused.status_code == 422
        for raw in ("<img src=x onerror=alert(3)>", "<script>alert(4)", "</textarea><script>alert(5)"):
            assert raw not in refused.text, raw
        assert "&lt;img src=x onerror=alert(3)&gt;" in refused.text


async def test_a_peered_tunnels_page_names_its_peer_and_taking_it_down_tells_the_peer(
        site: Site, token: Callable[..., str], recorder: Recorder) -> None:
    await _register_api(site, url=recorder.url)
    await asyncio.to_thread(_add_peered_tunnel, site.settings, "peered02")
    site.charon.conns["qoss-peered02"] = {}  # its end, as the exchange loaded it
    site.charon.shared["qoss-peered02"] = ["peered02.left", "peered02.gw-b"]
    async with client_of(site.app) as client:
        csrf = await sign_in(client, token("operator", ["tunnels:write", "tunnels:read"]))
        shown = await client.get("/ui/tunnels/peered02")
        assert shown.status_code == 200
        assert '<a href="/ui/peers#peer-site-b">site-b</a>' in shown.text
        assert "<code>gw-b@site-b</code>" in shown.text
        ask = await client.get("/ui/tunnels/peered02/teardown")
        assert "site-b, the peer that owns the far end, is told to take down its end" in ask.text
        gone = await client.post("/ui/tunnels/peered02/teardown", data={"csrf": csrf})
        assert gone.status_code == 303
    assert (await site.api.get("/v1/tunnels")).json() == []
    assert recorder.posts == ["/v1/peering/messages"]
    assert "qoss-peered02" not in site.charon.conns
    assert "qoss-peered02" not in site.charon.shared
