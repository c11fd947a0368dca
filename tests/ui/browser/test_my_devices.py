"""My devices on the phone (``/ui/my-devices``), in headless chromium as a phone (390 by 844, touch,
a phone's user agent), against a served Host and Target over a fake charon.

The phone joins from an invitation (the join page keeps its keys in this browser through its own
module, phone-keys.js); My devices then lists the device as active, revokes it once the user
confirms (touch), and shows it revoked, as the administrator's listing does; the confirmation
is kept back with the keyboard (Escape) and the focus returns to the button. A browser with no
keys is told to ask for a new invitation; a request that fails or takes too long is told in the
user's words. Every request goes to Host alone and none carries a private key. Against real
charons and a stock client: ``tests/integration/agent/test_my_devices.py``.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, Route, expect

from tests.api.conftest import make_token
from tests.fixtures.agent_roles import SERVER_ID
from tests.ui.browser.conftest import NewContext, no_trouble
from tests.ui.browser.test_phone_join import (
    Host,
    host,  # the served Host over a fake charon, shared
    join,
    kept_keys,
    nothing_leaves,
    passphrase,
    phone,
)

__all__ = ["host"]


@pytest.fixture
def joined(host: Host, new_context: NewContext) -> tuple[Page, list[bytes], str]:
    """A phone that joined from an invitation: its page, its private keys, the user."""
    page, _, _ = phone(new_context)
    user = f"mia-{uuid.uuid4().hex[:10]}"  # a user of its own: the host is shared by the module's tests
    link, _ = host.invite(user, "android")
    join(page, link)
    passphrase(page)
    _, private = kept_keys(page, SERVER_ID)
    return page, private, user


def devices(host: Host, user: str) -> dict[str, str]:
    """ticket -> state, as the administrator's listing says."""
    r = httpx.get(f"{host.base}/v1/agent/users/{user}/devices", headers={"Authorization": f"Bearer {host.admin}"},
                  timeout=30)
    assert r.status_code == 200, r.text
    return {d["ticket"]: d["state"] for d in r.json()["devices"]}


def test_the_phone_lists_its_device_and_revokes_it_after_confirming(
        host: Host, joined: tuple[Page, list[bytes], str]) -> None:
    page, private, user = joined
    sent: list[str] = []
    bodies: list[bytes] = []
    page.on("request", lambda r: (sent.append(r.url), bodies.append(r.post_data_buffer or b"")))
    page.goto(f"{host.base}/ui/my-devices")
    (ticket,) = devices(host, user)
    row = page.locator(f"#device-{ticket}")
    expect(row).to_have_attribute("data-state", "active")
    expect(row).to_contain_text("Active: it can connect.")
    expect(page.locator("#devices-status")).to_contain_text("1 of your devices can connect")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways scrolling
    row.get_by_role("button", name="Revoke").tap()
    expect(page.locator("#confirm")).to_be_visible()
    expect(page.locator("#confirm-what")).to_contain_text("loses its VPN connection now")
    assert devices(host, user) == {ticket: "active"}  # nothing happens before the user confirms
    page.locator("#confirm-revoke").tap()
    expect(page.locator(f"#device-{ticket}")).to_have_attribute("data-state", "revoked")
    expect(page.locator("#devices-status")).to_contain_text("The device is revoked")
    expect(page.locator(f"#device-{ticket}")).to_contain_text("device revoked by its user")
    assert page.locator(f"#device-{ticket} button").count() == 0
    assert devices(host, user) == {ticket: "revoked"}
    assert sent
    assert all(url.startswith(f"{host.base}/") for url in sent), sent
    assert not any(key in body for key in private for body in bodies)


def test_the_confirmation_is_kept_back_with_the_keyboard(host: Host, joined: tuple[Page, list[bytes], str]) -> None:
    page, _, user = joined
    page.goto(f"{host.base}/ui/my-devices")
    (ticket,) = devices(host, user)
    button = page.locator(f"#device-{ticket}").get_by_role("button", name="Revoke")
    button.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#confirm-revoke")).to_be_focused()
    page.keyboard.press("Escape")
    expect(page.locator("#confirm")).to_be_hidden()
    expect(button).to_be_focused()
    assert devices(host, user) == {ticket: "active"}


def test_a_browser_without_keys_is_told_to_ask_for_a_new_invitation(host: Host, new_context: NewContext) -> None:
    page, watched, sent = phone(new_context)
    page.goto(f"{host.base}/ui/my-devices")
    expect(page.locator("#no-keys")).to_be_visible()
    expect(page.locator("#no-keys")).to_contain_text("ask your administrator for a new invitation")
    assert page.locator("#devices").is_hidden()
    assert not [r for r in sent if r.url.endswith("/v1/agent/requests")]  # nothing to sign with: nothing sent
    nothing_leaves(host.base, sent)
    no_trouble(watched)


