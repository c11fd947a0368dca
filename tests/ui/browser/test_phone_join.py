"""A user with nothing but a phone joins from an invitation, in headless chromium as a phone
(390 by 844, touch, a phone's user agent).

In the agent lab (``qoss lab up --agent``, real charons): ``qoss lab invite`` prints the link; the
phone's page makes the user's keys, redeems the invitation, enrols the device and offers the
``.sswan`` and the passphrase, with no file from elsewhere; that ``.sswan`` joins with Debian's stock
``charon-cmd`` in ``PREFIX-device`` (a virtual IP, a ping to Target's protected network). The same
link a second time, an expired link and a revoked one are refused with a page that says so.

Against a served Host and Target over a fake charon: the profile the page offers for Apple,
Windows and NetworkManager is, byte for byte, what the command line writes for the same enrolment
(Target's answer, opened with the keys the page kept) and reads back as the platform's; the page
joins with the keyboard alone; no request leaves for another host, none carries a private key.
"""

from __future__ import annotations

import configparser
import json
import plistlib
import re
import shutil
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from playwright.sync_api import Page, Request, expect
from sqlalchemy import update
from typer.testing import CliRunner

from app.adapters.agent.crypto import KeyPair
from app.adapters.db.agent_rows import AgentInvitationRow
from app.adapters.db.engine import make_engine, make_session_factory
from app.cli.main import app
from app.domain.agent import Kind, Response
from tests.api.conftest import make_token
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.agent_roles import SERVER_ID
from tests.fixtures.secrets import register
from tests.ui.browser.conftest import NewContext, Watched, database_at, host_config, no_trouble, serve_env, serving_qoss

if TYPE_CHECKING:
    from tests.integration.agent.test_device_join import LabCli

ANDROID = ("Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) "
           "Chrome/120.0.0.0 Mobile Safari/537.36")
IPHONE = ("Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) "
          "Version/17.1 Mobile/15E148 Safari/604.1")
PHONE = {"viewport": {"width": 390, "height": 844}, "has_touch": True, "is_mobile": True, "accept_downloads": True}


def phone(new_context: NewContext, agent: str = ANDROID) -> tuple[Page, Watched, list[Request]]:
    page = new_context(**PHONE, user_agent=agent).new_page()
    sent: list[Request] = []
    page.on("request", lambda request: sent.append(request))
    return page, Watched(page), sent


def join(page: Page, link: str, *, keyboard: bool = False) -> None:
    """Open the invitation and join with the platform the page recognised."""
    page.goto(link)
    expect(page.locator("#join-status")).to_contain_text("Ready")
    if keyboard:
        page.locator("#join-button").focus()
        page.keyboard.press("Enter")
    else:
        page.locator("#join-button").tap()


def passphrase(page: Page) -> str:
    shown = page.locator("[data-passphrase]")
    expect(shown).not_to_be_empty(timeout=60_000)
    text = shown.inner_text().strip()
    register(text)  # shown once: never in a log or a database
    return text


def downloads(page: Page) -> dict[str, tuple[bytes, str | None]]:
    """Every file the page offers: name -> (bytes, the link's media type), each through a download."""
    out = {}
    links = page.locator("#join-downloads a[download]")
    for i in range(links.count()):
        link = links.nth(i)
        with page.expect_download() as started:
            link.click()
        download = started.value
        out[download.suggested_filename] = (Path(download.path()).read_bytes(), link.get_attribute("type"))
    return out


def refused(page: Page, link: str, says: str) -> None:
    page.goto(link)
    expect(page.locator("#join-status")).to_contain_text("Ready")
    page.locator("#join-button").tap()
    expect(page.locator("#join-error")).to_contain_text(says)
    expect(page.locator("[data-passphrase]")).to_be_empty()
    assert page.locator("#join-result").is_hidden()


def no_trouble_but_refusals(watched: Watched) -> None:
    """:func:`no_trouble`, but for chromium's note of each refused invitation (a 404 the page explains)."""
    watched.problems = [p for p in watched.problems if not re.fullmatch(
        r"Failed to load resource: the server responded with a status of 404 .*", p)]
    no_trouble(watched)


