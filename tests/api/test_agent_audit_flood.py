"""A flood of anonymous agent messages from one address: held back by the address's limit before
any work (before the sealed message is opened, before the 404 of a role this server does not
play), and recorded as a few audit entries that count it, on the fast path as on the full stack.
A message that is answered still has an audit entry of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.services.agent.host import HostAgent
from app.services.agent.target import Outcome, TargetAgent
from app.settings import Settings
from tests.api.test_refusal_flood import ATTACKER, counted, rows
from tests.api.test_refusal_flood import served as flood_served
from tests.fixtures.agent_roles import agent_server_config

pytestmark = pytest.mark.anyio

GARBAGE = {"message": "qoss-agent-1 nonsense"}
BURST = 20


@asynccontextmanager
async def served(settings: Settings, *, full_stack: bool) -> AsyncIterator[Callable[[str], httpx.AsyncClient]]:
    """The app (``full_stack``: with ``fast_paths`` off), and a client per source address."""
    async with flood_served(settings.model_copy(update={"fast_paths": not full_stack})) as client:
        yield client


def _agent(settings: Settings, tmp_path: Path) -> Settings:
    config, _ = agent_server_config(tmp_path)
    return settings.model_copy(update={"agent_config": config, "agent_burst": BURST, "agent_rate": 0.01})


@pytest.mark.parametrize("full_stack", [False, True], ids=["fast-path", "full-stack"])
async def test_300_garbage_messages_are_held_back_before_any_work_and_counted_in_a_few_entries(
        settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full_stack: bool) -> None:
    opened: list[bytes] = []
    handle = HostAgent.handle

    def counting(self: HostAgent, data: bytes, **kw: Any) -> Outcome:
        opened.append(data)
        return handle(self, data, **kw)

    monkeypatch.setattr(HostAgent, "handle", counting)
    async with served(_agent(settings, tmp_path), full_stack=full_stack) as client:
        attacker = client(ATTACKER)
        statuses = [(await attacker.post("/v1/agent/requests", json=GARBAGE)).status_code for _ in range(300)]
        assert statuses[:BURST] == [403] * BURST
        assert set(statuses[BURST:]) == {429}
        assert len(opened) == BURST  # a message past the limit is never opened
        # Another address is not held back.
        assert (await client("198.51.100.9").post("/v1/agent/requests", json=GARBAGE)).status_code == 403
    entries, _, intact = rows(settings.database_url)
    assert len(entries) <= 4, entries  # the first 403 and 429, and the two counts
    assert counted(entries, 403) == BURST
    assert counted(entries, 429) == 300 - BURST
    assert {e["object"] for e in entries} == {"/v1/agent/requests"}
    assert intact


@pytest.mark.parametrize("full_stack", [False, True], ids=["fast-path", "full-stack"])
async def test_messages_to_a_role_this_server_does_not_play_are_limited_and_counted_too(
        settings: Settings, full_stack: bool) -> None:
    limited = settings.model_copy(update={"agent_burst": BURST, "agent_rate": 0.01})
    async with served(limited, full_stack=full_stack) as client:
        attacker = client(ATTACKER)
        answers = [await attacker.post("/v1/agent/target/requests", json=GARBAGE) for _ in range(300)]
        statuses = [a.status_code for a in answers]
        assert statuses[:BURST] == [404] * BURST
        assert set(statuses[BURST:]) == {429}
        assert answers[0].json()["error"] == "NotFound"
        assert answers[-1].json() == {"error": "RateLimited", "detail": "rate limit exceeded for this address"}
    entries, _, intact = rows(settings.database_url)
    assert len(entries) <= 4, entries
    assert counted(entries, 404) == BURST
    assert counted(entries, 429) == 300 - BURST
    assert intact


@pytest.mark.parametrize("full_stack", [False, True], ids=["fast-path", "full-stack"])
async def test_bodies_refused_before_the_message_is_read_are_counted_too(
        settings: Settings, tmp_path: Path, full_stack: bool) -> None:
    """Not JSON, not a message: the full stack's 422, on either path, counted the same way."""
    async with served(_agent(settings, tmp_path), full_stack=full_stack) as client:
        attacker = client(ATTACKER)
        for body in ([b"{nope"] * 50) + ([b'{"message": 1}'] * 50):
            r = await attacker.post("/v1/agent/requests", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 422
    entries, _, intact = rows(settings.database_url)
    assert len(entries) <= 2, entries
    assert counted(entries, 422) == 100
    assert intact


@pytest.mark.parametrize("full_stack", [False, True], ids=["fast-path", "full-stack"])
async def test_each_answered_message_has_an_entry_of_its_own(
        settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full_stack: bool) -> None:
    answered = iter(range(1000))

    def handle(self: TargetAgent, data: bytes) -> Outcome:
        return Outcome(answer=b"qoss-agent-1 sealed", audit=f"connect user=alice ticket=t{next(answered)}")

    monkeypatch.setattr(TargetAgent, "handle", handle)
    async with served(_agent(settings, tmp_path), full_stack=full_stack) as client:
        peer = client(ATTACKER)
        for _ in range(10):
            r = await peer.post("/v1/agent/target/requests", json={"message": "qoss-agent-1 endorsed"})
            assert r.status_code == 200
    entries, _, intact = rows(settings.database_url)
    assert [(e["outcome"], e["detail"]) for e in entries] == [(200, f"connect user=alice ticket=t{i}")
                                                              for i in range(10)]
    assert len({e["request_id"] for e in entries}) == 10
    assert intact
