"""The latest measurement of this machine's transforms (``qoss bench micro --out``): its figures
as a table, its plots where the ``bench`` extra (matplotlib) can draw them, and (to
``ratings:write``) a rating table made from it.

The plots are kept in the service's own directory (``QOSS_STATE_DIR``, folder ``plots/``) and
served only as the service wrote them there: a link, or a file or folder not the service's
own, is a 404."""

from __future__ import annotations

from pathlib import PurePath
from typing import Annotated

from fastapi import Path
from starlette.responses import Response

from app.adapters.state_dir import StateDir
from app.measure.services.latest import draw_plots, latest_measurement, read_plot
from app.services import ratings as table_svc
from app.ui.pages.common import console_router
from app.ui.render import page, secure
from app.ui.session import ConsoleDep
from app.web.deps import ReadUnitDep, SettingsDep

__all__ = ["router"]

router = console_router()
_CAPTIONS = {"throughput_micro.png": "Throughput per transform at 1400 B",
             "latency_fit.png": "ns per packet against size, with the fitted lines",
             "kex.png": "Key exchanges per second, per group"}


@router.get("/measurements")
def measurements(who: ConsoleDep, uow: ReadUnitDep, settings: SettingsDep) -> Response:
    """The latest measurement, or how to make one."""
    measured = latest_measurement(settings.measurements_dir)
    plots = draw_plots(measured, StateDir(settings.state_dir)) if measured is not None else None
    return page("measurements.html", {
        "console": who, "section": "measurements", "measured": measured, "directory": settings.measurements_dir,
        "rows": measured.rows() if measured is not None else [],
        "plots": [{"name": name, "caption": _CAPTIONS.get(name, PurePath(name).stem)} for name in plots or []],
        "plotting": plots is not None, "tables": table_svc.list_tables(uow=uow),
        "default_table": settings.default_table})


@router.get("/measurements/plots/{digest}/{name}")
def plot(digest: Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")],
         name: Annotated[str, Path(pattern=r"^[a-z_]{1,40}\.png$")], who: ConsoleDep,
         settings: SettingsDep) -> Response:
    """One drawn plot of a measurement (PNG), as the service kept it; anything else is a 404."""
    data = read_plot(StateDir(settings.state_dir), digest=digest, name=name)
    return secure(Response(data, media_type="image/png"))