def nothing_leaves(base: str, sent: list[Request], *secrets: bytes) -> None:
    """Every request went to the Host; none carried a private key (nor ``secrets``)."""
    assert sent
    for request in sent:
        assert request.url.startswith((f"{base}/", "blob:", "data:")), request.url
        body = request.post_data_buffer or b""
        for secret in secrets:
            assert secret not in body, request.url


def kept_keys(page: Page, host_id: str) -> tuple[KeyPair, list[bytes]]:
    """The user's keys the page kept in this browser (phone-keys.js), as a key pair, and the raw
    private keys."""
    record = page.evaluate("""async (host) => {
        const r = await window.qossPhoneKeys.loadKeys(host);
        return r && { user: r.user_id, sign: Array.from(r.sign_private), kem: Array.from(r.kem_private) };
    }""", host_id)
    assert record is not None
    sign, kem = bytes(record["sign"]), bytes(record["kem"])
    register(sign)
    register(kem)
    keys = KeyPair(record["user"], Ed25519PrivateKey.from_private_bytes(sign), X25519PrivateKey.from_private_bytes(kem))
    return keys, [sign, kem]


def set_invitation(database_url: str, invitation_id: str, **values: Any) -> None:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as s:
            s.execute(update(AgentInvitationRow).where(AgentInvitationRow.id == invitation_id).values(**values))
            s.commit()
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- a served Host over a fake charon


class Host:
    def __init__(self, base: str, database_url: str, admin: str) -> None:
        self.base, self.database_url, self.admin = base, database_url, admin

    def invite(self, user: str, platform: str) -> tuple[str, str]:
        r = httpx.post(f"{self.base}/v1/agent/invitations", headers={"Authorization": f"Bearer {self.admin}"},
                       json={"user_id": user, "platform": platform}, timeout=30)
        assert r.status_code == 201, r.text
        return r.json()["link"], r.json()["id"]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    where = tmp_path_factory.mktemp("phone-join")
    url = database_at(where)
    config, socket_path = host_config(where, pool="10.3.8.0/26")  # an address for every device this module enrols
    with FakeCharon(socket_path), serving_qoss(where, url, serve_env(where, QOSS_AGENT_CONFIG=str(config)),
                                               "phone-join") as base:
        yield Host(base, url, make_token(url, "admin", ["admin"]))


def cli_files(keys: KeyPair, answer: str) -> dict[str, bytes]:
    """What ``qoss agent device enrol`` writes for this enrolment: Target's answer opened with the
    user's keys, its profile and the files beside it (``AgentClient.enrol_device``)."""
    kind, body, _ = keys.open_sealed(answer.encode("ascii"), kinds=[Kind.RESPONSE])
    device = Response.parse(body, kind=kind).device
    assert device is not None
    return {device.profile_name: device.profile, **device.files}


@pytest.mark.parametrize(("platform", "agent"), [("apple", IPHONE), ("windows", ANDROID),
                                                  ("networkmanager", ANDROID)])
def test_the_phone_pages_profiles_are_the_command_lines(host: Host, new_context: NewContext, platform: str,
                                                         agent: str) -> None:
    page, watched, sent = phone(new_context, agent)
    answers: list[str] = []
    page.on("response", lambda r: answers.append(r.json()["message"])
            if r.url.endswith("/v1/agent/requests") and r.ok else None)
    link, _ = host.invite(f"user-{platform}", platform)
    page.goto(link)
    expect(page.locator("#join-status")).to_contain_text("Ready")
    page.locator(f"#platform-{platform}").check()  # the page's guess is changed before enrolling
    page.locator("#join-button").tap()
    secret = passphrase(page)
    offered = downloads(page)
    keys, private = kept_keys(page, SERVER_ID)
    (answer,) = answers
    written = cli_files(keys, answer)
    assert {name: data for name, (data, _) in offered.items()} == written
    profile_name = next(iter(written))
    if platform == "apple":
        assert offered[profile_name][1] == "application/x-apple-aspen-config"
        payloads = {p["PayloadType"] for p in plistlib.loads(written[profile_name])["PayloadContent"]}
        assert {"com.apple.vpn.managed", "com.apple.security.root", "com.apple.security.pkcs12"} <= payloads
    elif platform == "windows":
        assert "Add-VpnConnection" in written[profile_name].decode()
    else:
        keyfile = configparser.ConfigParser(interpolation=None)
        keyfile.read_string(written[profile_name].decode())
        assert keyfile["vpn"]["proposal"] == "yes"
    assert secret.encode() not in b"".join(written.values())
    nothing_leaves(host.base, sent, *private, secret.encode())
    no_trouble(watched)


