"""Each peer held to its own rate (``peer_rate``/``peer_burst``) once its message shows who sent it,
beside each source address's limit before the message is opened: one peer's flood is refused 429 with
Retry-After and never acted on, another peer behind the same address goes on, and the flood is a few
audit entries that count it, on the fast path as on the full stack."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from app.adapters.agent.crypto import KeyPair
from app.services.peering.responder import PeeredResponder
from app.settings import Settings
from tests.api.test_peering_messages import _A, Calls, _offer, _register, _sealed
from tests.api.test_refusal_flood import ATTACKER, counted, rows
from tests.fixtures.peering import site_b_app

pytestmark = pytest.mark.anyio

_C = KeyPair.generate("site-c")
#: An offer nothing meets: answered 409 by this side's own requirement, nothing loaded anywhere.
_HIGH = {"confidentiality": 10, "integrity": 10}
ELSEWHERE = "198.51.100.9"


@contextlib.asynccontextmanager
async def site_b(settings: Settings, admin_token: str, *, full_stack: bool,
                 **limits: Any) -> AsyncIterator[tuple[Callable[[str], httpx.AsyncClient], dict[str, Any]]]:
    """Site B (``full_stack``: with ``fast_paths`` off) with site-a and site-c registered, under
    ``limits``; a client per source address, and B's identity. No message may reach a charon."""
    calls = Calls()
    async with (site_b_app(settings, vici_factory=calls, fast_paths=not full_stack, **limits) as app,
                contextlib.AsyncExitStack() as open_clients):
        def client(address: str) -> httpx.AsyncClient:
            made = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 40_000)),
                                     base_url="http://q.test")
            open_clients.push_async_callback(made.aclose)
            return made
        admin = client("203.0.113.1")
        admin.headers["Authorization"] = f"Bearer {admin_token}"
        await _register(admin)
        identity = await _register(admin, _C, "site-c")
        yield client, identity
    assert calls.asked == []


def _from(peer: str, identity: dict[str, Any]) -> bytes:
    """A fresh offer from ``peer`` (site-a or site-c) that nothing meets."""
    return _sealed(identity, _offer(sender=peer, min_levels=_HIGH), keys=_C if peer == "site-c" else _A)


async def _post(c: httpx.AsyncClient, data: bytes) -> httpx.Response:
    return await c.post("/v1/peering/messages", content=data, headers={"content-type": "application/json"})


@pytest.fixture
def acted_on(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The senders of the offers this side acted on (chose for), in order."""
    seen: list[str] = []
    answer = PeeredResponder.answer_offer

    def counting(self: PeeredResponder, received: Any, *rest: Any) -> Any:
        seen.append(received.peer.name)
        return answer(self, received, *rest)
    monkeypatch.setattr(PeeredResponder, "answer_offer", counting)
    return seen


@pytest.mark.parametrize("full_stack", [False, True], ids=["fast-path", "full-stack"])
async def test_one_peer_flooding_is_held_back_while_another_behind_the_same_address_goes_on(
        settings: Settings, admin_token: str, acted_on: list[str], full_stack: bool) -> None:
    async with site_b(settings, admin_token, full_stack=full_stack, peer_burst=5, peer_rate=0.01,
                      agent_burst=1000, agent_rate=0.01) as (client, identity):
        attacker = client(ATTACKER)
        answers = [await _post(attacker, _from("site-a", identity)) for _ in range(100)]
        assert [a.status_code for a in answers[:5]] == [409] * 5
        assert {a.status_code for a in answers[5:]} == {429}
        assert answers[-1].json() == {"error": "RateLimited", "detail": "rate limit exceeded for this peer"}
        assert 1 <= int(answers[-1].headers["retry-after"]) <= 100
        # Another peer from the same address has its own budget; site-a's holds from any address.
        assert [(await _post(attacker, _from("site-c", identity))).status_code for _ in range(6)] == [409] * 5 + [429]
        assert (await _post(client(ELSEWHERE), _from("site-a", identity))).status_code == 429
    assert acted_on == ["site-a"] * 5 + ["site-c"] * 5  # a message past its peer's limit is never acted on
    entries, _, intact = rows(settings.database_url)
    limited = [e for e in entries if e["outcome"] == 429]
    assert {e["detail"].rsplit("; ", 1)[-1] for e in limited} == {"rate limited: peer=site-a",
                                                                  "rate limited: peer=site-c"}
    assert len(limited) <= 3, limited  # site-a's first and its count, site-c's one
    assert counted(limited, 429) == 96
    assert sum(1 for e in limited if e["detail"].endswith("peer=site-a")) <= 2
    assert intact


@pytest.mark.parametrize("full_stack", [False, True], ids=["fast-path", "full-stack"])
async def test_the_address_limit_comes_first_and_spends_no_peers_budget(
        settings: Settings, admin_token: str, acted_on: list[str], full_stack: bool) -> None:
    async with site_b(settings, admin_token, full_stack=full_stack, peer_burst=4, peer_rate=0.01,
                      agent_burst=3, agent_rate=0.01) as (client, identity):
        attacker = client(ATTACKER)
        assert [(await _post(attacker, _from("site-a", identity))).status_code for _ in range(3)] == [409] * 3
        held = [await _post(attacker, _from("site-a", identity)) for _ in range(20)]
        assert {a.status_code for a in held} == {429}
        assert held[-1].json() == {"error": "RateLimited", "detail": "rate limit exceeded for this address"}
        elsewhere = client(ELSEWHERE)
        # site-a spent 3 of its 4: the 20 its address held back cost it nothing.
        assert [(await _post(elsewhere, _from("site-a", identity))).status_code for _ in range(2)] == [409, 429]
    assert acted_on == ["site-a"] * 4
