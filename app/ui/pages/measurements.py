"""The latest measurement of this machine's transforms (``qoss bench micro --out``): its figures
as a table, its plots where the ``bench`` extra (matplotlib) can draw them, and (to
``ratings:write``) a rating table made from it."""

from __future__ import annotations

import tempfile
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import Path
from starlette.responses import FileResponse, Response

from app.domain.errors import NotFound
from app.measure.services.latest import draw_plots, latest_measurement
from app.services import ratings as table_svc
from app.ui.pages.common import console_router
from app.ui.render import page, secure
from app.ui.session import ConsoleDep
from app.web.deps import ReadUnitDep, SettingsDep

__all__ = ["PLOTS_DIR", "router"]

router = console_router()
#: Where the plots of a measurement are drawn, once per measurement (by content digest).
PLOTS_DIR = FilePath(tempfile.gettempdir()) / "qoss-console-plots"
_CAPTIONS = {"throughput_micro.png": "Throughput per transform at 1400 B",
             "latency_fit.png": "ns per packet against size, with the fitted lines",
             "kex.png": "Key exchanges per second, per group"}


@router.get("/measurements")
def measurements(who: ConsoleDep, uow: ReadUnitDep, settings: SettingsDep) -> Response:
    """The latest measurement, or how to make one."""
    measured = latest_measurement(settings.measurements_dir)
    plots = draw_plots(measured, PLOTS_DIR) if measured is not None else None
    return page("measurements.html", {
        "console": who, "section": "measurements", "measured": measured, "directory": settings.measurements_dir,
        "rows": measured.rows() if measured is not None else [],
        "plots": [{"name": p.name, "caption": _CAPTIONS.get(p.name, p.stem)} for p in plots or []],
        "plotting": plots is not None, "tables": table_svc.list_tables(uow=uow),
        "default_table": settings.default_table})


@router.get("/measurements/plots/{digest}/{name}")
def plot(digest: Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")],
         name: Annotated[str, Path(pattern=r"^[a-z_]{1,40}\.png$")], who: ConsoleDep) -> Response:
    """One drawn plot of a measurement (PNG)."""
    path = PLOTS_DIR / digest / name
    if not path.is_file():
        raise NotFound(f"no plot {name}")
    return secure(FileResponse(path, media_type="image/png"))
