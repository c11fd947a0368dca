"""Rating tables reshaped in the console: a row added or removed over If-Match, a YAML file
imported (checked as the API checks it; a bad file changes nothing), a table made from the
latest measurement; refused without ratings:write; hostile text inert."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from html import unescape
from pathlib import Path

import httpx
import pytest
import yaml

from app.settings import Settings
from app.ui.pages import measurements as measurements_page
from tests import REPO_ROOT
from tests.ui.conftest import sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
TABLE = "/ui/tables/esaf-2006"
HOSTILE = '<script>alert(1)</script><img src=x onerror=alert(2)>'
MICRO = REPO_ROOT / "docs" / "measurements" / "micro.json"


def _add(csrf: str, revision: int, **fields: str) -> dict[str, str]:
    row = {"algorithm": "sha512", "confidentiality": "", "integrity": "9", "key_exchange": "",
           "performance": "4", "reason": "added in the console"}
    return {"csrf": csrf, "revision": str(revision), **row, **fields}


async def _api(client: httpx.AsyncClient, name: str = "esaf-2006") -> dict[str, object]:
    answer = (await client.get(f"/v1/rating-tables/{name}")).json()
    assert isinstance(answer, dict)
    return answer


async def test_the_add_form_suggests_only_the_catalogue_keywords_the_table_lacks(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token())
    grid = (await client.get(TABLE)).text
    suggested = set(re.findall(r'<option value="([a-z0-9_]+)">', grid.split('id="missing-algorithms"')[1]))
    assert "sha512" in suggested and "aes128gcm16" in suggested  # noqa: PT018
    assert not suggested & {"aes128", "sha1", "md5"}
    assert 'list="missing-algorithms"' in grid and 'for="add-algorithm"' in grid  # noqa: PT018


async def test_a_row_is_added_over_if_match_and_is_a_revision(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token("alice"))
    answer = await client.post(f"{TABLE}/ratings", data=_add(csrf, 1))
    assert (answer.status_code, answer.headers["location"]) == (303, f"{TABLE}#row-sha512")
    api = await _api(client)
    assert api["revision"] == 2
    assert {"algorithm": "sha512", "integrity": 9, "performance": 4.0,
            "reason": "added in the console"}.items() <= next(
        r for r in api["ratings"] if r["algorithm"] == "sha512").items()  # type: ignore[attr-defined]
    history = (await client.get("/v1/rating-tables/esaf-2006/revisions")).json()
    assert history[-1]["author"] == "alice"
    assert 'id="row-sha512"' in (await client.get(TABLE)).text


async def test_adding_on_an_older_revision_merges_and_a_bad_row_saves_nothing_and_keeps_the_form(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    assert (await client.post(f"{TABLE}/ratings", data=_add(csrf, 1, algorithm="sha256_96"))).status_code == 303
    merged = await client.post(f"{TABLE}/ratings", data=_add(csrf, 1))  # on revision 1: merged over revision 2
    assert (merged.status_code, merged.headers["location"]) == (303, f"{TABLE}?saved=sha512&over=1#row-sha512")
    grid = (await client.get(merged.headers["location"])).text
    assert ("Your edit of sha512 is saved in revision 3, merged with what others saved since revision 1 "
            "(sha256_96; editor saved revision 2 at ") in grid
    stale = await client.post(f"{TABLE}/ratings", data=_add(csrf, 9, algorithm="sha384"))  # no such revision
    assert stale.status_code == 409
    assert "changed while you had it open" in stale.text and "revision 3 is current" in stale.text  # noqa: PT018
    assert 'value="sha384"' in stale.text and 'name="revision" value="3"' in stale.text  # noqa: PT018
    for bad, status, says in (({"algorithm": "nope"}, 422, "unknown algorithm"),
                              ({"integrity": "11"}, 422, "integrity"),
                              ({"algorithm": "sha1"}, 409, "has a row sha1 already")):
        answer = await client.post(f"{TABLE}/ratings", data=_add(csrf, 3, **{"algorithm": "sha384", **bad}))
        assert answer.status_code == status, bad
        assert says in answer.text and 'role="alert"' in answer.text  # noqa: PT018
    assert (await _api(client))["revision"] == 3


async def test_a_row_is_removed_after_a_confirmation_and_stale_removal_is_refused(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    assert f'href="{TABLE}/ratings/md5/remove"' in (await client.get(TABLE)).text
    confirm = await client.get(f"{TABLE}/ratings/md5/remove")
    assert confirm.status_code == 200 and "Remove md5 from esaf-2006?" in confirm.text  # noqa: PT018
    assert 'name="revision" value="1"' in confirm.text
    answer = await client.post(f"{TABLE}/ratings/md5/remove", data={"csrf": csrf, "revision": "1"})
    assert (answer.status_code, answer.headers["location"]) == (303, TABLE)
    api = await _api(client)
    assert api["revision"] == 2 and "md5" not in {r["algorithm"] for r in api["ratings"]}  # type: ignore[attr-defined]  # noqa: PT018
    history = (await client.get("/v1/rating-tables/esaf-2006/revisions")).json()
    assert history[-1]["message"] == "removed md5"
    stale = await client.post(f"{TABLE}/ratings/sha1/remove", data={"csrf": csrf, "revision": "1"})
    assert stale.status_code == 409 and "nothing was saved" in stale.text  # noqa: PT018
    assert (await _api(client))["revision"] == 2


async def test_a_yaml_file_is_imported_as_a_new_table_or_a_new_revision(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    text = (await client.get(f"{TABLE}/export")).text.replace("name: esaf-2006", "name: imported-here")
    answer = await client.post("/ui/tables/import", data={"csrf": csrf, "name": ""},
                               files={"file": ("t.yaml", text.encode(), "application/yaml")})
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/tables/imported-here")
    api = await _api(client, "imported-here")
    assert api["revision"] == 1 and len(api["ratings"]) == 9  # type: ignore[arg-type]  # noqa: PT018
    changed = text.replace("performance: 6", "performance: 7", 1)
    again = await client.post("/ui/tables/import", data={"csrf": csrf, "name": "imported-here", "revision": "1"},
                              files={"file": ("t.yaml", changed.encode(), "application/yaml")})
    assert again.status_code == 303
    assert (await _api(client, "imported-here"))["revision"] == 2


async def test_a_replacement_refused_as_stale_keeps_the_file_for_the_next_try(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    text = (await client.get(f"{TABLE}/export")).text.replace("Niedermayer et al. Table 14", "from the kept file", 1)
    r = await client.patch("/v1/rating-tables/esaf-2006/ratings/des", json={"reason": "a colleague's"},
                           headers={"If-Match": '"1"', "Authorization": f"Bearer {token('bob')}"})
    assert r.status_code == 200, r.text
    stale = await client.post("/ui/tables/import", data={"csrf": csrf, "name": "esaf-2006", "revision": "1"},
                              files={"file": ("t.yaml", text.encode(), "application/yaml")})
    assert stale.status_code == 409
    assert "revision 2 is current now: bob saved revision 2 at " in stale.text
    kept = re.search(r'<textarea name="kept" hidden aria-hidden="true">(.*?)</textarea>', stale.text, re.DOTALL)
    assert kept is not None and unescape(kept.group(1)) == text  # noqa: PT018
    assert re.search(r'id="replace-revision"><input type="hidden" name="revision" value="2">', stale.text)
    assert "The file you chose is kept" in stale.text and 'name="file" type="file"' in stale.text  # noqa: PT018
    assert (await _api(client, "esaf-2006"))["revision"] == 2  # nothing of the file saved
    again = await client.post("/ui/tables/import", data={"csrf": csrf, "name": "esaf-2006", "revision": "2",
                                                         "kept": unescape(kept.group(1))},
                              files={"file": ("", b"", "application/octet-stream")})  # no file chosen
    assert (again.status_code, again.headers["location"]) == (303, f"{TABLE}")
    api = await _api(client, "esaf-2006")
    assert api["revision"] == 3
    assert "from the kept file" in {r["reason"] for r in api["ratings"]}  # type: ignore[union-attr]


@pytest.mark.parametrize(("content", "says"), [
    (b"name: x\nratings: [", "Nothing imported"),
    (b"name: bad-table\nratings:\n  - algorithm: nope\n    performance: 3\n", "nope"),
    (b"\xff\xfe not text", "not UTF-8 text"),
    (b"", "choose a YAML file"),
    (b"a: &a [1]\nb: *a\n", "Nothing imported"),
])
async def test_a_bad_file_gives_a_clear_error_and_changes_nothing(
        browser: Browser, token: Callable[..., str], content: bytes, says: str) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    before = (await client.get("/v1/rating-tables")).json()
    answer = await client.post("/ui/tables/import", data={"csrf": csrf},
                               files={"file": ("bad.yaml", content, "application/yaml")})
    assert answer.status_code == 422
    assert says in answer.text and 'role="alert"' in answer.text  # noqa: PT018
    assert (await client.get("/v1/rating-tables")).json() == before


async def test_importing_over_an_existing_name_is_refused(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    text = (await client.get(f"{TABLE}/export")).text
    answer = await client.post("/ui/tables/import", data={"csrf": csrf},
                               files={"file": ("t.yaml", text.encode(), "application/yaml")})
    assert answer.status_code == 409 and "open that table and import the file there" in answer.text  # noqa: PT018
    assert (await _api(client))["revision"] == 1


async def test_no_measurement_is_said_plainly(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    assert "No measurement yet" in (await client.get("/ui/tables")).text
    page = await client.get("/ui/measurements")
    assert page.status_code == 200 and "No measurement yet" in page.text  # noqa: PT018
    answer = await client.post("/ui/tables/from-measurement", data={"csrf": csrf, "name": "mine"})
    assert answer.status_code == 404 and "no measurement" in answer.text  # noqa: PT018


async def test_a_table_from_the_latest_measurement(browser: Browser, token: Callable[..., str],
                                                   settings: Settings) -> None:
    directory = settings.measurements_dir
    directory.mkdir(parents=True)
    shutil.copy(MICRO, directory / "micro.json")
    (directory / "other.json").write_text(json.dumps({"kind": "something-else"}))
    client = browser()
    csrf = await sign_in(client, token("measurer"))
    page = await client.get("/ui/measurements")
    assert "AMD EPYC" in page.text and "aes128gcm16" in page.text  # noqa: PT018
    plots = re.findall(r'<img src="(/ui/measurements/plots/[0-9a-f]{16}/[a-z_]+\.png)"', page.text)
    assert len(plots) == 3, page.text  # drawn by qoss bench report's own code (the bench extra)
    image = await client.get(plots[0])
    assert (image.status_code, image.headers["content-type"]) == (200, "image/png")
    assert image.content.startswith(b"\x89PNG")
    answer = await client.post("/ui/tables/from-measurement", data={"csrf": csrf, "name": "measured-here",
                                                                    "base": "standards-2026"})
    assert (answer.status_code, answer.headers["location"]) == (303, "/ui/tables/measured-here")
    api = await _api(client, "measured-here")
    aes = next(r for r in api["ratings"] if r["algorithm"] == "aes128")  # type: ignore[attr-defined]
    assert aes["source"] == "measurement" and aes["measurement"]["a_ns_per_byte"] == 0.7409  # noqa: PT018
    history = (await client.get("/v1/rating-tables/measured-here/revisions")).json()
    assert (history[0]["author"], history[0]["message"]) == ("measurer", "imported (measurement)")
    twice = await client.post("/ui/tables/from-measurement", data={"csrf": csrf, "name": "measured-here"})
    assert twice.status_code == 409


async def test_without_matplotlib_the_figures_are_a_table_and_the_page_says_so(
        browser: Browser, token: Callable[..., str], settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.measurements_dir.mkdir(parents=True)
    shutil.copy(MICRO, settings.measurements_dir / "micro.json")
    monkeypatch.setattr(measurements_page, "draw_plots", lambda measured, directory: None)
    client = browser()
    await sign_in(client, token())
    page = (await client.get("/ui/measurements")).text
    assert "Plots need the <code>bench</code> extra" in page and "<img" not in page  # noqa: PT018
    assert "<th scope=\"row\">x25519</th>" in page


async def test_a_token_without_ratings_write_sees_no_form_and_is_refused(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    csrf = await sign_in(client, token("reader", ["tunnels:read"]))
    for path in ("/ui/tables", TABLE):
        html = (await client.get(path)).text
        assert "/ui/tables/import" not in html and "missing-algorithms" not in html  # noqa: PT018
        assert "/remove" not in html and "from-measurement" not in html  # noqa: PT018
    assert (await client.get(f"{TABLE}/ratings/md5/remove")).status_code == 403
    for path, data in ((f"{TABLE}/ratings", _add(csrf, 1)),
                       (f"{TABLE}/ratings/md5/remove", {"csrf": csrf, "revision": "1"}),
                       ("/ui/tables/from-measurement", {"csrf": csrf, "name": "x"})):
        assert (await client.post(path, data=data)).status_code == 403, path
    upload = await client.post("/ui/tables/import", data={"csrf": csrf},
                               files={"file": ("t.yaml", b"name: x\n", "application/yaml")})
    assert upload.status_code == 403
    assert (await _api(client))["revision"] == 1


async def test_an_upload_without_the_csrf_token_is_refused(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token())
    text = (await client.get(f"{TABLE}/export")).text.replace("name: esaf-2006", "name: sneaked-in")
    answer = await client.post("/ui/tables/import", files={"file": ("t.yaml", text.encode(), "application/yaml")})
    assert answer.status_code == 403
    assert (await client.get("/v1/rating-tables/sneaked-in")).status_code == 404


async def test_hostile_text_in_an_added_row_and_an_imported_file_renders_inert(
        browser: Browser, token: Callable[..., str], tmp_path: Path) -> None:
    client = browser()
    csrf = await sign_in(client, token())
    assert (await client.post(f"{TABLE}/ratings", data=_add(csrf, 1, reason=HOSTILE))).status_code == 303
    document = yaml.safe_load((await client.get(f"{TABLE}/export")).text)
    text = yaml.safe_dump({**document, "name": "hostile", "description": HOSTILE})
    assert (await client.post("/ui/tables/import", data={"csrf": csrf},
                              files={"file": ("t.yaml", text.encode(), "application/yaml")})).status_code == 303
    refused = await client.post(f"{TABLE}/ratings", data=_add(csrf, 1, algorithm=HOSTILE, reason=HOSTILE))
    assert refused.status_code == 422  # an unknown keyword, named in the message
    for html in ((await client.get(TABLE)).text, (await client.get("/ui/tables/hostile")).text,
                 (await client.get("/ui/tables")).text, refused.text):
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<script>alert" not in html and "<img" not in html  # noqa: PT018
