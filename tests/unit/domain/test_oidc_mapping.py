"""Which qoss scopes an identity provider's user gets, the fingerprint a session is granted
under, and one sign-in's secrets in its flow cookie."""

from __future__ import annotations

import base64
import hashlib
import re
import time

import pytest

from app.domain.auth import TOKEN_NAME_PATTERN
from app.domain.oidc import (
    FLOW_TTL,
    Flow,
    UsedStates,
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


def test_an_email_counts_only_when_verified_and_matches_exactly_but_for_its_domains_case() -> None:
    assert mapped_scopes(MAPPING, {"email": "Alice@example.COM", "email_verified": True}) == {"audit:read"}
    assert mapped_scopes(MAPPING, {"email": "alice@example.com", "email_verified": True}) == frozenset()
    assert mapped_scopes(MAPPING, {"email": "Alice@Example.com", "email_verified": False}) == frozenset()
    assert mapped_scopes(MAPPING, {"email": "Alice@Example.com", "email_verified": "true"}) == frozenset()


@pytest.mark.parametrize("presented", [
    "\u212aim@example.com",  # KELVIN SIGN: casefold() makes it "k"
    "\u017fam@example.com",  # LATIN SMALL LETTER LONG S: casefold() makes it "s" (of "sam@example.com")
    "KIM@example.com",
])
def test_an_email_that_only_unicode_folding_would_match_gets_nothing(presented: str) -> None:
    mapping = parse_mapping('{"email": {"kim@example.com": ["admin"], "sam@example.com": ["admin"]}}')
    assert mapped_scopes(mapping, {"email": "kim@example.com", "email_verified": True}) == {"admin"}
    assert mapped_scopes(mapping, {"email": presented, "email_verified": True}) == frozenset()


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
                      "preferred_username": "alice"}) == "oidc:a@example.com"
    assert user_name({"sub": "1", "email": "a@example.com", "preferred_username": "alice"}) == "oidc:alice"
    assert user_name({"sub": "x" * 100}) == "oidc:" + "x" * 59
    assert user_name({"sub": "1", "preferred_username": "al\x1bice\n"}) == "oidc:alice"


@pytest.mark.parametrize("claims", [
    {"sub": "1", "preferred_username": "admin"},
    {"sub": "admin"},
    {"sub": "1", "email": "break-glass@example.com", "email_verified": True},
])
def test_a_users_name_can_never_be_an_api_tokens_name(claims: dict[str, object]) -> None:
    name = user_name(claims)
    assert name.startswith("oidc:")
    assert re.fullmatch(TOKEN_NAME_PATTERN, name) is None  # a token's name has no ':'


BINDING = "b" * 43


def test_a_flow_cookie_gives_back_its_secrets_and_holds_none_of_them() -> None:
    key = b"k" * 32
    cookie, flow = new_flow(key, binding=BINDING, now=time.time())
    assert open_flow(key, cookie, binding=BINDING, now=time.time()) == flow
    assert not {flow.state, flow.nonce, flow.verifier} & set(cookie.split("."))
    assert flow.challenge == base64.urlsafe_b64encode(
        hashlib.sha256(flow.verifier.encode()).digest()).rstrip(b"=").decode()
    assert len(flow.verifier) >= 43  # RFC 7636: 43 to 128 characters


def test_a_flow_cookie_is_refused_when_forged_expired_or_of_another_key() -> None:
    key = b"k" * 32
    now = time.time()
    cookie, _ = new_flow(key, binding=BINDING, now=now)
    flow_id, expires, mac = cookie.split(".")
    assert open_flow(b"o" * 32, cookie, binding=BINDING, now=now) is None
    assert open_flow(key, f"{flow_id}x.{expires}.{mac}", binding=BINDING, now=now) is None
    assert open_flow(key, f"{flow_id}.{int(expires) + 60}.{mac}", binding=BINDING, now=now) is None
    assert open_flow(key, cookie, binding=BINDING, now=now + FLOW_TTL + 1) is None
    assert open_flow(key, None, binding=BINDING, now=now) is None


@pytest.mark.parametrize("other", ["c" * 43, "", "b" * 42, "b" * 42 + "=", "b" * 44])
def test_a_flow_cookie_is_worthless_without_the_binding_it_was_made_with(other: str) -> None:
    key, now = b"k" * 32, time.time()
    cookie, _ = new_flow(key, binding=BINDING, now=now)
    assert open_flow(key, cookie, binding=other, now=now) is None
    with pytest.raises(ValueError, match="binding"):
        new_flow(key, binding="short", now=now)


def test_a_state_is_taken_once_and_forgotten_after_its_flow_ends() -> None:
    used, now = UsedStates(capacity=3), time.time()
    flows = [new_flow(b"k" * 32, binding=BINDING, now=now)[1] for _ in range(4)]
    assert used.take(flows[0], now=now)
    assert not used.take(flows[0], now=now)
    assert all(used.take(f, now=now) for f in flows[1:])
    assert len(used) == 3  # the oldest went first
    assert used.take(flows[1], now=now + FLOW_TTL + 1)  # every one had ended: forgotten
    assert len(used) == 1


def test_each_flow_has_its_own_secrets() -> None:
    assert Flow.of(b"k" * 32, "a") != Flow.of(b"k" * 32, "b") != Flow.of(b"j" * 32, "a")
