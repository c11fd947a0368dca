"""schemathesis (v4) over the whole OpenAPI against a real uvicorn: no server errors, responses conform.

Every operation gets generated requests (valid and invalid) carrying an admin token,
so they reach the handlers. Gateways' VICI sockets must live in an empty directory, so
generated registrations are refused (422) rather than dialling arbitrary sockets.

The server plays the agent's Host and Target roles (keys made in a temporary directory),
so the agent routes answer for real instead of 404. Target's charon socket does not
exist: whatever reaches charon must be a 503, never a 500. The number of requests sent
is asserted at the end, and a summary line gives the figures.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings

from app.bootstrap import prepare_database
from app.main import create_app
from app.measure.services.jobs import BenchmarkJobs
from app.settings import Settings
from tests.api.conftest import make_token
from tests.fixtures.agent_roles import agent_server_config
from tests.fixtures.db import postgres_database
from tests.fixtures.figures import figure
from tests.fixtures.secrets import register

#: Per backend: status codes of the generated requests, per operation.
STATUSES: dict[str, dict[str, list[int]]] = {}
#: Generated agent requests refused only because the server plays no agent role.
NO_ROLE: dict[str, list[str]] = {}
#: Examples per operation: SQLite runs the full budget, PostgreSQL (slower per request) half.
EXAMPLES = {"sqlite": 50, "postgresql": 25}
#: Schema-valid requests may still be refused on meaning (an unknown algorithm keyword,
#: a socket outside the allowed directories, the same gateway at both ends): 422 is
#: right there. Every other check runs: no 5xx, status codes, content types, headers
#: and bodies as documented, invalid requests rejected.
EXCLUDED = [schemathesis.checks.positive_data_acceptance]
MIN_REQUESTS = {"sqlite": 1000, "postgresql": 500}


class Server(NamedTuple):
    url: str
    token: str
    backend: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real uvicorn on SQLite or on PostgreSQL (where e.g. text limits differ)."""
    backend: str = request.param
    with contextlib.ExitStack() as stack:
        tmp = tmp_path_factory.mktemp(f"fuzz-{backend}")
        url = f"sqlite:///{tmp}/qoss.db" if backend == "sqlite" else stack.enter_context(postgres_database())
        yield from _serve(tmp, url, backend)


def _serve(tmp: Path, database_url: str, backend: str) -> Iterator[Server]:
    (tmp / "sockets").mkdir()
    cfg = Settings(database_url=database_url, vici_socket_dirs=[tmp / "sockets"],
                   reconcile_on_start=False, tunnel_burst=100_000, max_body_bytes=65536,
                   agent_config=agent_server_config(tmp)[0], agent_rate=100_000.0, agent_burst=100_000,
                   event_stream_seconds=0.1)  # each GET /v1/events answers its stream, then ends
    prepare_database(cfg)
    token = make_token(cfg.database_url, "fuzzer", ["admin"])
    port = _free_port()
    app = create_app(cfg)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                        http="httptools"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.started
    # Generated POST /v1/benchmarks requests must not start real minute-long sweeps.
    app.state.runtime.benchmarks = BenchmarkJobs(runner=lambda keywords, budget, progress: [],
                                         session_factory=app.state.runtime.session_factory, machine="fuzz")
    try:
        yield Server(f"http://127.0.0.1:{port}", token, backend)
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


#: The schema is the app's own OpenAPI document (no server needed to collect the tests).
SCHEMA = schemathesis.openapi.from_dict(create_app(Settings(database_url="sqlite://")).openapi())
OPERATIONS = [result.ok() for result in SCHEMA.get_all_operations()]


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.label)
def test_no_server_errors_and_responses_conform(operation: Any, server: Server) -> None:
    statuses = STATUSES.setdefault(server.backend, {})

    @given(case=operation.as_strategy())
    @settings(max_examples=EXAMPLES[server.backend], deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    def run(case: Any) -> None:
        response = case.call_and_validate(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"},
                                          excluded_checks=EXCLUDED)
        statuses.setdefault(operation.label, []).append(response.status_code)
        if response.status_code == 404 and "does not play the agent" in response.text:
            NO_ROLE.setdefault(server.backend, []).append(operation.label)
        if response.status_code == 201 and operation.path == "/v1/tokens":
            register(response.json()["token"])  # a token the fuzzer made joins the leak sweep

    run()


def test_zz_enough_requests_were_generated(server: Server) -> None:
    by_operation = STATUSES.get(server.backend, {})
    statuses = [s for codes in by_operation.values() for s in codes]
    agent = {label: codes for label, codes in by_operation.items() if " /v1/agent/" in label}
    no_role = NO_ROLE.get(server.backend, [])
    answered = sum(map(len, agent.values())) - len(no_role)
    figure(f"schemathesis on {server.backend}",
           f"{len(OPERATIONS)} operations ({len(agent)} agent, answered by the Host/Target roles: {answered} of "
           f"{sum(map(len, agent.values()))}), {len(statuses)} generated requests, "
           f"{sum(1 for s in statuses if s >= 500)} server errors, 0 schema violations")
    assert len(OPERATIONS) >= 30
    assert len(statuses) >= MIN_REQUESTS[server.backend], f"only {len(statuses)} generated requests"
    assert len(agent) == 17  # the agent's routes, each generated for
    assert no_role == []  # the agent routes were answered by the Host and Target roles
    assert all(s < 500 for s in statuses)
    assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
