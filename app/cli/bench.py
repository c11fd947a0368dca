"""``qoss bench micro`` and ``qoss bench report``: measure this machine's transforms, and
report a measurement with its plots (the ``bench`` extra)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.common import DbUrl, Unit, emit, need_files
from app.domain.errors import QossError

__all__ = ["bench_micro", "bench_report"]


def bench_micro(
    budget: Annotated[float, typer.Option(help="seconds per algorithm at most")] = 1.0,
    only: Annotated[str | None, typer.Option(help="comma-separated keywords (default: all measurable)")] = None,
    write_table: Annotated[str | None, typer.Option(help="write and import a rating table of this name")] = None,
    base: Annotated[str, typer.Option(help="table whose security levels the measured table keeps")] =
        "standards-2026",
    out: Annotated[Path | None, typer.Option(help="also write the raw results as JSON here")] = None,
    sweep_limit: Annotated[float, typer.Option(help="seconds for the sweep with re-measurements of noisy runs")] =
        50.0,
    repeat: Annotated[int, typer.Option(min=1, max=9, help="whole sweeps to run; each figure is their median")] = 1,
    database_url: DbUrl = None,
) -> None:
    """Time every transform the crypto library offers (64-1400 B), fit ns = a*bytes + b, score 0-10."""
    import time
    from datetime import UTC, datetime

    from app.adapters.files import dump_rating_table_yaml
    from app.domain.scoring import combine_repeats, measured_table
    from app.measure.adapters.micro import BACKEND, available, library_version, machine_id, run_micro

    keywords = [k.strip() for k in only.split(",")] if only else available()
    unit = Unit(database_url, setup=True) if write_table is not None else None  # before a minute of measuring
    began = time.monotonic()
    with typer.progressbar(length=len(keywords) * repeat, label="measuring") as bar:
        try:
            results = combine_repeats([run_micro(keywords, budget_per_algorithm=budget, sweep_limit=sweep_limit,
                                                 progress=lambda _: bar.update(1)) for _ in range(repeat)])
        except ValueError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from exc
    rows = []
    for r in results:
        row: dict[str, Any] = {"algorithm": r.keyword, "method": r.method, "spread": round(r.spread, 4),
                               "samples": r.samples}
        if r.ops_per_s is not None:
            row["ops_per_s"] = round(r.ops_per_s)
        else:
            fit = r.fit
            row.update(a_ns_per_byte=round(fit.a, 4), b_ns=round(fit.b, 1), r2=round(fit.r2, 4),
                       mb_per_s_1400=round(r.mb_per_s, 1), ns=dict(r.ns_by_size))
        rows.append(row)
    elapsed = round(time.monotonic() - began, 1)
    if out is not None:
        command = " ".join(["qoss bench micro", f"--budget {budget}", *([f"--only {only}"] if only else []),
                            *([f"--repeat {repeat}"] if repeat > 1 else []), f"--out {out}"])
        out.write_text(json.dumps({
            "kind": "qoss-bench-micro", "version": 1, "machine": machine_id(), "backend": BACKEND,
            "library": library_version(), "date": datetime.now(UTC).date().isoformat(), "command": command,
            "budget_per_algorithm": budget, "repeat": repeat, "elapsed_s": elapsed, "results": rows}, indent=2)
            + "\n")
    typer.echo(json.dumps({"machine": machine_id(), "algorithms": len(rows), "elapsed_s": elapsed,
                           "worst_spread": max(r["spread"] for r in rows)}))
    if write_table is None or unit is None:
        return

    def write(**kw: Any) -> dict[str, Any]:
        from app.services.ratings import get_table, import_table

        table = measured_table(
            name=write_table, base=get_table(uow=kw["uow"], name=base), results=results,
            machine=machine_id(), backend=BACKEND,
            date=datetime.now(UTC).date().isoformat(),
            description=f"Measured by `qoss bench micro` on {machine_id()}; levels from {base}.",
        )
        text = dump_rating_table_yaml(table)
        target = Path("var/bench")
        target.mkdir(parents=True, exist_ok=True)
        (target / f"{table.name}.yaml").write_text(text)
        imported = import_table(uow=kw["uow"], table=table, fmt="yaml", author="qoss bench")
        return {"table": imported.name, "revision": imported.revision, "ratings": len(imported.ratings),
                "file": str(target / f"{table.name}.yaml")}

    emit(unit.run(write))


def bench_report(
    micro: Annotated[Path, typer.Option(help="JSON written by `qoss bench micro --out`")],
    out: Annotated[Path, typer.Option(help="directory for report.md and the PNG plots")],
    tunnel: Annotated[Path | None, typer.Option(help="JSON written by `qoss bench tunnel --out`")] = None,
    levels_from: Annotated[str, typer.Option(help="shipped rating table for today's security levels")] =
        "standards-2026",
) -> None:
    """Markdown report with plots: throughput, latency fits, key exchange, today beside the published tables."""
    need_files(micro, tunnel)
    try:
        from app.measure.adapters.report import write_report
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        typer.echo("qoss bench report draws its plots with matplotlib, which this install lacks: "
                   "install qoss with its bench extra (pip install 'qoss[bench]')", err=True)
        raise typer.Exit(2) from None
    from app.adapters.files import load_rating_table, read_document
    from app.settings import SHIPPED_RATINGS_DIR

    table = load_rating_table(SHIPPED_RATINGS_DIR / f"{levels_from}.yaml")
    levels = {k: r.confidentiality if r.confidentiality is not None else r.integrity
              for k, r in table.ratings.items()}
    command = " ".join(["qoss bench report", f"--micro {micro}", *([f"--tunnel {tunnel}"] if tunnel else []),
                        f"--out {out}"])
    micro_command = None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        micro_command = json.loads(read_document(micro)).get("command")
    try:
        report = write_report(micro_path=micro, tunnel_path=tunnel, out_dir=out, levels=levels,
                              commands=[c for c in (micro_command, command) if c])
    except QossError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    emit({"report": str(report.markdown), "plots": [str(p) for p in report.plots],
           "flips": sum(len(c.flips) for c in report.comparisons)})
