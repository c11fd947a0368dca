"""The agent's message layer: canonical encoding, round trips, and decoders that only ever raise
AgentRejected, whatever bytes arrive (Hypothesis)."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.adapters.agent.crypto import KeyPair, open_sealed, seal
from app.domain.agent import (
    AgentRejected,
    ClientRequest,
    Endorsement,
    EnrolledUser,
    Kind,
    RequestInfo,
    Response,
    Revocation,
    TunnelingInfo,
    b64d,
    b64e,
    canonical,
    check_fresh,
    decode_canonical,
    parse_wire,
)

HOST = KeyPair.generate("host-1")
USER = KeyPair.generate("alice")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def request(**info: object) -> ClientRequest:
    return ClientRequest(kind=Kind.CONNECT, request_id=b"\x01" * 16, user_id="alice", objective_id=3,
                         request_info=RequestInfo(target="target-1", **info), host="host-1",  # type: ignore[arg-type]
                         timestamp=1_800_000_000)


def test_request_round_trip_keeps_the_seed_layout() -> None:
    req = request(min_levels={"confidentiality": 5}, supports=("aes128gcm16",), ike_address="10.99.0.1")
    body = req.body()
    assert ClientRequest.parse(body, kind=Kind.CONNECT) == req
    fields = json.loads(body)
    assert {"request_id", "user_id", "objective_id", "request_info"} <= set(fields)
    assert canonical(fields) == body


def test_revocation_names_the_revoked_key() -> None:
    revocation = Revocation(host="host-1", target="target-1", nonce=b"\x02" * 16, timestamp=1_800_000_000,
                            user_id="alice", sign_public_key=USER.public.sign)
    body = revocation.body()
    assert Revocation.parse(body) == revocation
    fields = json.loads(body)
    fields["sign_public_key"] = b64e(b"\x00" * 31)
    with pytest.raises(AgentRejected):
        Revocation.parse(canonical(fields))
    del fields["sign_public_key"]
    with pytest.raises(AgentRejected):
        Revocation.parse(canonical(fields))


def test_seal_open_round_trip_and_recipient_binding() -> None:
    body = request().body()
    wire = seal(kind=Kind.CONNECT, to="host-1", body=body, signer=USER, recipient=HOST.public.kem)
    kind, opened, tag = open_sealed(wire, kinds=[Kind.CONNECT], me=HOST)
    assert (kind, opened) == (Kind.CONNECT, body)
    assert len(tag) == 64
    with pytest.raises(AgentRejected, match="rejected") as caught:
        open_sealed(wire, kinds=[Kind.CONNECT], me=KeyPair.generate("host-1"))  # same name, other key
    assert caught.value.reason == "cannot open the seal"
    with pytest.raises(AgentRejected):
        open_sealed(wire, kinds=[Kind.DISCONNECT], me=HOST)


def test_non_canonical_spellings_are_refused() -> None:
    good = canonical({"a": 1, "b": [True, None]})
    for bad in (b'{"b":[true,null],"a":1}', b'{"a": 1,"b":[true,null]}', b'{"a":1.0,"b":[]}',
                b'{"a":1,"a":2}', b'[1]', b'{"a":NaN}'):
        with pytest.raises(AgentRejected):
            decode_canonical(bad, max_size=100)
    assert decode_canonical(good, max_size=100) == {"a": 1, "b": [True, None]}
    assert b64d(b64e(b"\xff\x00")) == b"\xff\x00"
    with pytest.raises(AgentRejected):
        b64d(b64e(b"\xff\x00")[:-1] + "B")  # spare bits set: another spelling of nearly the same bytes


def test_only_json_types_within_the_limits_are_encoded() -> None:
    nested: object = "leaf"
    for _ in range(8):
        nested = [nested]
    assert canonical({"a": nested}) == b'{"a":' + b"[" * 8 + b'"leaf"' + b"]" * 8 + b"}"
    for bad in ({"a": [nested]}, {"a": {"b": [[[[[[[[{}]]]]]]]]}}, {"a": 2**53 + 1}, {"a": [2**60]}, {"a": 1.5},
                {"a": b"x"}, {1: "x"}, {"a": {2: "x"}}, {"a": [{"b": {1, 2}}]}):
        with pytest.raises(AgentRejected):
            canonical(bad)  # type: ignore[arg-type]
    assert canonical({"a": (1, "x", False, None), "b": {"c": -(2**53)}}) == (
        b'{"a":[1,"x",false,null],"b":{"c":-9007199254740992}}')


def test_freshness_window() -> None:
    check_fresh(1000, 1000 + 59)
    check_fresh(1000 + 29, 1000)
    with pytest.raises(AgentRejected, match="rejected"):
        check_fresh(1000, 1000 + 61)
    with pytest.raises(AgentRejected):
        check_fresh(1000 + 31, 1000)


def test_response_repr_hides_the_session_key() -> None:
    info = TunnelingInfo(ticket="a" * 32, protection="esp", target_address="10.0.0.1", target_identity="t",
                         client_identity="c", remote_ts=("10.2.0.1/32",), ike_proposal="aes128-sha256-x25519",
                         esp_proposal="aes128gcm16", mode="tunnel", suite={}, notes=(), expires=1)
    key = b"\x42" * 32
    response = Response(kind=Kind.RESPONSE, request_id=b"\x01" * 16, session_key=key, tunneling_info=info,
                        target="t", user_id="alice", host="h", timestamp=1)
    assert key.hex() not in repr(response)
    assert b64e(key) not in repr(response)
    assert Response.parse(response.body(), kind=Kind.RESPONSE).session_key == key


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=2000))
def test_wire_decoder_only_rejects(data: bytes) -> None:
    with pytest.raises(AgentRejected):
        parse_wire(data, kinds=list(Kind), to="host-1")


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_body_decoders_only_reject(value: object) -> None:
    try:
        body = canonical({"x": value}) if not isinstance(value, dict) else canonical(value)
    except AgentRejected:
        return
    for parse in (lambda b: ClientRequest.parse(b, kind=Kind.CONNECT), Endorsement.parse, Revocation.parse,
                  lambda b: Response.parse(b, kind=Kind.RESPONSE), lambda b: EnrolledUser.from_dict(json.loads(b))):
        with pytest.raises(AgentRejected):
            parse(body)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_valid_requests_only_reject_or_parse(data: st.DataObject) -> None:
    fields = json.loads(request().body())
    key = data.draw(st.sampled_from(sorted(fields)))
    fields[key] = data.draw(json_values)
    try:
        body = canonical(fields)
    except AgentRejected:
        return
    with contextlib.suppress(AgentRejected):
        ClientRequest.parse(body, kind=Kind.CONNECT)
