"""The tunnel agent's user id a person signed in with the identity provider enrols devices as:
their preferred_username, else a verified email's local part, in lower case, only if it is a
valid agent user id."""

from __future__ import annotations

from typing import Any

import pytest

from app.domain.auth import SCOPES
from app.domain.oidc import DEVICE_SCOPE, agent_user_id, parse_mapping


@pytest.mark.parametrize(("claims", "user"), [
    ({"preferred_username": "Dana"}, "dana"),
    ({"preferred_username": "dana.k", "email": "other@x.test", "email_verified": True}, "dana.k"),
    ({"email": "Kim@example.test", "email_verified": True}, "kim"),
    ({"email": "kim@example.test", "email_verified": False}, None),  # not verified: not taken
    ({"preferred_username": "dana smith", "email": "ds@x.test", "email_verified": True}, "ds"),
    ({"preferred_username": "-x"}, None),
    ({"preferred_username": "ünïcode"}, None),
    ({"preferred_username": "a" * 64}, None),
    ({"sub": "u-1"}, None),
])
def test_the_agent_user_id_of_a_signed_in_person(claims: dict[str, Any], user: str | None) -> None:
    assert agent_user_id(claims) == user


def test_the_device_scope_is_a_scope_a_mapping_may_give() -> None:
    assert DEVICE_SCOPE in SCOPES
    assert parse_mapping('{"groups": {"phones": ["agent:enroll-device"]}}') == {
        "groups": {"phones": frozenset({DEVICE_SCOPE})}}
