"""app.domain.auth: the rules of a new token (name, scopes, lifetime) that the API, the
service and ``qoss token create`` all apply."""

from __future__ import annotations

from datetime import timedelta

import pytest

from app.domain.auth import (
    TOKEN_MAX_LIFETIME,
    TOKEN_NAME_MAX_LENGTH,
    TOKEN_NAME_PATTERN,
    token_lifetime,
    validate_token_name,
)
from app.domain.errors import InvalidInput
from app.services.auth import create_token
from app.web.schemas import TokenIn
from tests.fakes.uow import FakeDatabase

_REFUSED = ['"><img src=x>', "", " ops", "-ops", "ops team", "ops\n", "ops\x00", "a" * (TOKEN_NAME_MAX_LENGTH + 1),
            "caf\u00e9", "ops/1", "<script>"]
_ACCEPTED = ["ops", "first-admin", "ci.deploy@host", "A_1", "a" * TOKEN_NAME_MAX_LENGTH]


@pytest.mark.parametrize("name", _ACCEPTED)
def test_a_plain_name_is_accepted(name: str) -> None:
    assert validate_token_name(name) == name


@pytest.mark.parametrize("name", _REFUSED)
def test_markup_spaces_and_long_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput, match="a token name is 1-64 characters"):
        validate_token_name(name)


@pytest.mark.parametrize("name", _REFUSED + _ACCEPTED)
def test_the_api_schema_takes_exactly_the_names_the_domain_takes(name: str) -> None:
    try:
        validate_token_name(name)
        domain = True
    except InvalidInput:
        domain = False
    try:
        TokenIn(name=name, scopes=["admin"])
        api = True
    except ValueError:
        api = False
    assert api == domain


def test_the_api_schema_uses_the_domain_rule() -> None:
    name = TokenIn.model_json_schema()["properties"]["name"]
    assert name["pattern"] == TOKEN_NAME_PATTERN
    assert name["maxLength"] == TOKEN_NAME_MAX_LENGTH
    expires = TokenIn.model_json_schema()["properties"]["expires_in"]["anyOf"][0]
    assert expires["maximum"] == TOKEN_MAX_LIFETIME.total_seconds()


@pytest.mark.parametrize("expires_in", [0, -1, int(TOKEN_MAX_LIFETIME.total_seconds()) + 1])
def test_a_lifetime_out_of_range_is_refused(expires_in: int) -> None:
    with pytest.raises(InvalidInput, match="expires_in is 1 second to 366 days"):
        token_lifetime(expires_in)


def test_no_lifetime_is_the_longest() -> None:
    assert token_lifetime(None) == TOKEN_MAX_LIFETIME
    assert token_lifetime(60) == timedelta(seconds=60)


def test_the_service_refuses_a_markup_name_and_stores_nothing() -> None:
    with FakeDatabase().unit() as uow:
        with pytest.raises(InvalidInput, match="a token name is 1-64 characters"):
            create_token(uow=uow, name='"><img src=x>', scopes=["admin"], expires_in=None, created_by="tests")
        assert uow.tokens.list() == []
