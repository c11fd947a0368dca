"""The latest measurement of this machine's transforms, and a rating table made from it.

A measurement is the JSON document ``qoss bench micro --out FILE`` writes; the latest is the
newest such document (by modification time) in a directory (``QOSS_MEASUREMENTS_DIR``).
The table is made as ``qoss bench micro --write-table`` makes it
(:func:`app.domain.scoring.measured_table`: levels from a base table, performance and the
latency fit measured) and stored as an import (:func:`app.services.ratings.import_table`).
Plots are drawn by ``qoss bench report``'s own code, which needs the ``bench`` extra
(matplotlib); without it :func:`draw_plots` says so by answering None. They are kept, with
their ``report.md``, in the service's own directory (``plots/<digest>/`` of
``QOSS_STATE_DIR``, through a :class:`PlotStore`), never at a path another local user could
plant or swap, and :func:`read_plot` serves only a file kept there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from app.domain.algorithms import lookup
from app.domain.errors import InvalidInput, NotFound
from app.domain.ports import UnitOfWork
from app.domain.ratings import RatingTable
from app.domain.scoring import measured_table
from app.measure.domain.runs import MicroRun, parse_micro
from app.services.ratings import get_table, import_table

__all__ = ["PLOTS_FOLDER", "Measured", "PlotStore", "draw_plots", "latest_measurement", "read_plot",
           "table_from_measurement"]

log = logging.getLogger("qoss.measurements")

#: Documents looked at, newest first, and the largest read.
_SCAN, _MAX_BYTES = 200, 8 * 1_048_576
_KIND = "qoss-bench-micro"
_PLOTTING = threading.Lock()
#: The folder of the state directory that keeps each measurement's plots, in ``<digest>/``.
PLOTS_FOLDER = "plots"
#: The names of a measurement's plots, one a line: written last, so the set it names is whole.
_INDEX = "plots.txt"


class PlotStore(Protocol):
    """Where plots are kept: :class:`app.adapters.state_dir.StateDir` (files the service wrote
    itself, no link followed; a refused one raises a ``PermissionError``)."""

    def read(self, *parts: str) -> bytes:
        """The content of the kept file ``parts…``."""
        ...

    def write(self, *parts: str, data: bytes, mode: int = 0o600) -> None:
        """Keep ``data`` as the file ``parts…``, written whole."""
        ...


@dataclass(frozen=True)
class Measured:
    """One ``qoss bench micro --out`` document: where it is, what it says, its content digest."""

    path: Path
    run: MicroRun
    digest: str

    def rows(self) -> list[dict[str, Any]]:
        """One row per measured transform: throughput and latency fit, or key exchanges per second."""
        out = []
        for r in self.run.results:
            try:
                kind = lookup(r.keyword).kind.value
            except InvalidInput:
                kind = "unknown"
            row: dict[str, Any] = {"algorithm": r.keyword, "kind": kind, "method": r.method,
                                   "spread": round(r.spread, 4), "samples": r.samples, "mb_per_s": None,
                                   "a_ns_per_byte": None, "b_ns": None, "ops_per_s": None}
            if r.ops_per_s is not None:
                row["ops_per_s"] = round(r.ops_per_s)
            else:
                a, b = r.per_byte()  # as the measured table records it
                row.update(mb_per_s=round(r.mb_per_s, 1), a_ns_per_byte=round(a, 4), b_ns=round(b, 1))
            out.append(row)
        return out


def latest_measurement(directory: Path) -> Measured | None:
    """The newest ``qoss bench micro --out`` document in ``directory`` (None: there is none).

    Files that are not such a document (other JSON, unreadable, too large) are passed over.
    """
    try:
        files = [(p.stat().st_mtime, p) for p in directory.glob("*.json") if p.is_file()]
    except OSError:
        return None
    for _, path in sorted(files, reverse=True)[:_SCAN]:
        try:
            if path.stat().st_size > _MAX_BYTES:
                continue
            raw = path.read_bytes()
            data = json.loads(raw)
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("kind") != _KIND:
            continue
        try:
            run = parse_micro(data)
        except InvalidInput:
            continue
        return Measured(path, run, hashlib.sha256(raw).hexdigest()[:16])
    return None


def table_from_measurement(*, uow: UnitOfWork, directory: Path, name: str, base_table: str,
                           author: str) -> RatingTable:
    """A new rating table ``name`` from the latest measurement: levels from ``base_table``.

    Raises:
        NotFound: no measurement in ``directory``, or no table ``base_table``.
        InvalidInput: no measured algorithm is rated in the base table.
        AlreadyExists: a table ``name`` exists.
    """
    measured = latest_measurement(directory)
    if measured is None:
        raise NotFound(f"no measurement: run `qoss bench micro --out {directory}/micro.json` first")
    run = measured.run
    base = get_table(uow=uow, name=base_table)
    table = measured_table(
        name=name, base=base, results=run.results, machine=run.machine, backend=run.backend or "unknown",
        date=run.date or datetime.now(UTC).date().isoformat(),
        description=f"Measured by `qoss bench micro` on {run.machine} ({measured.path.name}); levels from "
                    f"{base_table}.")
    return import_table(uow=uow, table=table, fmt="measurement", author=author)


def draw_plots(measured: Measured, store: PlotStore) -> list[str] | None:
    """The names of the measurement's plots (PNG), as ``qoss bench report`` draws them, kept in
    ``store`` under ``plots/<digest>/`` beside their ``report.md`` (drawn once per digest);
    None without matplotlib (the ``bench`` extra).

    They are drawn in a private temporary folder (a fresh name, 0700) and copied into
    ``store``. A store that refuses a file or folder (a link, another user's) is logged and
    answered with no plots.
    """
    try:
        from app.measure.adapters.report import write_report
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        return None
    with _PLOTTING:
        try:
            try:
                return _kept_names(store.read(PLOTS_FOLDER, measured.digest, _INDEX))
            except (FileNotFoundError, NotADirectoryError):
                pass
            with tempfile.TemporaryDirectory(prefix="qoss-plots-") as private:
                report = write_report(micro_path=measured.path, out_dir=Path(private))
                names = sorted(plot.name for plot in report.plots)
                for plot in report.plots:
                    store.write(PLOTS_FOLDER, measured.digest, plot.name, data=plot.read_bytes())
                store.write(PLOTS_FOLDER, measured.digest, report.markdown.name, data=report.markdown.read_bytes())
                store.write(PLOTS_FOLDER, measured.digest, _INDEX, data="".join(f"{n}\n" for n in names).encode())
        except OSError as exc:
            log.error("the plots of %s are not kept: %s", measured.path, exc)
            return []
    return names


def read_plot(store: PlotStore, *, digest: str, name: str) -> bytes:
    """The PNG ``name`` of the measurement ``digest`` as kept in ``store`` by :func:`draw_plots`.

    Raises:
        NotFound: no such plot, or a file the store refuses (a link, not the service's own
            regular file; logged): never anything else's content.
    """
    if not name.endswith(".png"):
        raise NotFound(f"no plot {name}")
    try:
        return store.read(PLOTS_FOLDER, digest, name)
    except PermissionError as exc:
        log.warning("plot %s/%s refused: %s", digest, name, exc)
        raise NotFound(f"no plot {name}") from exc
    except (OSError, ValueError) as exc:
        raise NotFound(f"no plot {name}") from exc


def _kept_names(index: bytes) -> list[str]:
    return [n for n in index.decode("utf-8", "replace").splitlines() if n.endswith(".png") and "/" not in n]
