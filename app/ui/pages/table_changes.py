"""Rating tables made or reshaped whole: add a row, remove a row (both If-Match, like a cell
edit: ``PATCH`` and ``PUT`` of the API), import a YAML file (``POST /v1/rating-tables/import``),
or make a table from the latest measurement (``qoss bench micro --write-table``).

Every change is a plain form: the answer is a redirect, or the page again with the reason a
change was refused and nothing of it saved.
"""

from __future__ import annotations

from fastapi import Request
from starlette.responses import RedirectResponse, Response

from app.adapters import files
from app.domain.algorithms import lookup
from app.domain.errors import AlreadyExists, InvalidInput, StaleRevision
from app.domain.ports import UnitOfWork
from app.measure.services.latest import table_from_measurement
from app.services import ratings as svc
from app.ui.pages.common import (
    Keyword,
    RatingsWriter,
    changed_by,
    console_router,
    failed,
    form_revision,
    impact_of,
    needs,
)
from app.ui.pages.common import Name as TableName
from app.ui.pages.tables import list_page, rating_patch, table_page
from app.ui.render import page
from app.ui.session import INVALID_UPLOAD, Console, ConsoleDep, FormDep
from app.web.deps import ActorDep, SettingsDep, UnitDep
from app.web.edits import count_revision

__all__ = ["router"]

router = console_router()
_ROW_FIELDS = ("algorithm", "confidentiality", "integrity", "key_exchange", "post_quantum", "performance", "reason")


def _stale(request: Request, uow: UnitOfWork, name: str, current: int, since: int) -> str:
    """Why a change made on revision ``since`` was refused (409): who saved what came since, and when."""
    failed(request, "StaleRevision", 409)
    by = changed_by(svc.table_revisions(uow=uow, name=name), since=since)
    return (f"The table changed while you had it open (revision {current} is current now"
            f"{': ' + by if by else ''}): nothing was saved. Look at it again, then repeat the change.")


def _stale_page(request: Request, who: Console, uow: UnitOfWork, name: str, since: int,
                adding: dict[str, str] | None = None, kept: str | None = None) -> Response:
    """The table page after another edit came first (409): this edit rolled back, the current
    revision shown, the admin's values kept (``adding``, or the file's text ``kept``)."""
    uow.rollback()
    current = svc.get_table(uow=uow, name=name)
    return table_page(who, current, notice=_stale(request, uow, name, current.revision, since), adding=adding,
                      kept=kept, status=409)


@router.post("/tables/{name}/ratings")
def add_row(name: TableName, request: Request, who: RatingsWriter, form: FormDep, uow: UnitDep,
            actor: ActorDep) -> Response:
    """Add an algorithm's row: a new revision based on the one the form was opened at (merged over
    newer revisions when they did not add it too; the grid then says so)."""
    expected = form_revision(form)
    adding = {f: form.get(f, "") for f in _ROW_FIELDS}
    current = svc.get_table(uow=uow, name=name)
    try:
        keyword = lookup(adding["algorithm"]).keyword
        if current.get(keyword) is not None:
            raise AlreadyExists(f"{name} has a row {keyword} already: edit it in the grid")
        added = svc.update_rating(uow=uow, name=name, algorithm=keyword, changes=rating_patch(form),
                                  expected_revision=expected, author=actor)
    except StaleRevision:
        return _stale_page(request, who, uow, name, expected, adding=adding)
    except (InvalidInput, AlreadyExists) as exc:
        status = 409 if isinstance(exc, AlreadyExists) else 422
        failed(request, type(exc).__name__, status)
        return table_page(who, current, notice=f"Not added: {exc.message}", adding=adding, status=status)
    count_revision(request, "rating_table")
    merged = f"?saved={keyword}&over={expected}" if added.revision > expected + 1 else ""
    return RedirectResponse(f"/ui/tables/{name}{merged}#row-{keyword}", status_code=303)


@router.get("/tables/{name}/ratings/{keyword}/remove")
def confirm_remove(name: TableName, keyword: Keyword, request: Request, who: ConsoleDep, uow: UnitDep,
                   actor: ActorDep, settings: SettingsDep) -> Response:
    """Ask before removing a row, showing what removing it would do to the running tunnels (the
    removal made, assessed and rolled back: nothing kept); the form names the revision it was
    asked at."""
    needs(who, "ratings:write")
    current = svc.get_table(uow=uow, name=name)
    if current.get(keyword) is None:
        return RedirectResponse(f"/ui/tables/{name}", status_code=303)
    svc.replace_table(uow=uow, name=name, document=current.without(keyword).as_dict(),
                      expected_revision=current.revision, author=actor, message=f"removed {keyword}")
    return page("confirm.html", {
        "console": who, "section": "tables", "title": f"Remove {keyword} from {name}?",
        "message": f"{name} will no longer rate {keyword}: a negotiation with this table cannot choose it. "
                   "The row stays in the history; reverting brings it back.",
        "action": f"/ui/tables/{name}/ratings/{keyword}/remove", "fields": {"revision": current.revision},
        "button": f"Remove {keyword}", "cancel": f"/ui/tables/{name}#row-{keyword}",
        "impact": impact_of(request, uow, settings)})


