"""Micro benchmark jobs (tunnel benchmarks stay on the CLI)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request

from app.measure.services.jobs import BenchmarkJobs
from app.web.deps import require
from app.web.routing import QossRoute
from app.web.runtime import runtime
from app.web.schemas import BenchmarkIn, error_responses

__all__ = ["router"]

router = APIRouter(tags=["benchmarks"], route_class=QossRoute)
_WRITE = [Depends(require("ratings:write"))]
_ERRORS = error_responses(401, 403, 404, 409, 422)


def _jobs(request: Request) -> BenchmarkJobs:
    jobs = runtime(request).benchmarks
    assert isinstance(jobs, BenchmarkJobs)
    return jobs


@router.post("/benchmarks", dependencies=_WRITE, status_code=202, responses=_ERRORS)
def start_benchmark(body: BenchmarkIn, request: Request) -> dict[str, Any]:
    """Start a micro run in the background (409 while another runs); poll ``GET /v1/benchmarks/{id}``."""
    from app.measure.adapters.micro import available

    keywords = body.only or available()
    unknown = sorted(set(keywords) - set(available()))
    if unknown:
        from app.domain.errors import InvalidInput

        raise InvalidInput(f"cannot measure {unknown[:10]}; measurable: {available()}")
    job = _jobs(request).start(keywords=keywords, budget=body.budget_per_algorithm, write_table=body.write_table,
                               base_table=body.base_table)
    return job.as_dict()


@router.get("/benchmarks", dependencies=_WRITE, responses=_ERRORS)
def list_benchmarks(request: Request) -> list[dict[str, Any]]:
    """Every job of this process, with progress."""
    return [j.as_dict() for j in _jobs(request).all()]


@router.get("/benchmarks/{job_id}", dependencies=_WRITE, responses=_ERRORS)
def get_benchmark(job_id: Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")], request: Request) -> dict[str, Any]:
    """One job: state, progress, results, the table it wrote."""
    return _jobs(request).get(job_id).as_dict()
