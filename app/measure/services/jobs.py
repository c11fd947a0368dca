"""Micro benchmark runs as background jobs (``POST /v1/benchmarks``), one at a time.

A job runs ``qoss bench micro`` in a worker thread, reports progress, and can write the
measured rating table when done. The registry lives in the process (jobs are
measurements of *this* machine; they are not shared between replicas).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from app.domain.errors import Conflict, NotFound
from app.domain.scoring import MicroResult, measured_table

__all__ = ["BenchmarkJobs", "Job", "Runner"]

#: (keywords, budget per algorithm, progress callback) -> results
Runner = Callable[[Sequence[str], float, Callable[[str], None]], list[MicroResult]]


@dataclass
class Job:
    id: str
    keywords: list[str]
    budget: float
    write_table: str | None
    base_table: str
    state: str = "running"
    done: list[str] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    table: str | None = None
    error: str | None = None
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    finished_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state, "progress": {"done": len(self.done), "total": len(self.keywords)},
            "keywords": self.keywords, "budget_per_algorithm": self.budget, "write_table": self.write_table,
            "table": self.table, "results": self.results, "error": self.error,
            "started_at": self.started_at, "finished_at": self.finished_at,
        }


def _row(r: MicroResult) -> dict[str, Any]:
    row: dict[str, Any] = {"algorithm": r.keyword, "method": r.method, "spread": round(r.spread, 4)}
    if r.ops_per_s is not None:
        row["ops_per_s"] = round(r.ops_per_s)
    else:
        a, b = r.per_byte()  # as the measured table records it
        row.update(a_ns_per_byte=round(a, 4), b_ns=round(b, 1), mb_per_s_1400=round(r.mb_per_s, 1))
    return row


class BenchmarkJobs:
    """The jobs of this process; at most one runs at a time."""

    def __init__(self, *, runner: Runner, session_factory: Callable[[], Session], machine: str) -> None:
        self._runner = runner
        self._factory = session_factory
        self._machine = machine
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, *, keywords: Sequence[str], budget: float, write_table: str | None, base_table: str) -> Job:
        """Start a job.

        Raises:
            Conflict: another job is running (409).
        """
        with self._lock:
            running = [j.id for j in self._jobs.values() if j.state == "running"]
            if running:
                raise Conflict(f"benchmark {running[0]} is running; one at a time")
            job = Job(secrets.token_hex(6), list(keywords), budget, write_table, base_table)
            self._jobs[job.id] = job
        threading.Thread(target=self._run, args=(job,), name=f"qoss-bench-{job.id}", daemon=True).start()
        return job

    def get(self, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise NotFound(f"benchmark {job_id!r} does not exist")
        return job

    def all(self) -> list[Job]:
        return list(self._jobs.values())

    def _run(self, job: Job) -> None:
        try:
            results = self._runner(job.keywords, job.budget, job.done.append)
            job.results = [_row(r) for r in results]
            if job.write_table is not None:
                job.table = self._write(job, results)
            job.state = "done"
        except Exception as exc:
            job.state = "failed"
            job.error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            job.finished_at = datetime.now(UTC).isoformat()

    def _write(self, job: Job, results: list[MicroResult]) -> str:
        from app.adapters.db.repositories import RatingTableRepository

        assert job.write_table is not None
        with self._factory() as session, session.begin():
            repo = RatingTableRepository(session)
            table = measured_table(
                name=job.write_table, base=repo.get(job.base_table), results=results, machine=self._machine,
                backend="userspace crypto (cryptography/OpenSSL)", date=datetime.now(UTC).date().isoformat(),
                description=f"Measured by POST /v1/benchmarks ({job.id}) on {self._machine}.",
            )
            repo.create(table, author=f"benchmark {job.id}", message="measured")
        return table.name
