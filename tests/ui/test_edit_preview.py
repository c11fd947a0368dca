"""An edit's impact shown before it is saved: a rating row's and a policy's edit is previewed
(the running tunnels it would leave below their minimums, those it would merely give another
choice, how many stay, each with its old and new suite), nothing saved; then saved over the
same revision, cancelled, or refused as a conflict when the table changed meanwhile; removing
a row is asked with its impact. Running tunnels on a fake charon that speaks VICI."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.settings import Settings
from app.ui.pages import common
from tests.fixtures.secrets import register
from tests.ui.conftest import HTMX, client_of, gateway_app, sign_in
from tests.ui.test_policy_edit import _form

pytestmark = pytest.mark.anyio
PSK = "a-pre-shared-key-of-32-characters-or-more"
TABLE = "/ui/tables/standards-2026"
ROW = f"{TABLE}/ratings/aes128gcm16"
#: The edit previewed: aes128gcm16 judged stronger in confidentiality, weaker in integrity.
#: The edit form of aes128gcm16 (an AEAD: confidentiality and integrity, no key exchange).
EDIT = {"confidentiality": "10", "integrity": "5", "performance": "9.33", "reason": "previewed in the console"}
#: Each tunnel's minimums, and what the edit does to it in standards-2026: ``strong`` runs
#: aes128gcm16, now below its integrity 8; ``secret`` runs aes256gcm16, and aes128gcm16 at
#: confidentiality 10 is cheaper; ``sealed`` runs aes256gcm16 too but needs the integrity 8
#: aes128gcm16 loses: it stays.
TUNNELS = {"strong": {"confidentiality": 8, "integrity": 8}, "secret": {"confidentiality": 9, "integrity": 5},
           "sealed": {"confidentiality": 10, "integrity": 8}}


@pytest.fixture
async def running(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Any, httpx.AsyncClient, dict[str, Any]]]:
    """An app with one gateway on a fake charon that brings every conn up, the tunnels of
    :data:`TUNNELS` up to unmanaged peers, and an admin's API client. No rekeyer: the saved
    edit is what is looked at, not the moves that follow it."""
    register(PSK)
    async with gateway_app(settings, tmp_path, rekey=False) as (app, api):
        tunnels = {}
        for n, (label, levels) in enumerate(TUNNELS.items(), start=2):
            r = await api.post("/v1/tunnels", json={
                "initiator": "left", "remote_ts": [f"10.{n}.0.0/24"], "min_levels": levels,
                "peer": {"address": f"10.99.0.{n}", "identity": f"{label}.example", "psk": PSK}})
            assert r.status_code == 201, r.text
            tunnels[label] = r.json()
        yield app, api, tunnels


async def _revision(api: httpx.AsyncClient, path: str = "/v1/rating-tables/standards-2026") -> int:
    return int((await api.get(path)).json()["revision"])


def _esp(document: dict[str, Any]) -> str:
    return str(document["proposals"]["esp"])


def _impact_rows(html: str, kind: str) -> dict[str, tuple[str, str]]:
    """The tunnels a preview lists under ``kind`` (noncompliant, changed): id -> (now, would be)."""
    found = re.search(rf'<table class="compare impact {kind}">(.*?)</table>', html, re.DOTALL)
    if found is None:
        return {}
    return {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r'<tr id="impact-([^"]+)">.*?<td><code>([^<]*)</code></td>\s*<td><code>([^<]*)</code></td>',
        found.group(1), re.DOTALL)}


def _resent(html: str, action: str) -> dict[str, str]:
    """The hidden fields of the form that posts to ``action`` (what its button sends)."""
    form = html.split(f'action="{action}"', 1)[1].split("</form>", 1)[0]
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))


async def _audited(api: httpx.AsyncClient, path: str) -> list[dict[str, Any]]:
    return [e for e in (await api.get("/v1/audit", params={"limit": 100})).json() if e["object"] == path]


async def test_a_rating_edit_is_previewed_with_its_impact_then_saved(
        running: tuple[Any, httpx.AsyncClient, dict[str, Any]], token: Callable[..., str]) -> None:
    app, api, tunnels = running
    strong, secret, sealed = tunnels["strong"], tunnels["secret"], tunnels["sealed"]
    assert (_esp(strong), _esp(secret)) == ("aes128gcm16-x25519", "aes256gcm16-x25519")
    before = await _revision(api)
    async with client_of(app) as client:
        csrf = await sign_in(client, token("editor", ["ratings:write", "tunnels:read"]))
        edit = (await client.get(f"{ROW}/edit")).text
        assert f'action="{ROW}/preview"' in edit and ">Preview</button>" in edit  # noqa: PT018
        shown = await client.post(f"{ROW}/preview", data={"csrf": csrf, "revision": str(before), **EDIT})
        assert shown.status_code == 200, shown.text
        html = shown.text
        assert _impact_rows(html, "noncompliant") == {strong["id"]: ("aes128gcm16-x25519", "aes256gcm16-x25519")}
        assert _impact_rows(html, "changed") == {secret["id"]: ("aes256gcm16-x25519", "aes128gcm16-x25519")}
        assert sealed["id"] not in html
        assert re.search(r"<strong>1</strong> would fall below their minimums,\s*<strong>1</strong> would have a "
                         r"cheaper or different choice,\s*<strong>1</strong> stay as they are", html)
        # the API's own dry run says the same of the same edit
        dry = await api.patch("/v1/rating-tables/standards-2026/ratings/aes128gcm16", params={"dry_run": "true"},
                              json={"confidentiality": 10, "integrity": 5, "reason": "previewed in the console"},
                              headers={"If-Match": f'"{before}"'})
        kinds = {i["tunnel"]: (i["kind"], _esp(i["old"]), i["new"] and _esp(i["new"])) for i in dry.json()["impact"]}
        assert kinds == {strong["id"]: ("noncompliant", "aes128gcm16-x25519", "aes256gcm16-x25519"),
                         secret["id"]: ("cheaper", "aes256gcm16-x25519", "aes128gcm16-x25519"),
                         sealed["id"]: ("stays", _esp(sealed), None)}
        # nothing written: the same revision, no record of a save, the preview's own record says so
        assert await _revision(api) == before
        assert await _audited(api, ROW) == []
        (previewed,) = await _audited(api, f"{ROW}/preview")
        assert (previewed["outcome"], previewed["detail"]) == (200, "preview: nothing saved")
        save = _resent(html, ROW)
        assert save == {"csrf": csrf, "revision": str(before), **EDIT}
        saved = await client.post(ROW, data=save)
        assert (saved.status_code, saved.headers["location"]) == (303, f"{TABLE}#row-aes128gcm16")
    table = (await api.get("/v1/rating-tables/standards-2026")).json()
    assert table["revision"] == before + 1
    row = next(r for r in table["ratings"] if r["algorithm"] == "aes128gcm16")
    assert (row["confidentiality"], row["integrity"], row["reason"]) == (10, 5, "previewed in the console")
    (record,) = await _audited(api, ROW)
    assert (record["token_name"], record["outcome"]) == ("editor", 303)


async def test_the_preview_swaps_the_row_for_htmx_and_cancelling_changes_nothing(
        running: tuple[Any, httpx.AsyncClient, dict[str, Any]], token: Callable[..., str]) -> None:
    app, api, tunnels = running
    before = await _revision(api)
    async with client_of(app) as client:
        csrf = await sign_in(client, token("editor", ["ratings:write"]))
        shown = await client.post(f"{ROW}/preview", data={"csrf": csrf, "revision": str(before), **EDIT},
                                  headers=HTMX)
        assert shown.status_code == 200
        assert shown.text.lstrip().startswith('<tr id="row-aes128gcm16" class="preview">')
        assert f'<code>{tunnels["strong"]["id"]}</code>' in shown.text  # no link without tunnels:read
        assert f'hx-post="{ROW}"' in shown.text
        cancel = re.search(r'<a class="button secondary" href="([^"]+)" hx-get="([^"]+)"[^>]*>Cancel</a>',
                           shown.text)
        assert cancel is not None and cancel.groups() == (f"{TABLE}#row-aes128gcm16", ROW)  # noqa: PT018
        row = await client.get(ROW, headers=HTMX)
        assert 'id="row-aes128gcm16"' in row.text and "previewed in the console" not in row.text  # noqa: PT018
    assert await _revision(api) == before
    assert await _audited(api, ROW) == []


async def test_a_stale_revision_is_a_conflict_at_the_preview_and_at_the_save(
        running: tuple[Any, httpx.AsyncClient, dict[str, Any]], token: Callable[..., str]) -> None:
    app, api, _ = running
    before = await _revision(api)
    async with client_of(app) as alice, client_of(app) as bob:
        csrf = await sign_in(alice, token("alice", ["ratings:write"]))
        bob_csrf = await sign_in(bob, token("bob", ["ratings:write"]))
        html = (await alice.post(f"{ROW}/preview", data={"csrf": csrf, "revision": str(before), **EDIT})).text
        save = _resent(html, ROW)
        theirs = {**EDIT, "reason": "bob's"}
        assert (await bob.post(ROW, data={"csrf": bob_csrf, "revision": str(before), **theirs})).status_code == 303
        for path in (ROW, f"{ROW}/preview"):  # confirming the preview, or previewing again from the old form
            stale = await alice.post(path, data=save)
            assert stale.status_code == 409, path
            assert "aes128gcm16 changed while you edited it" in stale.text
            assert f"revision {before + 1} is current now" in stale.text
            again = _resent(stale.text, f"{ROW}/preview")  # mine, previewed over theirs
            assert again == {**save, "revision": str(before + 1)}
            assert f"Re-apply mine over revision {before + 1}" in stale.text
            assert "reason is &#39;bob&#39;s&#39;" not in stale.text  # values are shown as they are, not quoted
            assert f"reason is bob&#39;s in revision {before + 1} (theirs); you entered previewed in the console" in (
                stale.text)
        assert await _revision(api) == before + 1
        html = (await alice.post(f"{ROW}/preview", data=again)).text
        assert (await alice.post(ROW, data=_resent(html, ROW))).status_code == 303
    assert await _revision(api) == before + 2


async def test_a_bad_value_is_shown_in_the_row_and_nothing_previewed(
        running: tuple[Any, httpx.AsyncClient, dict[str, Any]], token: Callable[..., str]) -> None:
    app, api, _ = running
    before = await _revision(api)
    async with client_of(app) as client:
        csrf = await sign_in(client, token("editor", ["ratings:write"]))
        bad = await client.post(f"{ROW}/preview", data={"csrf": csrf, "revision": str(before),
                                                        **EDIT, "integrity": "11"})
        assert bad.status_code == 422
        assert 'class="editing"' in bad.text and "impact-box" not in bad.text  # noqa: PT018
        assert (await client.post(f"{ROW}/preview", data={"revision": str(before), **EDIT})).status_code == 403
    async with client_of(app) as reader:
        reader_csrf = await sign_in(reader, token("reader", ["tunnels:read"]))
        forged = await reader.post(f"{ROW}/preview", data={"csrf": reader_csrf, "revision": str(before), **EDIT})
        assert forged.status_code == 403
    assert await _revision(api) == before


async def test_a_policy_edit_is_previewed_with_its_impact_then_saved(
        running: tuple[Any, httpx.AsyncClient, dict[str, Any]], token: Callable[..., str]) -> None:
    app, api, _ = running
    r = await api.post("/v1/tunnels", json={
        "initiator": "left", "remote_ts": ["10.9.0.0/24"], "policy": "voip",
        "peer": {"address": "10.99.0.9", "identity": "voip.example", "psk": PSK}})
    assert r.status_code == 201, r.text
    voip = r.json()
    page = "/ui/policies/voip"
    before = await _revision(api, "/v1/policies/voip")
    async with client_of(app) as client:
        await sign_in(client, token("pol", ["policies:write"]))
        html = (await client.get(page)).text
        assert f'action="{page}/preview"' in html
        mine = {**_form(html), "confidentiality": "9"}
        assert mine["revision"] == str(before)
        shown = await client.post(f"{page}/preview", data=mine)
        assert shown.status_code == 200, shown.text
        noncompliant = _impact_rows(shown.text, "noncompliant")
        assert list(noncompliant) == [voip["id"]]
        assert noncompliant[voip["id"]][0] == _esp(voip)
        assert _impact_rows(shown.text, "changed") == {}
        assert re.search(r"<strong>3</strong> stay as they are", shown.text)
        assert re.search(r"<th scope=\"row\">Confidentiality ≥</th><td>6</td><td>9</td>", shown.text)
        assert await _revision(api, "/v1/policies/voip") == before
        assert await _audited(api, page) == []
        save = _resent(shown.text, page)
        assert (save["revision"], save["confidentiality"]) == (str(before), "9")
        assert (await client.post(page, data=save)).status_code == 303
    policy = (await api.get("/v1/policies/voip")).json()
    assert (policy["revision"], policy["policy"]["min_levels"]["confidentiality"]) == (before + 1, 9)


async def test_a_long_impact_shows_its_first_rows_and_counts_the_rest(
        running: tuple[Any, httpx.AsyncClient, dict[str, Any]], token: Callable[..., str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    app, api, _ = running
    monkeypatch.setattr(common, "IMPACT_ROWS", 2)
    voips = []
    for n in (7, 8, 9):
        r = await api.post("/v1/tunnels", json={
            "initiator": "left", "remote_ts": [f"10.{n}.0.0/24"], "policy": "voip",
            "peer": {"address": f"10.99.0.{n}", "identity": f"voip{n}.example", "psk": PSK}})
        assert r.status_code == 201, r.text
        voips.append(r.json()["id"])
    page = "/ui/policies/voip"
    async with client_of(app) as client:
        await sign_in(client, token("pol", ["policies:write"]))
        mine = {**_form((await client.get(page)).text), "confidentiality": "9"}
        shown = await client.post(f"{page}/preview", data=mine)
    assert shown.status_code == 200, shown.text
    assert len(_impact_rows(shown.text, "noncompliant")) == 2
    assert set(_impact_rows(shown.text, "noncompliant")) < set(voips)
    assert re.search(r"<strong>3</strong> would fall below their minimums", shown.text)
    assert "… and 1 more (the API's <code>?dry_run=true</code> lists all of them)" in shown.text


async def test_removing_a_row_is_asked_with_its_impact(
        running: tuple[Any, httpx.AsyncClient, dict[str, Any]], token: Callable[..., str]) -> None:
    app, api, tunnels = running
    before = await _revision(api)
    async with client_of(app) as client:
        await sign_in(client, token("editor", ["ratings:write"]))
        asked = await client.get(f"{ROW}/remove")
        assert asked.status_code == 200
        assert "Remove aes128gcm16 from standards-2026?" in asked.text
        below = _impact_rows(asked.text, "noncompliant")  # without aes128gcm16, strong's suite is unrated
        assert list(below) == [tunnels["strong"]["id"]]
        assert below[tunnels["strong"]["id"]][0] == "aes128gcm16-x25519"
        assert await _revision(api) == before
        removed = await client.post(f"{ROW}/remove", data=_resent(asked.text, f"{ROW}/remove"))
        assert (removed.status_code, removed.headers["location"]) == (303, TABLE)
    assert await _revision(api) == before + 1


async def test_a_preview_names_the_agent_session_an_edit_would_leave_below_its_minimums(
        running: tuple[Any, httpx.AsyncClient, dict[str, Any]], token: Callable[..., str],
        settings: Settings) -> None:
    from tests.api.test_edit_sessions import _record_session

    app, api, _ = running
    ticket = "cd" * 16
    _record_session(settings, ticket)  # alice's session on aes128gcm16, confidentiality 6 at least
    before = await _revision(api)
    current = next(r for r in (await api.get("/v1/rating-tables/standards-2026")).json()["ratings"]
                   if r["algorithm"] == "aes128gcm16")
    weaker = {"confidentiality": "3", "integrity": str(current["integrity"]),
              "key_exchange": "" if current.get("key_exchange") is None else str(current["key_exchange"]),
              "performance": str(current["performance"]), "reason": "previewed: broken"}
    async with client_of(app) as client:
        csrf = await sign_in(client, token("editor", ["ratings:write", "tunnels:read"]))
        shown = await client.post(f"{ROW}/preview", data={"csrf": csrf, "revision": str(before), **weaker})
        assert shown.status_code == 200, shown.text
        table = re.search(r'<table class="compare impact sessions noncompliant">(.*?)</table>', shown.text,
                          re.DOTALL)
        assert table is not None, shown.text
        row = re.search(rf'<tr id="impact-session-{ticket}">(.*?)</tr>', table.group(1), re.DOTALL)
        assert row is not None
        assert "alice" in row.group(1)
        assert "aes128gcm16" in row.group(1)
    assert await _revision(api) == before  # nothing saved
