"""GET /metrics: the exposition parses, needs ``metrics:read``, labels requests by route template,
moves with real requests (negotiations, tunnels on a fake charon, revisions), answers while the
in-flight limit is reached, sums several processes (multi-process mode), and the sample Grafana
dashboard asks only for metrics it exposes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.adapters.metrics import CATALOGUE, exposition
from app.main import create_app
from app.settings import Settings
from tests import REPO_ROOT
from tests.api.conftest import make_token
from tests.api.test_idempotency import PSK_A, tunnel, tunnel_client  # noqa: F401  # the fixture, reused
from tests.api.test_overload import holding_every_connection

pytestmark = pytest.mark.anyio

NEGOTIATION = {"rating_table": "esaf-2006", "peers": [{"name": "app", "min_levels": {"integrity": 4}}]}
INFEASIBLE = {"rating_table": "esaf-2006", "peers": [{"name": "app", "min_levels": {"integrity": 9}}]}
DASHBOARD = REPO_ROOT / "docs" / "grafana" / "qoss.json"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of an exposition: (name, labels) -> value (parsing it is the first check)."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(text: str, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, pairs), v in samples(text).items() if n == name and want <= pairs)


async def scrape(client: httpx.AsyncClient, token: str) -> str:
    r = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return r.text


@pytest.fixture
def metrics_token(settings: Settings) -> str:
    return make_token(settings.database_url, "scraper", ["metrics:read"])


async def test_metrics_needs_a_token_with_metrics_read(client: httpx.AsyncClient, settings: Settings,
                                                       metrics_token: str) -> None:
    assert (await client.get("/metrics", headers={"Authorization": ""})).status_code == 401
    assert (await client.get("/metrics", headers={"Authorization": "Bearer qoss_nope"})).status_code == 401
    reader = make_token(settings.database_url, "reader", ["tunnels:read"])
    refused = await client.get("/metrics", headers={"Authorization": f"Bearer {reader}"})
    assert refused.status_code == 403
    assert refused.json()["error"] == "Forbidden"
    text = await scrape(client, metrics_token)
    assert ("qoss_tunnels_scrape_ok", frozenset()) in samples(text)
    await scrape(client, client.headers["Authorization"].removeprefix("Bearer "))  # admin implies it


async def test_negotiations_are_counted_by_outcome(client: httpx.AsyncClient, metrics_token: str) -> None:
    assert (await client.post("/v1/negotiations", json=NEGOTIATION)).status_code == 200
    assert (await client.post("/v1/negotiations", json=NEGOTIATION)).status_code == 200
    assert (await client.post("/v1/negotiations", json=INFEASIBLE)).status_code in (409, 422)
    text = await scrape(client, metrics_token)
    assert value(text, "qoss_negotiations_total", outcome="chosen") == 2
    assert value(text, "qoss_negotiations_total") == 3
    assert value(text, "qoss_http_requests_total", route="/v1/negotiations", method="POST", status="200") == 2
    assert value(text, "qoss_http_request_seconds_count", route="/v1/negotiations", method="POST") == 3


async def test_the_route_label_is_the_template_never_the_path(client: httpx.AsyncClient, metrics_token: str) -> None:
    assert (await client.get("/v1/tunnels/abc123")).status_code == 404
    assert (await client.get("/v1/policies/no-such-policy")).status_code == 404
    assert (await client.get("/no/such/path/9f8e7d")).status_code == 404
    text = await scrape(client, metrics_token)
    assert value(text, "qoss_http_requests_total", route="/v1/tunnels/{tunnel_id}", status="404") == 1
    assert value(text, "qoss_http_requests_total", route="/v1/policies/{name}", status="404") == 1
    assert value(text, "qoss_http_requests_total", route="unmatched", status="404") == 1
    assert "abc123" not in text
    assert "9f8e7d" not in text
    assert "no-such-policy" not in text


async def test_a_revision_of_a_policy_is_counted(client: httpx.AsyncClient, metrics_token: str) -> None:
    policy = {"name": "counted", "min_levels": {"integrity": 3}}
    created = await client.post("/v1/policies", json=policy)
    assert created.status_code == 201, created.text
    replaced = await client.put("/v1/policies/counted", json={**policy, "min_levels": {"integrity": 4}},
                                headers={"If-Match": created.headers["ETag"]})
    assert replaced.status_code == 200, replaced.text
    text = await scrape(client, metrics_token)
    assert value(text, "qoss_revisions_total", kind="policy") == 2


async def test_a_tunnel_set_up_is_counted_timed_and_shown_by_state_and_gateway(
        tunnel_client: httpx.AsyncClient, settings: Settings) -> None:  # noqa: F811  # the fixture
    token = make_token(settings.database_url, "scraper", ["metrics:read"])
    made = await tunnel_client.post("/v1/tunnels", json=tunnel(PSK_A))
    assert made.status_code == 201, made.text
    text = await scrape(tunnel_client, token)
    assert value(text, "qoss_tunnel_setups_total", outcome="up") == 1
    assert value(text, "qoss_tunnel_setup_seconds_count", outcome="up") == 1
    assert value(text, "qoss_tunnels", state="up", gateway="left") == 1
    assert value(text, "qoss_vici_calls_total") > 0
    assert all("left.vici" in dict(labels)["gateway"] for (name, labels) in samples(text)
               if name == "qoss_vici_calls_total")
    assert PSK_A not in text


async def test_metrics_answers_while_the_in_flight_limit_is_reached(settings: Settings, metrics_token: str) -> None:
    app = create_app(settings.model_copy(update={"max_in_flight": 1, "monitor_tunnels": False, "db_pool_size": 1,
                                                 "db_pool_overflow": 0, "db_pool_timeout": 20}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://qoss.test") as client:
        hold = holding_every_connection(app)
        await anyio.to_thread.run_sync(hold.__enter__)
        try:  # the one place taken by a request waiting inside for a database connection
            held = asyncio.create_task(client.get("/v1/rating-tables/esaf-2006"))
            for _ in range(200):
                if app.state.door.inside == 1:
                    break
                await asyncio.sleep(0.01)
            turned_away = await client.get("/v1/rating-tables")
            assert turned_away.status_code == 503
            assert turned_away.json()["error"] == "Overloaded"
            text = await scrape(client, metrics_token)
            assert value(text, "qoss_http_requests_total", route="/v1/rating-tables", status="503") == 1
            # ready, or saying it is not while the place stays taken: answered either way
            assert (await client.get("/healthz")).status_code in (200, 503)
        finally:
            await anyio.to_thread.run_sync(hold.__exit__, None, None, None)
        assert (await held).status_code == 200


async def test_the_dashboard_asks_only_for_metrics_the_service_exposes(client: httpx.AsyncClient,
                                                                      metrics_token: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"])
    asked = {name for e in exprs for name in re.findall(r"\b(qoss_[a-z_]+)", e)}
    assert asked
    text = await scrape(client, metrics_token)
    families = {f.name for f in text_string_to_metric_families(text)}
    exposed = families | {f"{n}_total" for n in families} | {
        f"{n}_{suffix}" for n in families for suffix in ("bucket", "count", "sum")}
    assert asked <= exposed, asked - exposed
    assert {n.removesuffix("_total") for n in CATALOGUE} <= families  # every declared metric is exposed


_ONE_PROCESS = """
import asyncio, sys, httpx
from app.main import create_app
from app.settings import Settings

async def main():
    app = create_app(Settings(database_url=sys.argv[1], monitor_tunnels=False, reconcile_on_start=False))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://qoss.test") as c:
        r = await c.post("/v1/negotiations", json={"rating_table": "esaf-2006",
                                                   "peers": [{"name": "app", "min_levels": {"integrity": 4}}]})
        assert r.status_code == 200, r.text

asyncio.run(main())
"""


@pytest.fixture
def multiproc_dir(tmp_path: Path) -> Path:
    path = tmp_path / "prometheus"
    path.mkdir()
    return path


def test_two_processes_sharing_the_directory_are_summed(settings: Settings, multiproc_dir: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir), "PYTHONPATH": str(REPO_ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _ONE_PROCESS, settings.database_url], env=env, cwd=REPO_ROOT)
             for _ in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert len(list(multiproc_dir.glob("counter_*.db"))) == 2  # one file per process
    from prometheus_client import CollectorRegistry

    text = exposition(CollectorRegistry(), multiproc_dir=str(multiproc_dir)).decode()
    assert value(text, "qoss_negotiations_total", outcome="chosen") == 2
    assert value(text, "qoss_http_requests_total", route="/v1/negotiations", status="200") == 2
