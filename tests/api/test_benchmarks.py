"""POST /v1/benchmarks: micro runs as background jobs, one at a time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import pytest

from app.domain.scoring import MicroResult
from app.measure.services.jobs import BenchmarkJobs

pytestmark = pytest.mark.anyio


async def wait_done(client: httpx.AsyncClient, job_id: str, seconds: float = 60) -> dict[str, Any]:
    for _ in range(int(seconds / 0.1)):
        job = (await client.get(f"/v1/benchmarks/{job_id}")).json()
        if job["state"] != "running":
            return job
        await asyncio.sleep(0.1)
    raise AssertionError("benchmark did not finish")


async def test_real_micro_job_measures_and_writes_a_table(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/benchmarks", json={"only": ["aes128gcm16", "sha256", "aes128"],
                                                  "budget_per_algorithm": 0.1, "write_table": "bench-api"})
    assert r.status_code == 202, r.text
    job = await wait_done(client, r.json()["id"])
    assert job["state"] == "done", job
    assert job["progress"] == {"done": 3, "total": 3}
    assert {row["algorithm"] for row in job["results"]} == {"aes128gcm16", "sha256", "aes128"}
    table = (await client.get("/v1/rating-tables/bench-api")).json()
    rows = {row["algorithm"]: row for row in table["ratings"]}
    assert rows["aes128gcm16"]["measurement"]["a_ns_per_byte"] > 0
    neg = await client.post("/v1/negotiations", json={"rating_table": "bench-api",
                                                      "peers": [{"name": "a", "min_levels": {"integrity": 5}}]})
    assert neg.status_code == 200
    assert "measured" in neg.json()["cost_unit"]


async def test_one_job_at_a_time(client: httpx.AsyncClient) -> None:
    app = client._transport.app  # type: ignore[attr-defined]
    gate = threading.Event()

    def blocking(keywords: Sequence[str], budget: float, progress: Callable[[str], None]) -> list[MicroResult]:
        assert gate.wait(timeout=30)
        return []

    parts = app.state.runtime
    parts.benchmarks = BenchmarkJobs(runner=blocking, session_factory=parts.session_factory, machine="t")
    first = await client.post("/v1/benchmarks", json={"only": ["sha256"]})
    assert first.status_code == 202
    second = await client.post("/v1/benchmarks", json={"only": ["sha256"]})
    assert second.status_code == 409
    assert first.json()["id"] in second.json()["detail"]
    gate.set()
    assert (await wait_done(client, first.json()["id"]))["state"] == "done"
    assert (await client.post("/v1/benchmarks", json={"only": ["sha256"]})).status_code == 202
    gate.set()


@pytest.mark.parametrize("body", [{"only": ["rot13"]}, {"budget_per_algorithm": 5}, {"only": []}, {"x": 1}])
async def test_bad_benchmark_requests_are_422(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    assert (await client.post("/v1/benchmarks", json=body)).status_code == 422


async def test_unknown_job_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/benchmarks/0123456789ab")).status_code == 404
