"""The provider's answer made a console session, on the in-memory unit of work with a fake
provider: exactly the mapped scopes, nothing stored when none is mapped or the answer is not
this browser's, and a session refused once the mapping changes or it has lived its time."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.domain.auth import Unauthenticated
from app.domain.oidc import (
    Flow,
    NoScopeMapped,
    SignInRefused,
    mapping_fingerprint,
    open_flow,
    parse_mapping,
)
from app.domain.ports import UnitOfWork
from app.services.console_oidc import OidcSignIn, SignedIn, begin, open_session, verify
from app.services.events import FollowerGone, StreamFollower, stream_scopes
from app.services.ui_sessions import resolve
from tests.fakes.uow import FakeUnitOfWork

KEY = b"k" * 32
REDIRECT = "https://qoss.example.test/ui/oidc/callback"
BINDING = "b" * 43  # what the sign-in page's script keeps in the tab


def finish(*, uow: UnitOfWork, config: OidcSignIn, key: bytes, cookie: str | None, answer: dict[str, str],
           redirect_uri: str, binding: str = BINDING) -> SignedIn:
    """The callback's two steps: the provider's answer checked (no database), then the session stored."""
    user = verify(config=config, key=key, cookie=cookie, binding=binding, answer=answer, redirect_uri=redirect_uri)
    return open_session(uow=uow, config=config, user=user)


class _Provider:
    """Gives back an ID token's claims for the code it was shown, with this sign-in's nonce."""

    issuer = "https://idp.example.test/"
    client_id = "qoss"

    def __init__(self, claims: dict[str, Any], userinfo: dict[str, Any] | None = None) -> None:
        self.claims = claims
        self.extra = userinfo or {}
        self.flow: Flow | None = None
        self.redeemed = 0

    def authorization_url(self, *, flow: Flow, redirect_uri: str, scopes: Any) -> str:
        self.flow = flow
        return f"https://idp.example.test/auth?state={flow.state}"

    def redeem(self, *, code: str, flow: Flow, redirect_uri: str) -> tuple[str, str | None]:
        self.redeemed += 1
        assert (code, flow, redirect_uri) == ("code-1", self.flow, REDIRECT)
        return "id-token", "access-token"

    def id_token_claims(self, id_token: str, *, nonce: str) -> dict[str, Any]:
        assert self.flow is not None and nonce == self.flow.nonce  # noqa: PT018
        return {"sub": "u-1", "exp": int(time.time()) + 3600, **self.claims}

    def userinfo(self, access_token: str, *, subject: str) -> dict[str, Any]:
        return {"sub": subject, **self.extra}

    def end_session_url(self, *, post_logout_redirect_uri: str) -> str | None:
        return None


def _config(provider: _Provider, mapping: str = '{"groups": {"ops": ["ratings:write"], "admins": ["admin"]}}',
            session_ttl: timedelta | None = None) -> OidcSignIn:
    parsed = parse_mapping(mapping)
    return OidcSignIn(provider=provider, name="idp", mapping=parsed, request_scopes=("openid",),
                      fingerprint=mapping_fingerprint(issuer=provider.issuer, client_id="qoss", mapping=parsed),
                      max_ttl=timedelta(hours=8), session_ttl=session_ttl, redirect_url=REDIRECT)


def _answer(config: OidcSignIn) -> tuple[str, dict[str, str]]:
    cookie, _ = begin(config=config, key=KEY, binding=BINDING, redirect_uri=REDIRECT)
    flow = open_flow(KEY, cookie, binding=BINDING, now=time.time())
    assert flow is not None
    return cookie, {"state": flow.state, "code": "code-1"}


def test_a_user_gets_a_session_with_exactly_the_mapped_scopes(uow: FakeUnitOfWork) -> None:
    config = _config(_Provider({"groups": ["ops", "unmapped"]}, {"email": "a@example.test", "email_verified": True}))
    cookie, answer = _answer(config)
    signed_in = finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT)
    record, token = resolve(uow=uow, session_id=signed_in.session_id, mapping_hash=config.fingerprint)
    assert token is None
    assert (record.scopes, record.user_name, record.subject) == ({"ratings:write"}, "oidc:a@example.test", "u-1")
    assert record.expires_at - record.created_at <= timedelta(hours=1)  # the ID token's lifetime


def test_no_mapped_scope_refuses_and_stores_nothing(uow: FakeUnitOfWork) -> None:
    config = _config(_Provider({"groups": ["unmapped"], "preferred_username": "bob"}))
    cookie, answer = _answer(config)
    with pytest.raises(NoScopeMapped, match="bob"):
        finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT)
    assert not uow.read().sessions


@pytest.mark.parametrize("wrong", ["state", "cookie", "error"])
def test_an_answer_not_of_this_browsers_sign_in_is_refused(uow: FakeUnitOfWork, wrong: str) -> None:
    config = _config(_Provider({"groups": ["admins"]}))
    cookie, answer = _answer(config)
    if wrong == "state":
        state = answer["state"]
        answer["state"] = ("y" if state.startswith("x") else "x") + state[1:]  # one character other than it was
    elif wrong == "cookie":
        cookie, _ = begin(config=config, key=KEY, binding=BINDING, redirect_uri=REDIRECT)  # another of its sign-ins
        answer["state"] = "x"
    else:
        answer = {"error": "access_denied", "state": answer["state"]}
    with pytest.raises(SignInRefused):
        finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT)
    assert not uow.read().sessions


def test_a_session_is_refused_once_the_mapping_changes(uow: FakeUnitOfWork) -> None:
    provider = _Provider({"groups": ["admins"]})
    config = _config(provider)
    cookie, answer = _answer(config)
    signed_in = finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT)
    narrowed = _config(provider, mapping='{"groups": {"ops": ["ratings:write"]}}')
    with pytest.raises(Unauthenticated):
        resolve(uow=uow, session_id=signed_in.session_id, mapping_hash=narrowed.fingerprint)
    with pytest.raises(Unauthenticated):  # no identity provider configured any more
        resolve(uow=uow, session_id=signed_in.session_id, mapping_hash=None)


def test_a_session_lives_the_configured_time_then_needs_the_provider_again(uow: FakeUnitOfWork) -> None:
    config = _config(_Provider({"groups": ["admins"]}), session_ttl=timedelta(minutes=5))
    cookie, answer = _answer(config)
    signed_in = finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT)
    resolve(uow=uow, session_id=signed_in.session_id, mapping_hash=config.fingerprint)
    with pytest.raises(Unauthenticated):
        resolve(uow=uow, session_id=signed_in.session_id, mapping_hash=config.fingerprint,
                now=datetime.now(UTC) + timedelta(minutes=6))


def test_the_event_stream_follows_a_users_session_with_its_scopes_until_it_ends(uow: FakeUnitOfWork) -> None:
    config = _config(_Provider({"groups": ["ops"]}))
    cookie, answer = _answer(config)
    record = finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT).record
    follower = StreamFollower(record.holder, record.id_hash)
    assert stream_scopes(uow, follower) == {"ratings:write"}
    with pytest.raises(FollowerGone) as gone:
        stream_scopes(uow, StreamFollower("oidc:someone-else", record.id_hash))
    assert gone.value.reason == "the console session has ended"
    uow.sessions.delete(record.id_hash)
    with pytest.raises(FollowerGone) as gone:
        stream_scopes(uow, follower)
    assert gone.value.reason == "the console session has ended"


def test_an_answer_is_taken_once_and_a_replay_never_reaches_the_provider(uow: FakeUnitOfWork) -> None:
    provider = _Provider({"groups": ["admins"]})
    config = _config(provider)
    cookie, answer = _answer(config)
    finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT)
    with pytest.raises(SignInRefused, match="answered already"):
        finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT)
    assert provider.redeemed == 1
    assert len(uow.read().sessions) == 1


@pytest.mark.parametrize("binding", ["", "c" * 43])
def test_an_answer_without_the_binding_of_the_tab_that_started_it_is_refused_unasked(
        uow: FakeUnitOfWork, binding: str) -> None:
    provider = _Provider({"groups": ["admins"]})
    config = _config(provider)
    cookie, answer = _answer(config)
    with pytest.raises(SignInRefused, match="another browser"):
        finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT, binding=binding)
    assert provider.redeemed == 0
    assert not uow.read().sessions
    finish(uow=uow, config=config, key=KEY, cookie=cookie, answer=answer, redirect_uri=REDIRECT)  # still good
