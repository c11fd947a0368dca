"""A row edited in the console from a grid older than the table: saved over a colleague's newer
edit of other rows or fields (the whole grid answered at the new revision, its status line
saying so), or refused naming the field both changed with both values, to keep theirs or
re-apply mine; the grid never shows an older revision's values under a newer heading."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest

from tests.ui.conftest import HTMX, sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
TABLE = "/ui/tables/esaf-2006"
MD5 = f"{TABLE}/ratings/md5"
#: md5 as shipped in esaf-2006, as its edit form holds it.
#: md5 as shipped: an integrity algorithm, so its forms carry no confidentiality or key exchange.
SHIPPED = {"integrity": "2", "performance": "9.0"}


async def _colleague(client: httpx.AsyncClient, token: str, algorithm: str, body: dict[str, object],
                     revision: int = 1) -> None:
    r = await client.patch(f"/v1/rating-tables/esaf-2006/ratings/{algorithm}", json=body,
                           headers={"If-Match": f'"{revision}"', "Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text


async def _md5_form(client: httpx.AsyncClient, csrf: str, **fields: str) -> dict[str, str]:
    """md5's edit form as the admin fills it, opened at revision 1 (before the colleague's edit)."""
    form = (await client.get(f"{MD5}/edit", headers=HTMX)).text
    reason = re.search(r'name="reason" rows="3">([^<]*)</textarea>', form)
    assert reason is not None
    return {"csrf": csrf, "revision": "1", **SHIPPED, "reason": reason.group(1), **fields}


def _cells(html: str, algorithm: str) -> list[str]:
    row = html.split(f'<tr id="row-{algorithm}"', 1)[1].split("</tr>", 1)[0]
    return re.findall(r'<td class="num">([^<]*)</td>', row)


async def test_a_row_saved_from_an_older_grid_is_merged_and_the_whole_grid_moves_to_the_new_revision(
        browser: Browser, token: Callable[..., str]) -> None:
    admin = browser()
    csrf = await sign_in(admin, token("alice"))
    form = await _md5_form(admin, csrf, integrity="1")
    await _colleague(admin, token("bob"), "aes128", {"confidentiality": 7})
    saved = await admin.post(MD5, headers=HTMX, data=form)
    assert saved.status_code == 200, saved.text
    assert (saved.headers["hx-retarget"], saved.headers["hx-reswap"]) == ("#grid-rows", "outerHTML")
    html = saved.text
    assert html.lstrip().startswith('<tbody id="grid-rows" data-events="rating_table.revision')  # it follows too
    assert '<tr id="row-md5" class="saved">' in html
    assert _cells(html, "md5")[1] == "1" and _cells(html, "aes128")[0] == "7"  # noqa: PT018  # bob's value shown
    assert '<span id="table-revision" class="muted" hx-swap-oob="true">revision 3</span>' in html
    assert re.search(r"Your edit of md5 is saved in revision 3, merged with what others saved since revision 1 "
                     r"\(aes128; bob saved revision 2 at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)\. "
                     r"The grid shows revision 3\.", html)
    assert '<a class="button" href="/ui/tables/esaf-2006/ratings/md5/edit"' in html  # the saved row's Edit: focused
    assert re.search(r'hx-get="/ui/tables/esaf-2006/ratings/md5/edit"[^>]*autofocus>Edit', html)
    api = (await admin.get("/v1/rating-tables/esaf-2006")).json()
    rows = {r["algorithm"]: r for r in api["ratings"]}
    assert (api["revision"], rows["md5"]["integrity"], rows["aes128"]["confidentiality"]) == (3, 1, 7)


async def test_without_javascript_a_merged_save_says_so_on_the_grid(
        browser: Browser, token: Callable[..., str]) -> None:
    admin = browser()
    csrf = await sign_in(admin, token())
    form = await _md5_form(admin, csrf, integrity="1")
    await _colleague(admin, token("bob"), "aes128", {"confidentiality": 7})
    saved = await admin.post(MD5, data=form)
    assert (saved.status_code, saved.headers["location"]) == (303, f"{TABLE}?saved=md5&over=1#row-md5")
    grid = (await admin.get(saved.headers["location"])).text
    assert 'id="table-revision" class="muted">revision 3<' in grid
    assert "merged with what others saved since revision 1 (aes128; bob saved revision 2 at " in grid
    assert '<tr id="row-md5" class="saved">' in grid


async def test_a_preview_from_an_older_grid_shows_the_row_as_saving_would_make_it(
        browser: Browser, token: Callable[..., str]) -> None:
    admin = browser()
    csrf = await sign_in(admin, token())
    form = await _md5_form(admin, csrf, integrity="1")
    await _colleague(admin, token("bob"), "md5", {"performance": 8.5})  # the same row, another field
    shown = await admin.post(f"{MD5}/preview", headers=HTMX, data=form)
    assert shown.status_code == 200, shown.text
    assert "You started from revision 1; revision 2 is current." in shown.text
    assert re.search(r"performance</th>\s*<td>8.5</td>\s*<td>8.5</td>", shown.text)  # theirs, kept
    assert re.search(r"integrity</th>\s*<td>2</td>\s*<td>1</td>", shown.text)  # mine
    save = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"',
                           shown.text.split(f'action="{MD5}"', 1)[1].split("</form>", 1)[0]))
    assert save == form  # what the admin typed, on the revision they started from
    assert (await admin.get("/v1/rating-tables/esaf-2006")).json()["revision"] == 2


async def test_the_same_field_changed_by_both_is_a_conflict_naming_it_with_both_values(
        browser: Browser, token: Callable[..., str]) -> None:
    admin = browser()
    csrf = await sign_in(admin, token())
    form = await _md5_form(admin, csrf, integrity="1", reason="collisions in seconds")
    await _colleague(admin, token("bob"), "md5", {"integrity": 3})
    await _colleague(admin, token("bob"), "aes128", {"confidentiality": 7}, revision=2)
    conflict = await admin.post(MD5, headers=HTMX, data=form)
    assert conflict.status_code == 409
    assert conflict.headers["hx-retarget"] == "#grid-rows"
    html = conflict.text
    assert '<tr id="row-md5" class="conflict">' in html
    assert "integrity is 3 in revision 3 (theirs); you entered 1; it was 2 in revision 1." in html
    assert "You started from revision 1; revision 3 is current now. Nothing of yours was saved." in html
    # who made the other change of md5, and when (bob's later edit of aes128 is not md5's)
    assert re.search(r"md5 changed while you edited it: bob saved revision 2 at "
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\.</strong>", html)
    assert re.search(r"integrity</th>\s*<td>3</td>\s*<td>1</td>\s*<td>2</td>", html)
    assert _cells(html, "aes128")[0] == "7"  # no row keeps revision 1's values under revision 3's heading
    assert '<span id="table-revision" class="muted" hx-swap-oob="true">revision 3</span>' in html
    forms = {m.group(2): dict(re.findall(r'name="([^"]+)" value="([^"]*)"', m.group(1)))
             for m in re.finditer(r'<form class="inline"(.*?)<button type="submit"[^>]*>([^<]+)</button>', html,
                                  re.DOTALL)}
    reason = {"reason": "collisions in seconds"}
    assert forms["Re-apply mine over revision 3"] == {"csrf": csrf, "revision": "3", **SHIPPED, "integrity": "1",
                                                      **reason}
    # keeping theirs keeps my other change (the reason), previewed over revision 3
    assert forms["Keep theirs"] == {"csrf": csrf, "revision": "3", **SHIPPED, "integrity": "3", **reason}
    assert (await admin.get("/v1/rating-tables/esaf-2006")).json()["revision"] == 3
    kept = await admin.post(f"{MD5}/preview", headers=HTMX, data=forms["Keep theirs"])
    assert kept.status_code == 200 and 'class="preview"' in kept.text  # noqa: PT018
    again = await admin.post(MD5, headers=HTMX, data=forms["Re-apply mine over revision 3"])
    assert again.status_code == 200
    rows = {r["algorithm"]: r for r in (await admin.get("/v1/rating-tables/esaf-2006")).json()["ratings"]}
    assert (rows["md5"]["integrity"], rows["md5"]["reason"], rows["aes128"]["confidentiality"]) == (
        1, "collisions in seconds", 7)


async def test_a_conflict_over_a_row_removed_since_offers_only_to_keep_theirs(
        browser: Browser, token: Callable[..., str]) -> None:
    admin = browser()
    csrf = await sign_in(admin, token())
    form = await _md5_form(admin, csrf, integrity="1")
    api = {"Authorization": f"Bearer {token('bob')}"}
    table = (await admin.get("/v1/rating-tables/esaf-2006")).json()
    document = {"name": "esaf-2006", "description": table["description"], "source": table["source"],
                "ratings": [r for r in table["ratings"] if r["algorithm"] != "md5"]}
    assert (await admin.put("/v1/rating-tables/esaf-2006", json=document,
                            headers={**api, "If-Match": '"1"'})).status_code == 200
    conflict = await admin.post(MD5, headers=HTMX, data=form)
    assert conflict.status_code == 409
    assert "md5 was removed from the table in revision 2: nothing to edit." in conflict.text
    assert "Re-apply mine" not in conflict.text
    assert f'href="{TABLE}">Keep theirs</a>' in conflict.text


async def test_htmx_opens_a_rows_form_at_the_revision_the_grid_shows(
        browser: Browser, token: Callable[..., str]) -> None:
    admin = browser()
    await sign_in(admin, token())
    grid = (await admin.get(TABLE)).text
    assert f"""hx-get="{MD5}/edit" hx-vals='{{"revision": 1}}'""" in grid
    await _colleague(admin, token("bob"), "md5", {"integrity": 3})
    form = (await admin.get(f"{MD5}/edit", params={"revision": "1"}, headers=HTMX)).text
    assert 'name="revision" value="1"' in form and 'name="integrity" type="number"' in form  # noqa: PT018
    assert re.search(r'name="integrity" type="number" min="0" max="10" step="1"\s*value="2"', form)
    current = (await admin.get(f"{MD5}/edit", headers=HTMX)).text  # without it: the current revision
    assert 'name="revision" value="2"' in current
