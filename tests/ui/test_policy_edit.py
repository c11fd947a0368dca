"""A policy edited in the console: every field, the Objective-ID included, saved over If-Match
(``PUT /v1/policies/{name}``); a concurrent edit shown side by side; refused without
policies:write; hostile text inert."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest

from tests.ui.conftest import sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
PAGE = "/ui/policies/voip"
HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>'


def _form(html: str) -> dict[str, str]:
    """What the browser would post: the edit form's fields as shown (ticked boxes only)."""
    form = html.split('class="policy"', 1)[1]
    fields = {m.group(1): m.group(2) for m in re.finditer(r'<input[^>]*name="([^"]+)"[^>]*value="([^"]*)"', form)
              if "checkbox" not in m.group(0) or " checked" in m.group(0)}
    for name, body in re.findall(r'<select[^>]*name="([^"]+)"[^>]*>(.*?)</select>', form, re.DOTALL):
        chosen = re.search(r'<option value="([^"]*)" selected', body)
        fields[name] = chosen.group(1) if chosen else ""
    for name, text in re.findall(r'<textarea[^>]*name="([^"]+)"[^>]*>(.*?)</textarea>', form, re.DOTALL):
        fields[name] = text
    return fields


async def test_a_policy_is_edited_with_its_objective_id_and_is_a_revision(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("pol", ["policies:write"]))
    html = (await client.get(PAGE)).text
    assert 'for="pol-objective_id"' in html and "O.Data_Exchange_Conf" in html  # noqa: PT018
    form = {**_form(html), "objective_id": "2", "integrity": "6", "deny": "md5 des", "description": "edited"}
    answer = await client.post(PAGE, data=form)
    assert (answer.status_code, answer.headers["location"]) == (303, PAGE)
    api = (await client.get("/v1/policies/voip")).json()
    assert api["revision"] == 2
    policy = api["policy"]
    assert (policy["objective_id"], policy["min_levels"]["integrity"], policy["description"]) == (2, 6, "edited")
    assert set(policy["deny"]) == {"md5", "des"}
    assert {"O.Integrity_Attr_Exch", "O.Non-repudiation"} <= set(policy["objectives"])
    history = (await client.get("/v1/policies/voip/revisions")).json()
    assert history[-1]["author"] == "pol"


async def test_an_invalid_value_is_shown_and_nothing_is_saved(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("pol", ["policies:write"]))
    form = {**_form((await client.get(PAGE)).text), "deny": "nope", "description": "kept in the form"}
    answer = await client.post(PAGE, data=form)
    assert answer.status_code == 422
    assert "Not saved" in answer.text and "nope" in answer.text and "kept in the form" in answer.text  # noqa: PT018
    assert (await client.get("/v1/policies/voip")).json()["revision"] == 1


async def test_a_concurrent_edit_shows_both_values_and_mine_can_be_reapplied(
        browser: Browser, token: Callable[..., str]) -> None:
    alice, bob = browser(), browser()
    await sign_in(alice, token("alice", ["policies:write"]))
    await sign_in(bob, token("bob", ["policies:write"]))
    alice_form, bob_form = _form((await alice.get(PAGE)).text), _form((await bob.get(PAGE)).text)
    assert (await bob.post(PAGE, data={**bob_form, "confidentiality": "5"})).status_code == 303
    conflict = await alice.post(PAGE, data={**alice_form, "confidentiality": "9"})
    assert conflict.status_code == 409
    assert "voip changed while you edited it" in conflict.text and "revision 2 is current" in conflict.text  # noqa: PT018
    assert re.search(r"Saved since: bob saved revision 2 at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\.", conflict.text)
    assert re.search(r'class="differs"><th scope="row">Confidentiality ≥</th>\s*<td>5</td><td>9</td>', conflict.text)
    assert (await alice.get("/v1/policies/voip")).json()["revision"] == 2
    box = conflict.text.split('class="conflict-box"', 1)[1].split("</section>", 1)[0]
    reapply = {m.group(1): m.group(2) for m in re.finditer(r'name="([^"]+)" value="([^"]*)"', box)}
    assert reapply["revision"] == "2"
    assert (await alice.post(PAGE, data=reapply)).status_code == 303
    api = (await alice.get("/v1/policies/voip")).json()
    assert (api["revision"], api["policy"]["min_levels"]["confidentiality"]) == (3, 9)


async def test_without_policies_write_the_policy_is_read_only_and_a_forged_post_refused(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token("reader", ["tunnels:read"]))
    html = (await client.get(PAGE)).text
    assert "<fieldset disabled>" in html and ">Preview<" not in html  # noqa: PT018
    forged = await client.post(PAGE, data={"csrf": csrf, "revision": "1", "description": "forged"})
    assert forged.status_code == 403
    assert (await client.get("/v1/policies/voip")).json()["revision"] == 1


async def test_hostile_text_in_a_policy_renders_inert(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("pol", ["policies:write"]))
    form = {**_form((await client.get(PAGE)).text), "description": HOSTILE}
    assert (await client.post(PAGE, data=form)).status_code == 303
    stale = await client.post(PAGE, data={**form, "allow": HOSTILE})  # both a conflict and an invalid keyword
    for html in ((await client.get(PAGE)).text, stale.text, (await client.get("/ui/policies")).text):
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<script>alert" not in html and "<img" not in html  # noqa: PT018