@router.post("/tables/{name}/ratings/{keyword}/remove")
def remove_row(name: TableName, keyword: Keyword, request: Request, who: RatingsWriter, form: FormDep,
               uow: UnitDep, actor: ActorDep) -> Response:
    """Remove a row: the whole table replaced without it (``PUT`` with If-Match underneath)."""
    expected = form_revision(form)
    current = svc.get_table(uow=uow, name=name)
    if current.revision != expected:
        return table_page(who, current, notice=_stale(request, uow, name, current.revision, expected), status=409)
    if current.get(keyword) is None:
        return RedirectResponse(f"/ui/tables/{name}", status_code=303)
    try:
        svc.replace_table(uow=uow, name=name, document=current.without(keyword).as_dict(),
                          expected_revision=expected, author=actor, message=f"removed {keyword}")
    except StaleRevision:
        return _stale_page(request, who, uow, name, expected)
    count_revision(request, "rating_table")
    return RedirectResponse(f"/ui/tables/{name}", status_code=303)


@router.post("/tables/import")
def import_table(request: Request, who: RatingsWriter, form: FormDep, uow: UnitDep, actor: ActorDep,
                 settings: SettingsDep) -> Response:
    """Import an uploaded YAML file as the API's import does: a new table, or with ``revision``
    a new revision of the table ``name``. A bad file changes nothing and says what is wrong; a
    replacement refused because the table changed since keeps the file's text in the page's
    form (``kept``), sent again unless another file is chosen."""
    name = form.get("name", "").strip() or None
    replacing = form.get("revision", "").strip()
    text = form.get("file", "") if form.get("file", "").strip() else form.get("kept", "")
    try:
        if form.get("file" + INVALID_UPLOAD):
            raise InvalidInput(f"the file is {form['file' + INVALID_UPLOAD]}: a rating table is YAML text")
        if not text.strip():
            raise InvalidInput("choose a YAML file (as `qoss ratings export` or Export YAML gives one)")
        expected = form_revision(form) if replacing else None
        table = files.parse_rating_table(text, "yaml", name=name)
        imported = svc.import_table(uow=uow, table=table, fmt="yaml", author=actor, expected_revision=expected)
    except StaleRevision:
        if not (replacing and name is not None):
            raise
        return _stale_page(request, who, uow, name, form_revision(form), kept=text)
    except (InvalidInput, AlreadyExists) as exc:
        uow.rollback()
        status = 422 if isinstance(exc, InvalidInput) else 409
        failed(request, type(exc).__name__, status)
        notice = f"Nothing imported: {exc.message}"
        if isinstance(exc, AlreadyExists):
            notice += ". To replace it, open that table and import the file there."
        if replacing and name is not None:
            return table_page(who, svc.get_table(uow=uow, name=name), notice=notice, status=status)
        return list_page(who, uow, settings, notice=notice, form={"name": name or ""}, status=status)
    count_revision(request, "rating_table")
    return RedirectResponse(f"/ui/tables/{imported.name}", status_code=303)


@router.post("/tables/from-measurement")
def from_measurement(request: Request, who: RatingsWriter, form: FormDep, uow: UnitDep, actor: ActorDep,
                     settings: SettingsDep) -> Response:
    """A new table from the latest measurement (levels from a base table), as
    ``qoss bench micro --write-table`` makes one."""
    name = form.get("name", "").strip()
    base = form.get("base", "").strip() or settings.default_table
    try:
        if not name:
            raise InvalidInput("name the new table")
        table = table_from_measurement(uow=uow, directory=settings.measurements_dir, name=name, base_table=base,
                                       author=actor)
    except (InvalidInput, AlreadyExists) as exc:
        uow.rollback()
        status = 422 if isinstance(exc, InvalidInput) else 409
        failed(request, type(exc).__name__, status)
        return list_page(who, uow, settings, notice=f"No table made: {exc.message}",
                         form={"measured_name": name, "base": base}, status=status)
    count_revision(request, "rating_table")
    return RedirectResponse(f"/ui/tables/{table.name}", status_code=303)
