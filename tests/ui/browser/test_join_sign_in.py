"""Single sign-on on the phone instead of an invitation, in headless chromium as a phone (390 by
844, touch, a phone's user agent) against a served Host and Target over a fake charon and the
suite's real OpenID provider (zitadel/oidc's example OP: :mod:`tests.fixtures.oidc_provider`).

The mapping gives the group ``staff`` the scope ``agent:enroll-device``. A user in it opens
``/ui/join/sign-in``, signs in on the provider's form and lands on the join page with an invitation
for their own user id, made by ``oidc:<name>``; the page makes their keys, enrols the device and
offers the ``.sswan`` and the passphrase; My devices then lists it. A user outside the group is
refused with a page that says so, and nothing is made for them. In-process, with the flow's
attacks: ``tests/ui/test_join_sign_in.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.api.conftest import make_token
from tests.fakes.fake_charon import FakeCharon
from tests.fixtures.agent_roles import SERVER_ID
from tests.fixtures.oidc_provider import OidcUser, RunningProvider
from tests.fixtures.secrets import keep_log
from tests.ui.browser.conftest import (
    BOB,
    CAROL,
    NewContext,
    Watched,
    database_at,
    host_config,
    no_trouble,
    serve_with_provider,
)
from tests.ui.browser.test_phone_join import ANDROID, PHONE, downloads, kept_keys, passphrase

#: The provider's group ``staff`` (alice and bob) may enrol devices; carol's ``contractors`` nothing.
MAPPING = {"groups": {"staff": ["agent:enroll-device"], "qoss-admins": ["admin"]}}


class Served:
    def __init__(self, base: str, database_url: str) -> None:
        self.base, self.database_url = base, database_url
        self.admin = make_token(database_url, "admin", ["admin"])

    def invitations(self) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.base}/v1/agent/invitations", headers={"Authorization": f"Bearer {self.admin}"},
                      timeout=30)
        assert r.status_code == 200, r.text
        listed: list[dict[str, Any]] = r.json()
        return listed


@pytest.fixture(scope="module")
def served(provider: RunningProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    where = tmp_path_factory.mktemp("join-sign-in")
    url = database_at(where)
    config, socket_path = host_config(where)
    with FakeCharon(socket_path):
        try:
            with serve_with_provider(provider, where, url, MAPPING, "serve",
                                     env={"QOSS_AGENT_CONFIG": str(config)}) as (base, _):
                yield Served(base, url)
        finally:
            keep_log(where / "serve.log", "join-sign-in-serve.log")
            keep_log(where / "qoss.db", "join-sign-in-qoss.db")


def phone_sign_in(new_context: NewContext, base: str, user: OidcUser) -> tuple[Page, Watched]:
    """The phone opens the sign-in page, chooses the provider and logs in on its form."""
    page = new_context(**PHONE, user_agent=ANDROID).new_page()
    watched = Watched(page)
    page.context.route(re.compile(r"^http://localhost:\d+/favicon\.ico$"), lambda route: route.fulfill(status=204))
    page.goto(f"{base}/ui/join/sign-in")
    expect(page.locator("#platform-android")).to_be_checked()  # recognised from the browser
    page.get_by_role("button", name="Sign in with Test IdP").tap()
    page.wait_for_url(re.compile(r"^http://localhost:\d+/login/username"))
    page.get_by_label("Username:").fill(user.username)
    page.get_by_label("Password:").fill(user.password)
    page.get_by_role("button", name="Login").tap()
    return page, watched


def test_a_user_in_the_enrolling_group_signs_in_on_the_phone_and_gets_a_profile(
        served: Served, new_context: NewContext) -> None:
    page, watched = phone_sign_in(new_context, served.base, BOB)
    page.wait_for_url(re.compile(r".*/ui/join(#.*)?$"))
    expect(page.locator("#join-status")).to_contain_text("Ready", timeout=30_000)
    page.locator("#join-button").tap()
    passphrase(page)
    offered = downloads(page)
    (name,) = offered
    assert name.endswith(".sswan")
    keys, _ = kept_keys(page, SERVER_ID)
    assert keys.name == "bob"
    (made,) = [i for i in served.invitations() if i["user_id"] == "bob"]
    assert (made["created_by"], made["platform"], made["state"]) == ("oidc:bob@example.test", "android", "used")
    page.goto(f"{served.base}/ui/my-devices")
    expect(page.locator("#device-list [data-state=active]")).to_have_count(1)
    no_trouble(watched)


def test_a_user_outside_the_enrolling_group_is_refused_with_a_page_that_says_so(
        served: Served, new_context: NewContext) -> None:
    page, watched = phone_sign_in(new_context, served.base, CAROL)
    page.wait_for_url(re.compile(r".*/ui/oidc/callback.*|.*/ui/join/oidc/callback$"))
    expect(page.locator("#refused-title")).to_have_text("Not allowed to enrol devices")
    expect(page.locator("#refused")).to_contain_text("not allowed to enrol devices on this network")
    assert not [i for i in served.invitations() if i["user_id"] == "carol"]
    watched.problems = [p for p in watched.problems if "status of 403" not in p]  # the refusal itself
    no_trouble(watched)


def test_the_sign_in_page_needs_no_file_and_no_other_host(served: Served, new_context: NewContext) -> None:
    page = new_context(**PHONE, user_agent=ANDROID).new_page()
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url))
    page.goto(f"{served.base}/ui/join/sign-in")
    expect(page.get_by_role("button", name="Sign in with Test IdP")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert all(url.startswith(f"{served.base}/") for url in sent), sent
