"""``qoss bench tunnel``: throughput, RTT and parallel flows through real lab tunnels.

The command builds its own lab (two charons with kernel-libipsec in network namespaces
under a unique prefix) and its own SQLite database in a temporary directory (or uses
``--database-url``), registers the two charons as gateways through the gateway service,
and brings each suite's tunnel up and down through the tunnel service
(:func:`app.services.tunnels.create_tunnel` / ``delete_tunnel``), pinned to the suite by
the request's ``forbids`` (see :mod:`app.measure.domain.tunnel`). Everything it started is
stopped on exit, also on failure or Ctrl-C. ``--cpus`` pins both charons (every thread),
iperf3 and ping to a CPU set for the run (:func:`app.measure.adapters.tunnel.run_bench`).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from app.domain.errors import QossError

if TYPE_CHECKING:

    from app.measure.domain.tunnel import SuiteRun

# Everything heavier than typer is imported where it is used, so that loading the
# ``qoss`` command line (which registers this command) stays cheap.

__all__ = ["bench_tunnel"]


def _fmt(stat: dict[str, Any] | None, digits: int = 0) -> str:
    if not stat:
        return "-"
    return f"{stat['median']:.{digits}f} ±{stat['spread'] * 100:.0f}%"


def _summary(document: dict[str, Any]) -> str:
    base = document["baseline"]
    base_mbps = (base.get("throughput_mbps") or {}).get("median") or 0.0
    lines = [f"{'suite':<24} {'Mbit/s':>13} {'x base':>6} {'2 flows':>13} {'4 flows':>13} "
             f"{'RTT 64 B ms':>15} {'RTT 1400 B ms':>15}"]
    for row in [{"esp": "(no IPsec)", **base}, *document["suites"]]:
        mbps = row.get("throughput_mbps")
        ratio = f"{mbps['median'] / base_mbps:.2f}" if mbps and base_mbps else "-"
        rtt, par = row.get("rtt_ms", {}), row.get("parallel_mbps", {})
        lines.append(f"{row['esp']:<24} {_fmt(mbps):>13} {ratio:>6} {_fmt(par.get('2')):>13} "
                     f"{_fmt(par.get('4')):>13} {_fmt(rtt.get('64'), 3):>15} {_fmt(rtt.get('1400'), 3):>15}")
    return "\n".join(lines)


def _udp_summary(cell: dict[str, Any]) -> str:
    lines = [f"{'suite':<24} {'UDP Mbit/s':>13} {'offered':>9} {'jitter ms':>15} {'loss %':>13}"]
    for row in [{"esp": "(no IPsec)", **cell["baseline"]}, *cell["suites"]]:
        offered = row.get("offered_mbps")
        lines.append(f"{row['esp']:<24} {_fmt(row.get('throughput_mbps')):>13} "
                     f"{offered['median'] if offered else '-':>9} {_fmt(row.get('jitter_ms'), 3):>15} "
                     f"{_fmt(row.get('loss_percent'), 2):>13}")
    return "\n".join(lines)


def _write_table(*, runs: Sequence[SuiteRun], name: str, base: str, machine: str, backend: str, date: str,
                 database_url: str | None, prior: Mapping[str, float] | None = None, family: int = 4) -> dict[str, Any]:
    from app.adapters.db.engine import make_session_factory
    from app.adapters.files import dump_rating_table_yaml
    from app.bootstrap import engine_for, prepare_database
    from app.lab.bench import unit_of_work
    from app.measure.domain.tunnel import tunnel_table
    from app.services.ratings import get_table, import_table
    from app.settings import Settings

    settings = Settings(database_url=database_url) if database_url else Settings()
    prepare_database(settings)
    engine = engine_for(settings)
    try:
        with unit_of_work(make_session_factory(engine)) as uow:
            table = tunnel_table(name=name, base=get_table(uow=uow, name=base), runs=runs,
                                 machine=machine, backend=backend, date=date, prior=prior, family=family)
            text = dump_rating_table_yaml(table)
            target = Path("var/bench")
            target.mkdir(parents=True, exist_ok=True)
            (target / f"{table.name}.yaml").write_text(text)
            existing = None
            with contextlib.suppress(QossError):
                existing = get_table(uow=uow, name=name).revision
            imported = import_table(uow=uow, table=table, fmt="yaml", author="qoss bench",
                                    expected_revision=existing)
    finally:
        engine.dispose()
    return {"table": imported.name, "revision": imported.revision, "ratings": len(imported.ratings),
            "file": str(target / f"{table.name}.yaml"), "database": settings.database_url.split("@")[-1]}


def bench_tunnel(
    suites: Annotated[str | None, typer.Option(help="comma-separated ESP suites, e.g. aes128gcm16,aes128-sha256 "
                                               "(default: every transform both gateways can use, see docs)")] = None,
    repetitions: Annotated[int, typer.Option(min=1, max=20, help="repetitions, interleaved over the suites")] = 3,
    duration: Annotated[int, typer.Option(min=1, max=30, help="seconds per iperf3 run (whole seconds)")] = 2,
    ping_count: Annotated[int, typer.Option(min=1, max=200, help="echoes per RTT sample")] = 20,
    out: Annotated[Path | None, typer.Option(help="write the JSON document here")] = None,
    write_table: Annotated[str | None, typer.Option(help="write and import a rating table of this name")] = None,
    base: Annotated[str, typer.Option(help="table whose security levels the measured table keeps")] =
        "standards-2026",
    database_url: Annotated[str | None, typer.Option("--database-url", help="run in this database (default: a "
                                                     "throw-away SQLite); --write-table imports here too "
                                                     "(default: QOSS_DATABASE_URL)")] = None,
    cpus: Annotated[str | None, typer.Option(help="pin both charons (all threads), iperf3 and ping to these CPUs "
                                             "for the run, e.g. 1 or 0,1: steadier throughput on a small "
                                             "shared machine (default: not pinned)")] = None,
    micro: Annotated[Path | None, typer.Option(help="with --write-table: JSON of `qoss bench micro --out` from "
                                               "this machine; suites tied within the noise of the tunnel "
                                               "samples are then ordered by their crypto cost")] = None,
    family: Annotated[str, typer.Option(help="address families to measure over: 4, 6, 4,6 or 6,4 (IKE, ESP and "
                                        "the traffic of family 6 all over IPv6). With --write-table, family 4 "
                                        "writes NAME and family 6 writes NAME-ipv6")] = "4",
    protocol: Annotated[str, typer.Option(help="tcp, udp or tcp,udp: TCP throughput and parallel flows; UDP "
                                          "throughput at the highest rate with <= 1 % loss, with jitter and "
                                          "loss. RTT by size is measured in either")] = "tcp",
) -> None:
    """iperf3 and ping through real ESP tunnels (one per suite) and without IPsec, in a fresh lab (root).

    Per suite and repetition: TCP Mbit/s with 1, 2 and 4 flows, mean RTT by ICMP payload
    size (64-1400 B). Reported as median and spread = (max - min) / median. With --cpus the
    charons and iperf3 share the given CPUs, so throughput reflects each suite's CPU cost
    rather than where the scheduler put them; the document records the set. --family and
    --protocol give the cells measured (IPv4 and/or IPv6 x TCP and/or UDP; UDP: the highest
    rate with <= 1 % loss, its jitter and loss); the document has every cell and every sample.
    """
    from app.cli.common import need_files
    from app.lab.bench import bench_lab, read_micro_prior
    from app.measure.adapters.micro import machine_id
    from app.measure.adapters.pinning import parse_cpus
    from app.measure.adapters.traffic import BenchError
    from app.measure.adapters.tunnel import run_matrix
    from app.measure.domain.matrix import (
        UDP_LOSS_LIMIT,
        UDP_PAYLOAD,
        UDP_SEARCH_STEPS,
        ipv6_table_name,
        matrix_document,
        parse_families,
        parse_protocols,
    )
    from app.measure.domain.report import pinning
    from app.measure.domain.tunnel import default_suites, parse_suite

    try:
        specs = [parse_suite(s) for s in suites.split(",") if s.strip()] if suites else None
        families, protocols = parse_families(family), parse_protocols(protocol)
    except QossError as exc:
        typer.echo(exc.message, err=True)
        raise typer.Exit(2) from exc
    try:
        cpu_set = parse_cpus(cpus) if cpus is not None else None
    except ValueError as exc:
        typer.echo(f"--cpus: {exc}", err=True)
        raise typer.Exit(2) from exc
    if write_table is not None and "tcp" not in protocols:
        typer.echo("--write-table rates the suites by their TCP throughput: give --protocol tcp or tcp,udp", err=True)
        raise typer.Exit(2)
    if micro is not None and write_table is None:
        typer.echo("--micro orders the suites of the table --write-table writes: give both", err=True)
        raise typer.Exit(2)
    need_files(micro)
    try:
        prior = read_micro_prior(micro, machine_id()) if micro is not None else None
    except ValueError as exc:
        typer.echo(f"--micro: {exc}", err=True)
        raise typer.Exit(2) from exc
    if write_table is not None or database_url is not None:
        from app.cli.db import setup_database

        setup_database(database_url)  # before minutes of measuring; one it cannot use is one line (app/cli/db.py)
    try:
        with bench_lab(database_url, families=families) as bl:
            candidates = bl.candidates()
            specs = specs or default_suites(candidates)
            unusable = {s.name: "not every transform is supported by both gateways, usable by the back end "
                        "and rated" for s in specs if not set(s.transforms) <= set(candidates)}
            specs = [s for s in specs if s.name not in unusable]
            routes = bl.routes(candidates, families)
            with typer.progressbar(length=repetitions * (len(specs) + 1) * len(families), label="measuring",
                                   file=sys.stderr) as bar:
                matrix = run_matrix(
                    initiator=bl.initiator, responder=bl.responder, routes=routes, protocols=protocols,
                    suites=specs, repetitions=repetitions, duration=duration, ping_count=ping_count, cpus=cpu_set,
                    progress=lambda _: bar.update(1))
            skipped = {**unusable, **matrix.skipped}
            backend = bl.backend
    except (BenchError, QossError) as exc:
        typer.echo(f"bench tunnel failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    machine, date = machine_id(), datetime.now(UTC).date().isoformat()
    document = matrix_document(machine=machine, backend=backend, date=date, repetitions=repetitions,
                               duration_s=float(duration), cells=matrix.cells, cpus=cpu_set,
                               udp={"loss_limit_percent": UDP_LOSS_LIMIT, "max_probes": UDP_SEARCH_STEPS,
                                    "payload_bytes": UDP_PAYLOAD} if "udp" in protocols else None)
    for cell in document["cells"]:
        if len(document["cells"]) > 1:
            typer.echo(f"IPv{cell['family']} {cell['protocol'].upper()}")
        typer.echo(_summary(cell) if cell["protocol"] == "tcp" else _udp_summary(cell))
    if cpu_set is not None:
        typer.echo(pinning(cpu_set))
    for name, reason in skipped.items():
        typer.echo(f"skipped {name}: {reason}", err=True)
    if out is not None:
        out.write_text(json.dumps(document, indent=2) + "\n")
    tcp_cells = [c for c in matrix.cells if c.protocol == "tcp"]
    for cell in tcp_cells if write_table is not None else []:
        name = f"{write_table}" if cell.family == 4 else ipv6_table_name(f"{write_table}")  # docs/ipv6.md
        try:
            written = _write_table(runs=cell.suites, name=name, base=base, machine=machine, backend=backend,
                                   date=date, database_url=database_url, prior=prior, family=cell.family)
        except QossError as exc:
            typer.echo(json.dumps({"error": type(exc).__name__, "detail": exc.detail()}), err=True)
            raise typer.Exit(2) from exc
        typer.echo(json.dumps(written))
