"""app.web.log_redaction: a token sent in a query string never reaches uvicorn's logs, on a
record shaped as uvicorn logs it and in a real ``qoss serve``'s access log."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from uvicorn.logging import AccessFormatter

from app.web.log_redaction import (
    REDACTED,
    UVICORN_LOGGERS,
    QuerySecretFilter,
    install_query_secret_filter,
    redact_query_secrets,
)
from tests.fixtures.served import serving

SECRET = "qoss_0123456789ab_SECRETSECRETSECRETSECRETSECRETSECRETSECRET"


def _access_record(full_path: str) -> logging.LogRecord:
    """A record as uvicorn's httptools protocol logs a request: (client, method, path with query, version, status)."""
    return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                             ("127.0.0.1:50000", "GET", full_path, "1.1", 401), None)


def _formatted(record: logging.LogRecord) -> str:
    assert QuerySecretFilter().filter(record)
    return AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False).format(record)


@pytest.fixture
def guarded_loggers() -> Iterator[None]:
    """uvicorn's loggers with the filter on, and as they were afterwards."""
    before = {name: list(logging.getLogger(name).filters) for name in UVICORN_LOGGERS}
    try:
        yield
    finally:
        for name, filters in before.items():
            logging.getLogger(name).filters[:] = filters


@pytest.mark.parametrize("name", ["access_token", "token", "api_key", "apikey", "X-Api-Key", "password",
                                  "client_secret", "psk", "session", "auth", "signature", "access%5Ftoken",
                                  "refresh_token", "key"])
def test_the_access_line_of_a_secret_parameter_has_no_secret(name: str) -> None:
    line = _formatted(_access_record(f"/v1/tunnels?limit=5&{name}={SECRET}&state=up"))
    assert SECRET not in line
    assert line == f'127.0.0.1:50000 - "GET /v1/tunnels?limit=5&{name}={REDACTED}&state=up HTTP/1.1" 401 Unauthorized'


def test_the_first_parameter_and_a_repeated_one_are_redacted() -> None:
    line = _formatted(_access_record(f"/healthz?access_token={SECRET}&access_token={SECRET}x"))
    assert SECRET not in line
    assert f"/healthz?access_token={REDACTED}&access_token={REDACTED} " in line


@pytest.mark.parametrize("query", ["limit=5&state=up&cursor=abc", "format=csv&name=esaf", "author=ops",
                                   "key_exchange=3&integrity=4", "token", "a=b=c"])
def test_other_parameters_are_kept(query: str) -> None:
    assert redact_query_secrets(f"/v1/x?{query}") == f"/v1/x?{query}"


def test_a_value_with_quotes_or_percent_signs_goes_whole() -> None:
    assert redact_query_secrets('/v1/x?token=a"b%22c;d&limit=1') == f"/v1/x?token={REDACTED}&limit=1"


def test_a_one_time_profile_links_token_is_redacted_from_its_path() -> None:
    token = "Zx9_kQ-3" * 4
    assert redact_query_secrets(f'GET /v1/agent/handoffs/{token} HTTP/1.1') == \
        f"GET /v1/agent/handoffs/{REDACTED} HTTP/1.1"
    assert redact_query_secrets("/v1/agent/handoffs") == "/v1/agent/handoffs"  # the route that makes one


def test_a_message_with_a_url_is_redacted_too() -> None:
    record = logging.LogRecord("uvicorn.error", logging.WARNING, __file__, 1,
                               f"GET http://h/v1/x?token={SECRET} failed", None, None)
    assert QuerySecretFilter().filter(record)
    assert SECRET not in record.getMessage()


def test_the_filter_outlives_uvicorns_logging_configuration(guarded_loggers: None) -> None:
    install_query_secret_filter()
    install_query_secret_filter()
    uvicorn.Config("app.main:app", log_level="info")  # runs logging.config.dictConfig on uvicorn's loggers
    for name in UVICORN_LOGGERS:
        assert sum(isinstance(f, QuerySecretFilter) for f in logging.getLogger(name).filters) == 1


def test_a_served_requests_access_log_line_has_no_token(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    env = {**os.environ, "QOSS_MONITOR_TUNNELS": "false", "QOSS_LOG_LEVEL": "info"}
    command = [sys.executable, "-m", "app.cli", "serve", "--database-url", f"sqlite:///{tmp_path / 'q.db'}"]
    with serving(command, env=env, log=log, cwd=Path(__file__).resolve().parents[2], timeout=60) as (base, _proc):
        answered = httpx.get(f"{base}/v1/tunnels", params={"limit": "5", "access_token": SECRET}, timeout=10)
        assert answered.status_code == 401  # qoss reads a token from the Authorization header only
        deadline = time.monotonic() + 10
        while "/v1/tunnels?" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    text = log.read_text()
    assert f'"GET /v1/tunnels?limit=5&access_token={REDACTED} HTTP/1.1" 401' in text
    assert SECRET not in text
