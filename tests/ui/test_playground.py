"""The negotiation playground: the same negotiation as POST /v1/negotiations, explained."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tests.ui.conftest import sign_in

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]


async def test_the_worked_example_gives_aes128_sha1_and_says_why(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token("reader", ["tunnels:read"]))  # any signed-in token may negotiate
    answer = await client.get("/ui/negotiate", params={"run": "true", "table": "esaf-2006", "p1": "client",
                                                       "p1c": "8", "p1i": "4"})
    assert answer.status_code == 200
    peer = {"name": "client", "min_levels": {"confidentiality": 8, "integrity": 4}}
    api = (await client.post("/v1/negotiations", json={"rating_table": "esaf-2006", "peers": [peer]})).json()
    esp = api["proposals"]["esp"]
    assert esp.startswith("aes128-sha1")
    html = answer.text
    assert f'<code class="suite">{esp}</code>' in html
    assert f".esp_proposals = {esp}" in html and f".proposals = {api['ike']['proposal']}" in html  # noqa: PT018
    assert str(api["cost"]) in html
    for alternative in api["alternatives"]:
        assert alternative["proposals"]["esp"] in html
    assert "confidentiality 2 &lt; 8 required by client" in html  # des, and the peer that rejected it


async def test_two_peers_and_a_stored_policy(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token())
    answer = await client.get("/ui/negotiate", params={"run": "true", "p1": "a", "p1policy": "high-security",
                                                       "p2": "b", "p2i": "9", "packet_size": "512"})
    assert answer.status_code == 200
    assert "Chosen suite" in answer.text and 'value="high-security" selected' in answer.text  # noqa: PT018


async def test_an_infeasible_request_names_each_unmet_requirement(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token())
    answer = await client.get("/ui/negotiate", params={"run": "true", "table": "esaf-2006", "p1": "a", "p1c": "10",
                                                       "p1i": "10"})
    assert answer.status_code == 409
    assert "no feasible suite" in answer.text and "Best available" in answer.text  # noqa: PT018


@pytest.mark.parametrize(("params", "status"), [
    ({"p1": "a", "p1c": "eleven"}, 422),
    ({"p1": "a", "p1c": "11"}, 422),
    ({"p1": "<script>"}, 422),
    ({"p1": "a", "table": "no-such-table"}, 404),
    ({}, 422),
])
async def test_bad_input_is_explained_not_a_500(browser: Browser, token: Callable[..., str],
                                                params: dict[str, str], status: int) -> None:
    client = browser()
    await sign_in(client, token())
    answer = await client.get("/ui/negotiate", params={"run": "true", **params})
    assert answer.status_code == status
    assert 'class="error"' in answer.text and "<script>" not in answer.text.replace(  # noqa: PT018
        '<script src="/ui/static/htmx.min.js" defer></script>', "")


async def test_the_form_alone_runs_nothing(browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token())
    answer = await client.get("/ui/negotiate")
    assert answer.status_code == 200 and "Chosen suite" not in answer.text  # noqa: PT018
    assert '<option value="esaf-2006">' in answer.text


@pytest.mark.parametrize(("keyword", "says"), [
    ("des", "des is below the minimum of client: its confidentiality level is 2, client needs at least 8"),
    ("md5", "its integrity level is 2, client needs at least 4"),
    ("sha256", "sha256 meets every minimum but costs more: the cheapest suite with it, aes128-sha256"),
    ("aes128gcm16", "aes128gcm16 is not in the rating table esaf-2006"),
    ("aes128", "aes128 was chosen"),
    ("modp3072", "modp3072 meets every minimum but costs more"),
])
async def test_why_not_an_algorithm(browser: Browser, token: Callable[..., str], keyword: str, says: str) -> None:
    client = browser()
    await sign_in(client, token("reader", ["tunnels:read"]))
    answer = await client.get("/ui/negotiate", params={"run": "true", "table": "esaf-2006", "p1": "client",
                                                       "p1c": "8", "p1i": "4", "why": keyword})
    assert answer.status_code == 200
    assert f"Why not <code>{keyword}</code>?" in answer.text
    assert says in answer.text, answer.text.split('class="why', 1)[1][:600]


async def test_why_not_an_unknown_keyword_is_a_clear_422_and_hostile_text_is_inert(
        browser: Browser, token: Callable[..., str]) -> None:
    client = browser()
    await sign_in(client, token())
    answer = await client.get("/ui/negotiate", params={"run": "true", "p1": "a", "why": "<script>alert(1)</script>"})
    assert answer.status_code == 422
    assert "unknown algorithm" in answer.text and "&lt;script&gt;alert(1)&lt;/script&gt;" in answer.text  # noqa: PT018
    assert "<script>alert" not in answer.text