def test_the_page_joins_with_the_keyboard_and_says_what_it_is(host: Host, new_context: NewContext,
                                                              screenshots: Path) -> None:
    page, watched, _ = phone(new_context)
    link, _ = host.invite("kbd", "android")
    page.goto(link)
    page.screenshot(path=str(screenshots / "join-phone.png"), full_page=True)
    expect(page.locator("#platform-android")).to_be_checked()
    expect(page.locator("#storage-note")).to_contain_text("clear this browser's data")
    assert "#i=" not in page.evaluate("document.referrer")
    join(page, link, keyboard=True)
    passphrase(page)
    assert "#i=" not in page.url  # the spent secret is out of the address bar
    assert page.locator("#join-downloads a[download]").first.get_attribute("download", timeout=5000).endswith(".sswan")
    page.locator("#join-hide").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#join-passphrase-gone")).to_be_visible()
    expect(page.locator("[data-passphrase]")).to_be_empty()
    page.screenshot(path=str(screenshots / "join-phone-done.png"), full_page=True)
    # The same phone, invited again: it redeems with the keys it kept, for one more device.
    kept, _ = kept_keys(page, SERVER_ID)
    second, _ = host.invite("kbd", "android")
    join(page, second)
    expect(page.locator("[data-passphrase]")).to_be_visible()
    passphrase(page)
    again, _ = kept_keys(page, SERVER_ID)
    assert again.public.sign == kept.public.sign
    no_trouble(watched)


def test_the_wrong_device_is_told_which_to_choose_and_nothing_is_spent(host: Host, new_context: NewContext) -> None:
    page, watched, _ = phone(new_context)  # an Android phone, invited as an Apple device
    link, _ = host.invite("wes", "apple")
    join(page, link)
    expect(page.locator("#join-error")).to_contain_text("This invitation is for Apple iOS/iPadOS/macOS built-in IKEv2")
    page.locator("#platform-apple").check()
    page.locator("#join-button").tap()
    passphrase(page)
    (name,) = downloads(page)
    assert name.endswith(".mobileconfig")
    watched.problems = [p for p in watched.problems if "status of 409" not in p]
    no_trouble(watched)


def test_a_network_or_gateway_failure_is_told_to_the_user_and_joining_again_works(
        host: Host, new_context: NewContext) -> None:
    page, watched, _ = phone(new_context)
    link, _ = host.invite("vic", "android")
    page.route("**/v1/agent/invitations/redeem", lambda route: route.abort("internetdisconnected"))
    join(page, link)
    expect(page.locator("#join-error")).to_contain_text("could not be reached")
    expect(page.locator("#join-error")).to_contain_text("The invitation was not used.")
    page.unroute("**/v1/agent/invitations/redeem")
    page.route("**/v1/agent/requests", lambda route: route.fulfill(
        status=503, content_type="application/json", headers={"X-Request-ID": "ref-42"},
        body=json.dumps({"error": "GatewayUnreachable", "detail": "strongSwan unreachable at /run/qoss/t.vici"})))
    page.locator("#join-button").tap()
    expect(page.locator("#join-error")).to_contain_text("not answering")
    expect(page.locator("#join-error")).to_contain_text("ref-42")
    assert "/run/" not in page.locator("#join-error").inner_text()
    expect(page.locator("#join-button")).to_have_text("Try again")
    page.unroute("**/v1/agent/requests")
    page.locator("#join-button").tap()
    passphrase(page)
    watched.problems = [p for p in watched.problems if "status of 503" not in p and "ERR_INTERNET" not in p]
    no_trouble(watched)


def test_a_link_cut_short_and_an_unknown_one_say_what_to_do(host: Host, new_context: NewContext) -> None:
    page, watched, _ = phone(new_context)
    page.goto(f"{host.base}/ui/join#i=short")
    expect(page.locator("#join-error")).to_contain_text("incomplete")
    assert page.locator("#join-form").is_hidden()
    refused(page, f"{host.base}/ui/join#i={'A' * 43}", "not known here")
    no_trouble_but_refusals(watched)


