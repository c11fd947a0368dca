"""Which qoss scopes an identity provider's user gets, the fingerprint a session is granted
under, and one sign-in's secrets in its flow cookie."""

from __future__ import annotations

import base64
import hashlib
import time

import pytest

from app.domain.oidc import (
    FLOW_TTL,
    Flow,
    mapped_scopes,
    mapping_fingerprint,
    new_flow,
    open_flow,
    parse_mapping,
    user_name,
)

MAPPING = parse_mapping('{"groups": {"qoss-admins": ["admin"], "netops": ["ratings:write", "tunnels:read"]},'
                        ' "email": {"Alice@Example.com": ["audit:read"]},'
                        ' "urn:zitadel:iam:org:project:roles": {"qoss-reader": ["tunnels:read"]}}')


def test_the_scopes_are_the_union_over_every_value_the_user_has() -> None:
    claims = {"sub": "1", "groups": ["netops", "qoss-admins", "other"]}
    assert mapped_scopes(MAPPING, claims) == {"admin", "ratings:write", "tunnels:read"}
    assert mapped_scopes(MAPPING, {"sub": "1", "groups": "netops"}) == {"ratings:write", "tunnels:read"}


def test_no_matching_value_gives_no_scope() -> None:
    assert mapped_scopes(MAPPING, {"sub": "1", "groups": ["Netops", "qoss-admin"]}) == frozenset()
    assert mapped_scopes(MAPPING, {"sub": "1"}) == frozenset()


def test_an_email_counts_only_when_verified_and_in_any_case() -> None:
    assert mapped_scopes(MAPPING, {"email": "alice@example.COM", "email_verified": True}) == {"audit:read"}
    assert mapped_scopes(MAPPING, {"email": "alice@example.com", "email_verified": False}) == frozenset()
    assert mapped_scopes(MAPPING, {"email": "alice@example.com", "email_verified": "true"}) == frozenset()


def test_roles_given_as_an_object_match_by_their_keys() -> None:
    claims = {"urn:zitadel:iam:org:project:roles": {"qoss-reader": {"1234": "example.com"}}}
    assert mapped_scopes(MAPPING, claims) == {"tunnels:read"}


@pytest.mark.parametrize(("raw", "message"), [
    ("{not json", "not JSON"),
    ('["admin"]', "JSON object"),
    ('{"groups": ["admin"]}', "non-empty object"),
    ('{"groups": {"ops": []}}', "non-empty list"),
    ('{"groups": {"ops": ["ratings:writ"]}}', "unknown scope 'ratings:writ'"),
    ('{"": {"ops": ["admin"]}}', "claim name"),
])
def test_a_bad_mapping_is_refused_in_one_line(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        parse_mapping(raw)
    assert "\n" not in str(refused.value)


def test_the_fingerprint_changes_with_the_mapping_the_issuer_or_the_client_only() -> None:
    base = mapping_fingerprint(issuer="https://idp/", client_id="qoss", mapping=MAPPING)
    reordered = parse_mapping('{"urn:zitadel:iam:org:project:roles": {"qoss-reader": ["tunnels:read"]},'
                              ' "email": {"Alice@Example.com": ["audit:read"]},'
                              ' "groups": {"netops": ["tunnels:read", "ratings:write"], "qoss-admins": ["admin"]}}')
    assert mapping_fingerprint(issuer="https://idp/", client_id="qoss", mapping=reordered) == base
    narrowed = {**MAPPING, "groups": {"qoss-admins": frozenset({"admin"})}}
    assert mapping_fingerprint(issuer="https://idp/", client_id="qoss", mapping=narrowed) != base
    assert mapping_fingerprint(issuer="https://other/", client_id="qoss", mapping=MAPPING) != base
    assert mapping_fingerprint(issuer="https://idp/", client_id="qoss2", mapping=MAPPING) != base


def test_a_user_goes_by_a_verified_email_then_the_username_then_the_subject() -> None:
    assert user_name({"sub": "1", "email": "a@example.com", "email_verified": True,
                      "preferred_username": "alice"}) == "a@example.com"
    assert user_name({"sub": "1", "email": "a@example.com", "preferred_username": "alice"}) == "alice"
    assert user_name({"sub": "x" * 100}) == "x" * 64
    assert user_name({"sub": "1", "preferred_username": "al\x1bice\n"}) == "alice"


def test_a_flow_cookie_gives_back_its_secrets_and_holds_none_of_them() -> None:
    key = b"k" * 32
    cookie, flow = new_flow(key, now=time.time())
    assert open_flow(key, cookie, now=time.time()) == flow
    assert not {flow.state, flow.nonce, flow.verifier} & set(cookie.split("."))
    assert flow.challenge == base64.urlsafe_b64encode(
        hashlib.sha256(flow.verifier.encode()).digest()).rstrip(b"=").decode()
    assert len(flow.verifier) >= 43  # RFC 7636: 43 to 128 characters


def test_a_flow_cookie_is_refused_when_forged_expired_or_of_another_key() -> None:
    key = b"k" * 32
    now = time.time()
    cookie, _ = new_flow(key, now=now)
    flow_id, expires, mac = cookie.split(".")
    assert open_flow(b"o" * 32, cookie, now=now) is None
    assert open_flow(key, f"{flow_id}x.{expires}.{mac}", now=now) is None
    assert open_flow(key, f"{flow_id}.{int(expires) + 60}.{mac}", now=now) is None
    assert open_flow(key, cookie, now=now + FLOW_TTL + 1) is None
    assert open_flow(key, None, now=now) is None


def test_each_flow_has_its_own_secrets() -> None:
    assert Flow.of(b"k" * 32, "a") != Flow.of(b"k" * 32, "b") != Flow.of(b"j" * 32, "a")