def test_a_request_that_fails_or_never_ends_is_told_in_the_users_words(
        host: Host, joined: tuple[Page, list[bytes], str]) -> None:
    page, _, _ = joined
    page.route("**/v1/agent/requests", lambda route: route.abort())
    page.goto(f"{host.base}/ui/my-devices")
    expect(page.locator("#devices-error")).to_contain_text("cannot be reached. Check this phone's connection")
    page.unroute("**/v1/agent/requests")
    held: list[Route] = []
    page.route("**/v1/agent/requests", lambda route: held.append(route))  # never answered
    page.clock.install()
    page.goto(f"{host.base}/ui/my-devices")
    expect(page.locator("#devices-status")).to_contain_text("Asking the network")
    page.clock.run_for(16_000)
    expect(page.locator("#devices-error")).to_contain_text("did not answer within 15 seconds")
    assert "/ui/" not in page.locator("#devices-error").inner_text()  # no internal path


@pytest.mark.parametrize(("off", "says"), [(3600, "date and time are set automatically"),
                                           (-45, "does not match this phone's clock")],
                         ids=["an-hour-ahead", "behind"])
def test_a_phone_whose_clock_is_wrong_is_told_to_set_it(host: Host, joined: tuple[Page, list[bytes], str],
                                                        off: int, says: str) -> None:
    """An hour ahead, Host refuses the request (as any refusal: the page names the clock first);
    45 s behind, Host takes it but the answer looks as if from the future."""
    page, _, _ = joined
    page.clock.install(time=time.time() + off)
    page.goto(f"{host.base}/ui/my-devices")
    expect(page.locator("#devices-error")).to_contain_text(says)
    assert page.locator("#device-list [data-state]").count() == 0


# --------------------------------------------------------------------------- the lab, a stock client


@pytest.mark.charon
def test_revoking_the_phone_from_its_own_page_ends_its_tunnel_and_its_next_join(
        new_context: NewContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's own test: in the agent lab a phone joins from an invitation, its ``.sswan`` joins
    with the stock ``charon-cmd``; revoking it on My devices ends its tunnel at Target's charon within
    5 s, its next join is refused, and the administrator's listing shows it revoked."""
    from app.adapters.vici.gateway import ViciGateway
    from app.lab.agent import AgentLab
    from tests.fixtures.stock_client import CharonCmd
    from tests.integration.agent.test_device_join import agent_lab, ping, wait_for
    from tests.ui.browser.test_phone_join import _stock, downloads

    with agent_lab("qy") as (cli, up):
        invited = json.loads(cli.run("invite", "uma", "--platform", "android").stdout)
        base = invited["link"].split("/ui/join#", 1)[0]
        page, watched, sent = phone(new_context)
        join(page, invited["link"])
        secret = passphrase(page)
        ((_, (data, _)),) = downloads(page).items()
        _, private = kept_keys(page, "host-1")
        netns, target = up["device"]["netns"], up["target"]
        inside = target["protected"][0].split("/")[0]
        gateway = ViciGateway(target["vici_socket"], 10.0)
        stock = _stock(json.loads(data), secret, tmp_path / "device")
        with CharonCmd(netns, tmp_path / "joined", stock, limit=90) as joined:
            joined.type_passphrase()
            assert wait_for(lambda: ping(netns, inside), 20, 0.2), joined.log()[-3000:]

            page.goto(f"{base}/ui/my-devices")
            active = page.locator("#device-list [data-state=active]")
            expect(active).to_have_count(1)
            active.get_by_role("button", name="Revoke").tap()
            started = time.monotonic()
            page.locator("#confirm-revoke").tap()
            assert wait_for(lambda: not any(s.remote_id == stock.identity for s in gateway.list_sas()), 5.0)
            assert time.monotonic() - started <= 5.0
            expect(page.locator("#device-list [data-state=revoked]")).to_have_count(1)
            assert wait_for(lambda: not joined.alive() or joined.virtual_ip() is None, 5.0), joined.log()[-2000:]
        assert not ping(netns, inside)
        again = CharonCmd(netns, tmp_path / "again", stock, limit=30)
        with again:
            again.type_passphrase()
            assert again.wait_exit(20) not in (None, 0), again.log()[-2000:]

        agent = AgentLab(cli.root / "lab" / "agent")
        monkeypatch.setenv("QOSS_STATE_DIR", str(agent.state_dir / "var"))  # Host's audit chain key
        admin = make_token(agent.database_url(agent.host_server), "lab-admin", ["agent:enroll"])
        listed = httpx.get(f"{base}/v1/agent/users/uma/devices", headers={"Authorization": f"Bearer {admin}"},
                           timeout=30).json()
        assert [d["state"] for d in listed["devices"]] == ["revoked"]
        nothing_leaves(base, sent, *private, secret.encode())
        no_trouble(watched)
