"""The identity provider's settings, checked at start: a mistake is one line naming its
``QOSS_`` variable (as ``qoss serve`` prints it), and the client secret is never shown."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.cli.db import settings_problems
from app.cli.main import _settings_errors
from app.settings import Settings

_SECRET = "client-secret-5d1e9a"
_GOOD = {"QOSS_OIDC_ISSUER": "https://login.example.com/realms/ops", "QOSS_OIDC_CLIENT_ID": "qoss-console",
         "QOSS_OIDC_CLIENT_SECRET": _SECRET, "QOSS_OIDC_SCOPES_BY_CLAIM": '{"groups": {"qoss-admins": ["admin"]}}',
         "QOSS_OIDC_REDIRECT_URL": "https://qoss.example.com/ui/oidc/callback"}


def _errors(monkeypatch: pytest.MonkeyPatch, **env: str | None) -> list[str]:
    for name, value in {**_GOOD, **env}.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    try:
        settings = Settings(_env_file=None)  # type: ignore[call-arg]
    except ValidationError as exc:
        return _settings_errors(exc)
    return settings_problems(settings)  # what every command checks next (scopes: the domain's vocabulary)


def test_a_complete_setting_is_taken_and_its_secret_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _errors(monkeypatch) == []
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.oidc_scopes_by_claim == {"groups": {"qoss-admins": ["admin"]}}
    assert _SECRET not in repr(settings) and _SECRET not in str(settings.model_dump())  # noqa: PT018


@pytest.mark.parametrize(("env", "line"), [
    ({"QOSS_OIDC_SCOPES_BY_CLAIM": '{"groups": {"ops": ["ratings:writ"]}}'},
     "QOSS_OIDC_SCOPES_BY_CLAIM: Value error, groups 'ops': unknown scope 'ratings:writ'"),
    ({"QOSS_OIDC_SCOPES_BY_CLAIM": '{"groups": '}, "QOSS_OIDC_SCOPES_BY_CLAIM: Value error, not JSON"),
    ({"QOSS_OIDC_SCOPES_BY_CLAIM": None}, "QOSS_OIDC_SCOPES_BY_CLAIM: Value error, maps no claim to a scope"),
    ({"QOSS_OIDC_CLIENT_ID": None}, "QOSS_OIDC_CLIENT_ID: Value error, needed with QOSS_OIDC_ISSUER"),
    ({"QOSS_OIDC_ISSUER": "http://login.example.com/"}, "QOSS_OIDC_ISSUER: Value error, an https URL is needed"),
    ({"QOSS_OIDC_ISSUER": None, "QOSS_OIDC_CLIENT_ID": None},
     "QOSS_OIDC_SCOPES_BY_CLAIM: Value error, QOSS_OIDC_ISSUER is not set"),
    ({"QOSS_OIDC_REDIRECT_URL": "https://qoss.example.com/callback"},
     "QOSS_OIDC_REDIRECT_URL: Value error, the console's redirect URL ends in /ui/oidc/callback"),
    ({"QOSS_OIDC_REQUEST_SCOPES": "email profile"}, "QOSS_OIDC_REQUEST_SCOPES: Value error, openid must be"),
    ({"QOSS_OIDC_REDIRECT_URL": None}, "QOSS_OIDC_REDIRECT_URL: Value error, needed with QOSS_OIDC_ISSUER"),
])
def test_a_mistake_is_one_line_naming_its_variable(monkeypatch: pytest.MonkeyPatch, env: dict[str, str | None],
                                                   line: str) -> None:
    errors = _errors(monkeypatch, **env)
    assert any(e.startswith(line) for e in errors), errors
    assert all("\n" not in e and _SECRET not in e for e in errors)
