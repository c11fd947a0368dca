"""Console page rendering: how long each main page of /ui takes, server side.

    .venv/bin/python benchmarks/console_pages.py [--rounds 200]

In process (httpx over ASGITransport into ``create_app``), on a fresh SQLite database with
the shipped data and a rating table that rates the whole algorithm catalogue (every
keyword, so the grid, the add-row suggestions and the playground's candidates are as large
as they get), signed in to the console with a real session (an ``admin`` token: every
control is rendered). Each round reads every page once; per page it prints the median and
p95 in ms and their ratio to the 100 ms goal. Nothing is asserted: these are figures.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.adapters.db.engine import make_session_factory  # noqa: E402
from app.adapters.db.unit_of_work import sql_units_of_work  # noqa: E402
from app.bootstrap import engine_for, prepare_database  # noqa: E402
from app.domain.algorithms import CATALOGUE  # noqa: E402
from app.domain.ratings import Rating, relevant_dimensions  # noqa: E402
from app.main import create_app  # noqa: E402
from app.services import ratings as table_svc  # noqa: E402
from app.services.auth import create_token  # noqa: E402
from app.settings import Settings  # noqa: E402

GOAL_MS = 100.0
TABLE = "full-catalogue"
PAGES = {
    "tables": "/ui/tables",
    "grid (full catalogue)": f"/ui/tables/{TABLE}",
    "revisions": f"/ui/tables/{TABLE}/revisions",
    "playground + why-not": (f"/ui/negotiate?run=true&table={TABLE}&p1=client&p1c=5&p1i=5&p2=gw&p2k=6"
                             "&why=sha256"),
    "policies": "/ui/policies",
    "policy (edit form)": "/ui/policies/voip",
    "tunnels": "/ui/tunnels",
    "gateways": "/ui/gateways",
    "agent": "/ui/agent",
    "measurements": "/ui/measurements",
    "audit": "/ui/audit",
}


def _full_table(settings: Settings) -> tuple[int, str]:
    """A table rating every catalogue keyword (levels and performance from standards-2026 where it
    rates them, a made-up middle value otherwise), and an admin token; (rows, token)."""
    engine = engine_for(settings)
    try:
        with sql_units_of_work(make_session_factory(engine))() as uow:
            base = table_svc.get_table(uow=uow, name="standards-2026")
            rows = []
            for keyword, alg in CATALOGUE.items():
                rated = base.get(keyword)
                if rated is not None:
                    rows.append(rated)
                    continue
                levels = {dim: 5 for dim in relevant_dimensions(alg.kind)}
                rows.append(Rating.from_dict({"algorithm": keyword, **levels, "performance": 5.0,
                                              "reason": "benchmark row"}))
            document = {"name": TABLE, "description": "every catalogue keyword",
                        "ratings": [r.as_dict() for r in rows]}
            table_svc.create_table(uow=uow, document=document, author="benchmark")
            token, _ = create_token(uow=uow, name="benchmark", scopes=["admin"], expires_in=None,
                                    created_by="benchmark")
            uow.commit()
    finally:
        engine.dispose()
    return len(rows), token


async def _sign_in(client: httpx.AsyncClient, token: str) -> None:
    form = await client.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    answer = await client.post("/ui/login", data={"csrf": csrf.group(1), "token": token})
    if answer.status_code != 303:
        raise SystemExit(f"sign-in failed: {answer.status_code}")


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


async def run(rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as where:
        url = f"sqlite:///{where}/qoss.db"
        settings = Settings(database_url=url, measurements_dir=ROOT / "docs" / "measurements",
                            monitor_tunnels=False, reconcile_on_start=False)
        prepare_database(settings)
        size, token = _full_table(settings)
        print(f"{TABLE}: {size} rows (the whole catalogue); {rounds} rounds of {len(PAGES)} pages")
        app = create_app(settings)
        times: dict[str, list[float]] = {page: [] for page in PAGES}
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://qoss.bench") as client:
            await _sign_in(client, token)
            for page, path in PAGES.items():  # warm-up: templates compiled, plots drawn, caches filled
                answer = await client.get(path)
                if answer.status_code != 200:
                    raise SystemExit(f"{page}: {answer.status_code}")
            for _ in range(rounds):
                for page, path in PAGES.items():
                    began = time.perf_counter()
                    answer = await client.get(path)
                    times[page].append((time.perf_counter() - began) * 1000)
                    if answer.status_code != 200:
                        raise SystemExit(f"{page}: {answer.status_code}")
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="reads of every page (default 200)")
    args = parser.parse_args(argv)
    times = asyncio.run(run(max(1, min(args.rounds, 10_000))))
    print(f"{'page':<24} {'median ms':>10} {'p95 ms':>8} {'median/goal':>12} {'p95/goal':>9}")
    summary: dict[str, Any] = {}
    for page, values in times.items():
        median, p95 = statistics.median(values), _p95(values)
        summary[page] = (median, p95)
        print(f"{page:<24} {median:>10.1f} {p95:>8.1f} {median / GOAL_MS:>12.2f} {p95 / GOAL_MS:>9.2f}")
    worst = max(summary, key=lambda p: summary[p][1])
    print(f"goal {GOAL_MS:.0f} ms per page; slowest p95: {worst} {summary[worst][1]:.1f} ms")


if __name__ == "__main__":
    main()
