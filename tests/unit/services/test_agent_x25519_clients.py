"""A client that seals to Host with X25519 alone, as the browser's device page does (it opens
Target's answer with its X25519 key alone): its enrolment asking for a post-quantum minimum is
refused with the message to enrol from the command line, nothing issued or loaded, even though the
user's enrolled keys have an ML-KEM-768 key; the same enrolment without the minimum is answered
with X25519 alone. And a client takes an answer carrying a post-quantum preshared key only sealed
hybrid. On the fakes of ``test_agent_roles``."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.domain.agent import AgentRejected, Kind, NoPostQuantumKey, RequestInfo, decode_canonical
from app.services.agent.client import AgentClient
from tests.unit.services.test_agent_roles import ALICE, SERVER, Roles, empty
from tests.unit.services.test_agent_roles import device_roles as roles

__all__ = ["roles"]  # the roles whose Target enrols devices, shared


def x25519_client(roles: Roles) -> AgentClient:
    """Alice's client knowing Host by its Ed25519 and X25519 keys only (as the device page does)."""
    host = {k: v for k, v in SERVER.public.as_dict().items() if k != "mlkem_public_key"}
    return roles.client_of("alice", ALICE, state="x25519-state", host=host,
                           target={k: host[k] for k in ("sign_public_key", "kem_public_key")})


def test_an_x25519_client_asking_for_post_quantum_is_told_to_enrol_from_the_command_line(
        roles: Roles, tmp_path: Path) -> None:
    assert ALICE.public.mlkem is not None  # enrolled with one: it is how she asked that counts
    client = x25519_client(roles)
    _, wire = client.request(Kind.CONNECT, RequestInfo(target="hq", min_levels={"post_quantum": 5},
                                                       platform="apple"), 3)
    assert decode_canonical(wire, max_size=len(wire))["v"] == 1
    with pytest.raises(NoPostQuantumKey) as refused:
        roles.host.handle(wire)
    assert "from the command line" in refused.value.message
    assert empty(roles.charon)


def test_an_x25519_client_without_a_post_quantum_minimum_is_answered_with_x25519_alone(
        roles: Roles, tmp_path: Path) -> None:
    client = x25519_client(roles)
    request, wire = client.request(Kind.CONNECT, RequestInfo(target="hq", platform="apple"), 3)
    answer = roles.host.handle(wire).answer
    assert decode_canonical(answer, max_size=len(answer))["v"] == 1
    response = client.accept(answer, request)
    assert response.device is not None


def test_a_client_refuses_a_post_quantum_answer_sealed_with_x25519_alone(roles: Roles) -> None:
    """Target never seals so; were an answer carrying a PPK resealed with X25519 alone (by anyone
    holding Target's signing key), the client would not take it."""
    request, wire = roles.client.request(Kind.CONNECT, RequestInfo(target="hq", min_levels={"post_quantum": 5},
                                                                   platform="apple"), 3)
    answer = roles.host.handle(wire).answer
    kind, body, _ = ALICE.open_sealed(answer, kinds=[Kind.RESPONSE])
    classic = SERVER.seal(kind=kind, to="alice", body=body, recipient=ALICE.public.kem)
    with pytest.raises(AgentRejected) as refused:
        roles.client.accept(classic, request)
    assert refused.value.reason == "a post-quantum preshared key sealed with X25519 alone"
    assert roles.client.accept(answer, request).device is not None