# --------------------------------------------------------------------------- the lab, a stock client

_CHARON_CMD = shutil.which("charon-cmd") or "/usr/sbin/charon-cmd"


def lab_invite(cli: LabCli, user: str, platform: str) -> dict[str, Any]:
    """``qoss lab invite USER --platform P`` on ``cli``'s lab, in-process (the same group and exit
    path as the script); what it printed. For a lab whose phone relay is running already (the
    first ``qoss lab invite``, a real process, starts it and leaves it to ``qoss lab down``)."""
    done = CliRunner().invoke(app, ["lab", "invite", user, "--platform", platform],
                              env={"QOSS_LAB_DIR": str(cli.root / "lab")})
    assert done.exit_code == 0, (done.exit_code, done.stdout, done.stderr[-3000:])
    printed: dict[str, Any] = json.loads(done.stdout)
    return printed


@pytest.mark.charon
def test_a_phone_joins_from_an_invitation_and_its_sswan_joins_with_charon_cmd(
        new_context: NewContext, tmp_path: Path) -> None:
    from tests.fixtures.stock_client import CharonCmd
    from tests.integration.agent.test_device_join import agent_lab, ping, wait_for

    with agent_lab("qj") as (cli, up):
        invited = json.loads(cli.run("invite", "pat", "--platform", "android").stdout)
        link = invited["link"]
        base = link.split("/ui/join#", 1)[0]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/ui/join#i=[A-Za-z0-9_-]{43}", link), link
        page, watched, sent = phone(new_context)
        join(page, link)
        secret = passphrase(page)
        offered = downloads(page)
        (name,) = offered
        assert name.endswith(".sswan")
        data, media_type = offered[name]
        assert media_type == "application/vnd.strongswan.profile"
        _, private = kept_keys(page, "host-1")
        nothing_leaves(base, sent, *private, secret.encode())
        no_trouble(watched)

        profile = json.loads(data)
        workdir = tmp_path / "device"
        stock = _stock(profile, secret, workdir)
        netns, target = up["device"]["netns"], up["target"]
        inside = target["protected"][0].split("/")[0]
        assert not ping(netns, inside)
        with CharonCmd(netns, tmp_path / "joined", stock, limit=60) as joined:
            joined.type_passphrase()
            assert wait_for(lambda: ping(netns, inside), 20, 0.2), joined.log()[-3000:]
            assert joined.virtual_ip() is not None

        # The same link again, an expired one and a revoked one: each page says so.
        again, again_watched, _ = phone(new_context)
        refused(again, link, "used already")
        expired_link = lab_invite(cli, "quinn", "android")
        host_db = cli.describe()["servers"]["host"]["database_url"]
        set_invitation(host_db, expired_link["id"], expires_at=datetime.now(UTC) - timedelta(seconds=1))
        refused(again, expired_link["link"], "expired")
        revoked_link = lab_invite(cli, "rae", "android")
        set_invitation(host_db, revoked_link["id"], revoked_at=datetime.now(UTC))
        refused(again, revoked_link["link"], "withdrawn")
        no_trouble_but_refusals(again_watched)
    assert Path(_CHARON_CMD).exists()


def _stock(profile: dict[str, Any], secret: str, workdir: Path) -> Any:
    """Everything charon-cmd needs, read from the .sswan alone (and the passphrase the page showed)."""
    import base64

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    from tests.fixtures.stock_client import StockProfile

    workdir.mkdir(parents=True, exist_ok=True)
    ca = x509.load_der_x509_certificate(base64.b64decode(profile["remote"]["cert"]))
    (workdir / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (workdir / "device.p12").write_bytes(base64.b64decode(profile["local"]["p12"]))
    return StockProfile(host=profile["remote"]["addr"], identity=profile["local"]["id"],
                        remote_identity=profile["remote"]["id"], ike_proposal=profile["ike-proposal"],
                        esp_proposal=profile["esp-proposal"], ca_pem=workdir / "ca.pem", p12=workdir / "device.p12",
                        passphrase=secret)
