"""schemathesis (v4) over the whole OpenAPI against a real uvicorn: no server errors, responses conform.

Every operation gets generated requests (valid and invalid) carrying an admin token,
so they reach the handlers. Gateways' VICI sockets must live in an empty directory, so
generated registrations are refused (422) rather than dialling arbitrary sockets.
The number of requests sent is asserted at the end.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings

from app.api.main import create_app
from app.services.benchmarks import BenchmarkJobs
from app.services.bootstrap import prepare_database
from app.settings import Settings
from tests.api.conftest import make_token

SENT: list[int] = []
#: Schema-valid requests may still be refused on meaning (an unknown algorithm keyword,
#: a socket outside the allowed directories, the same gateway at both ends): 422 is
#: right there. Every other check runs: no 5xx, status codes, content types, headers
#: and bodies as documented, invalid requests rejected.
EXCLUDED = [schemathesis.checks.positive_data_acceptance]
MIN_REQUESTS = 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "sockets").mkdir()
    cfg = Settings(database_url=f"sqlite:///{tmp}/qoss.db", vici_socket_dirs=[tmp / "sockets"],
                   reconcile_on_start=False, tunnel_burst=100_000, max_body_bytes=65536)
    prepare_database(cfg)
    token = make_token(cfg.database_url, "fuzzer", ["admin"])
    port = _free_port()
    app = create_app(cfg)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started
    # Generated POST /v1/benchmarks requests must not start real minute-long sweeps.
    app.state.benchmarks = BenchmarkJobs(runner=lambda keywords, budget, progress: [],
                                         session_factory=app.state.session_factory, machine="fuzz")
    yield f"http://127.0.0.1:{port}", token
    srv.should_exit = True
    thread.join(timeout=10)


#: The schema is the app's own OpenAPI document (no server needed to collect the tests).
SCHEMA = schemathesis.openapi.from_dict(create_app(Settings(database_url="sqlite://")).openapi())
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
def test_no_server_errors_and_responses_conform(operation: Any, server: tuple[str, str]) -> None:
    base, token = server

    @given(case=operation.as_strategy())
    @settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: Any) -> None:
        SENT.append(1)
        case.call_and_validate(base_url=base, headers={"Authorization": f"Bearer {token}"},
                               excluded_checks=EXCLUDED)

    run()


def test_zz_enough_requests_were_generated(server: tuple[str, str]) -> None:
    print(f"schemathesis: {len(OPERATIONS)} operations, {len(SENT)} generated requests")
    assert len(OPERATIONS) >= 30
    assert len(SENT) >= MIN_REQUESTS, f"only {len(SENT)} generated requests"
    assert httpx.get(f"{server[0]}/healthz", timeout=5).status_code == 200
