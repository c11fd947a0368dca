"""Attacks on the agent: each is refused with the same 403, configures nothing on Target, and
leaves one audit record with the reason."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from app.adapters.agent.crypto import CRYPTO, seal
from app.adapters.agent.transport import post_message
from app.adapters.db.refusals import more_refusals
from app.domain.agent import MAX_WIRE_BYTES, AgentRejected, ClientRequest, Kind, RequestInfo
from app.services.agent.client import AgentClient
from app.services.agent.host import HostAgent
from tests.integration.agent.conftest import AgentEnv

pytestmark = pytest.mark.charon

REJECTED = {"error": "AgentRejected", "detail": AgentRejected.PUBLIC}


def post(env: AgentEnv, wire: bytes) -> httpx.Response:
    return httpx.post(f"{env.url}/v1/agent/requests", json={"message": wire.decode("latin-1")}, timeout=30)


def connect_wire(client: AgentClient, objective: int = 3, **info: Any) -> tuple[ClientRequest, bytes]:
    return client.request(Kind.CONNECT, RequestInfo(target="hq", lifetime=600, **info), objective)


def last_audit(env: AgentEnv, n: int = 1) -> list[dict[str, Any]]:
    return [a for a in env.audit() if a["object"] == "/v1/agent/requests"][:n]


def assert_rejected(env: AgentEnv, response: httpx.Response, reason: str) -> None:
    assert response.status_code == 403, response.text
    assert response.json() == REJECTED
    assert env.target_config_empty()
    record = last_audit(env)[0]
    assert record["outcome"] == 403
    assert record["detail"].startswith("AgentRejected: ")
    assert reason in record["detail"]


@pytest.fixture(scope="module")
def alice(agent_env: AgentEnv) -> AgentClient:
    agent_env.enroll("mallory-target", [3])  # someone else, so "unknown user" is not the only user
    agent_env.enroll("alice2", [3])
    return agent_env.client("alice2")


def close(client: AgentClient, env: AgentEnv, answer: bytes, request: ClientRequest) -> None:
    """Close at Target a tunnel a test got configured (the client never brought it up)."""
    response = client.accept(answer, request)
    assert response.tunneling_info is not None
    client._disconnect_remote("hq", response.tunneling_info.ticket, request.objective_id)
    assert env.target_config_empty()


def test_replayed_request_is_refused(agent_env: AgentEnv, alice: AgentClient) -> None:
    request, wire = connect_wire(alice)
    first = post(agent_env, wire)
    assert first.status_code == 200, first.text
    try:
        assert_rejected_but_first_stays(agent_env, post(agent_env, wire))
    finally:
        close(alice, agent_env, first.json()["message"].encode(), request)


def assert_rejected_but_first_stays(env: AgentEnv, response: httpx.Response) -> None:
    assert response.status_code == 403
    assert response.json() == REJECTED
    assert "replayed request" in last_audit(env)[0]["detail"]


def test_fifty_concurrent_copies_exactly_one_accepted(agent_env: AgentEnv, alice: AgentClient) -> None:
    request, wire = connect_wire(alice)
    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(lambda _: post(agent_env, wire), range(50)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] + [403] * 49
    winner = next(a for a in answers if a.status_code == 200)
    sessions = httpx.get(f"{agent_env.url}/v1/agent/sessions", headers=agent_env.admin,
                         params={"state": "active"}, timeout=10).json()
    assert len([s for s in sessions if s["user_id"] == "alice2"]) == 1
    # Two refusals of a kind within the refusal window are one entry and a count: the count is
    # written once the window has closed (at the audit writer's next pass).
    deadline = time.monotonic() + 10
    while True:
        details = [a["detail"] for a in last_audit(agent_env, 50)]
        replays = sum(more_refusals(d) or 1 for d in details if "AgentRejected: replayed request" in d)
        if replays >= 49 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert replays == 49, details
    assert sum(d.startswith("relayed connect user=alice2") for d in details) == 1
    close(alice, agent_env, winner.json()["message"].encode(), request)


def test_every_single_bit_flip_is_refused(agent_env: AgentEnv, alice: AgentClient) -> None:
    """All bits of a sealed request, straight into Host (fast); a sample of them over HTTP for the audit."""
    host: HostAgent = agent_env.server.config.app.state.runtime.agent_host  # type: ignore[attr-defined]
    request, wire = connect_wire(alice)
    reasons: dict[str, int] = {}
    for bit in range(len(wire) * 8):
        flipped = bytearray(wire)
        flipped[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(AgentRejected) as caught:
            host.handle(bytes(flipped))
        reasons[caught.value.reason.split(" ")[0]] = reasons.get(caught.value.reason.split(" ")[0], 0) + 1
    assert sum(reasons.values()) == len(wire) * 8
    assert agent_env.target_config_empty()
    sample = range(3, len(wire) * 8, len(wire) * 8 // 40)
    for bit in sample:
        flipped = bytearray(wire)
        flipped[bit // 8] ^= 1 << (bit % 8)
        response = post(agent_env, bytes(flipped))
        assert response.status_code in (403, 422), response.text  # 422: the flip broke the JSON of the HTTP body
        if response.status_code == 403:
            assert response.json() == REJECTED
    records = last_audit(agent_env, len(sample))
    assert len(records) == len(sample)
    assert all(r["outcome"] in (403, 422) and r["detail"] for r in records)
    # The genuine request was never consumed by the flips.
    good = post(agent_env, wire)
    assert good.status_code == 200, good.text
    close(alice, agent_env, good.json()["message"].encode(), request)


def test_wrong_recipient(agent_env: AgentEnv, alice: AgentClient) -> None:
    # Sealed to Host's key but addressed (in the header) to someone else.
    request = ClientRequest(kind=Kind.CONNECT, request_id=b"r" * 16, user_id="alice2", objective_id=3,
                            request_info=RequestInfo(target="hq"), host="hq", timestamp=int(time.time()))
    wire = seal(kind=Kind.CONNECT, to="elsewhere", body=request.body(), signer=alice.keys,
                recipient=alice.host_keys.kem)
    assert_rejected(agent_env, post(agent_env, wire), "wrong recipient")
    # Signed for another host, sealed to this one.
    request = ClientRequest(kind=Kind.CONNECT, request_id=b"s" * 16, user_id="alice2", objective_id=3,
                            request_info=RequestInfo(target="hq"), host="other-host", timestamp=int(time.time()))
    wire = seal(kind=Kind.CONNECT, to="hq", body=request.body(), signer=alice.keys, recipient=alice.host_keys.kem)
    assert_rejected(agent_env, post(agent_env, wire), "signed for another host")


def test_expired_and_future_timestamps(agent_env: AgentEnv, alice: AgentClient) -> None:
    for offset, reason in ((-120, "expired timestamp"), (+120, "timestamp in the future")):
        late = AgentClient(config=alice.config, keys=alice.keys, crypto=CRYPTO, vici=alice.vici, post=post_message,
                           clock=lambda offset=offset: time.time() + offset)
        _, wire = connect_wire(late)
        assert_rejected(agent_env, post(agent_env, wire), reason)


def test_unknown_user(agent_env: AgentEnv) -> None:
    agent_env.keygen("stranger")
    stranger = agent_env.client("stranger")
    _, wire = connect_wire(stranger)
    assert_rejected(agent_env, post(agent_env, wire), "unknown user")


def test_impostor_signature(agent_env: AgentEnv, alice: AgentClient) -> None:
    """Someone with their own keys claiming to be alice2."""
    keys = agent_env.keygen("impostor")
    request = ClientRequest(kind=Kind.CONNECT, request_id=b"i" * 16, user_id="alice2", objective_id=3,
                            request_info=RequestInfo(target="hq"), host="hq", timestamp=int(time.time()))
    wire = seal(kind=Kind.CONNECT, to="hq", body=request.body(), signer=keys, recipient=alice.host_keys.kem)
    assert_rejected(agent_env, post(agent_env, wire), "bad signature")


def test_objective_not_allowed(agent_env: AgentEnv, alice: AgentClient) -> None:
    _, wire = connect_wire(alice, objective=2)
    assert_rejected(agent_env, post(agent_env, wire), "objective 2 not allowed")


def test_revoked_user_loses_tunnels_and_access(agent_env: AgentEnv) -> None:
    agent_env.enroll("bob", [3])
    bob = agent_env.client("bob")
    report = bob.connect(target="hq", objective_id=3)
    assert report["conn"] in agent_env.target_vici.list_conns()
    r = httpx.delete(f"{agent_env.url}/v1/agent/users/bob", headers=agent_env.admin, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["targets"] == {"hq": "confirmed: 1 tunnels closed"}
    assert agent_env.target_config_empty()
    assert not agent_env.target_vici.list_sas(ike=report["conn"])
    _, wire = connect_wire(bob)
    assert_rejected(agent_env, post(agent_env, wire), "revoked user")
    bob.disconnect()  # the client cleans its own side; Target no longer knows the ticket
    assert report["conn"] not in agent_env.client_vici.list_conns()


def test_response_replayed_to_client(agent_env: AgentEnv, alice: AgentClient) -> None:
    first_request, first_wire = connect_wire(alice)
    first = post(agent_env, first_wire)
    assert first.status_code == 200
    old_answer = first.json()["message"].encode()
    second_request, _ = connect_wire(alice)
    before = set(agent_env.client_vici.list_conns())
    with pytest.raises(AgentRejected, match="rejected") as caught:
        alice.accept(old_answer, second_request)
    assert caught.value.reason == "the response answers another request"
    assert set(agent_env.client_vici.list_conns()) == before
    close(alice, agent_env, old_answer, first_request)


def test_oversized_and_garbage_messages(agent_env: AgentEnv) -> None:
    r = httpx.post(f"{agent_env.url}/v1/agent/requests", json={"message": "x" * (MAX_WIRE_BYTES + 1)}, timeout=10)
    assert r.status_code == 422
    for junk in ("{}", "not json", '{"kind":"connect","sealed":"","to":"hq","v":1}', "\u00e9" * 10):
        r = httpx.post(f"{agent_env.url}/v1/agent/requests", json={"message": junk}, timeout=10)
        assert r.status_code == 403, (junk, r.text)
        assert r.json() == REJECTED
    assert agent_env.target_config_empty()


Run = Callable[[], None]
