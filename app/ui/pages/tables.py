"""Rating tables: the list, the grid with in-place cell edits (If-Match underneath), a concurrent
edit shown side by side, history and revert, YAML export.

Each handler reads its input, calls one service through the request's unit of work, and
renders a template; a change answers htmx with a fragment and a plain browser with a
redirect (reading works without JavaScript).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import ValidationError
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from app.adapters import files
from app.domain.algorithms import CATALOGUE, lookup
from app.domain.auth import Forbidden
from app.domain.errors import InvalidInput, NotFound, StaleRevision
from app.domain.ports import UnitOfWork
from app.domain.ratings import Rating, RatingTable
from app.measure.services.latest import latest_measurement
from app.services import ratings as svc
from app.settings import Settings
from app.ui.pages.common import (
    Keyword,
    RatingsWriter,
    console_router,
    failed,
    form_revision,
    history_page,
    impact_of,
    problems,
)
from app.ui.pages.common import Name as TableName
from app.ui.render import page
from app.ui.routing import is_htmx
from app.ui.session import Console, ConsoleDep, FormDep
from app.web.deps import ActorDep, CacheDep, ReadUnitDep, SettingsDep, UnitDep
from app.web.schemas import RatingPatch

__all__ = ["grid_row", "list_page", "rating_patch", "router", "table_page"]

router = console_router()

#: The editable fields of a row, in the grid's order.
_LEVELS = ("confidentiality", "integrity", "key_exchange")
_FIELDS = (*_LEVELS, "performance", "reason")


# ------------------------------------------------------------------ rating tables


def list_page(who: Console, uow: UnitOfWork, settings: Settings, *, notice: str | None = None,
              form: dict[str, str] | None = None, status: int = 200) -> Response:
    """Every table, and (to a writer) the forms that make one: import a YAML file, or from the
    latest measurement (offered only if there is one)."""
    measured = latest_measurement(settings.measurements_dir) if who.may("ratings:write") else None
    return page("tables.html", {"console": who, "tables": svc.list_tables(uow=uow), "notice": notice,
                                "form": form or {}, "measured": measured}, status=status)


@router.get("/tables")
def tables(who: ConsoleDep, uow: ReadUnitDep, settings: SettingsDep) -> Response:
    return list_page(who, uow, settings)


def grid_row(rating: Rating) -> dict[str, Any]:
    """One grid row: the rating's own fields, its kind, its measured time per byte."""
    measured = rating.measurement.a_ns_per_byte if rating.measurement is not None else None
    blank = {"confidentiality": None, "integrity": None, "key_exchange": None, "reason": ""}
    return {**blank, **rating.as_dict(), "kind": lookup(rating.algorithm).kind, "ns_per_byte": measured}


def _grid(table: RatingTable) -> list[dict[str, Any]]:
    return [grid_row(r) for r in table.ratings.values()]


def table_page(who: Console, table: RatingTable, *, editing: str | None = None,
               conflict: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
               notice: str | None = None, adding: dict[str, str] | None = None,
               preview: dict[str, Any] | None = None, status: int = 200) -> Response:
    """The grid; ``notice`` says why a change was refused, ``adding`` refills the add-a-row form,
    ``preview`` is an edit's impact shown in its row."""
    rows = _grid(table)
    if error is not None:  # the row being edited shows what the admin typed
        rows = [{**r, **error["mine"]} if r["algorithm"] == error["keyword"] else r for r in rows]
    missing = [{"keyword": k, "kind": a.kind.value} for k, a in CATALOGUE.items() if k not in table.ratings]
    return page("table.html", {"console": who, "table": table, "rows": rows, "editing": editing,
                               "conflict": conflict, "error": error, "notice": notice, "adding": adding or {},
                               "missing": missing, "preview": preview}, status=status)


def _rating(table: RatingTable, keyword: str) -> Rating:
    rating = table.get(keyword)
    if rating is None:
        raise NotFound(f"{table.name} has no row {keyword!r}")
    return rating


@router.get("/tables/{name}")
def table(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    return table_page(who, svc.get_table(uow=uow, name=name))


@router.get("/tables/{name}/ratings/{keyword}")
def row(name: TableName, keyword: Keyword, request: Request, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """One row as shown (htmx: cancel an edit, or drop one's own values after a conflict)."""
    current = svc.get_table(uow=uow, name=name)
    rating = _rating(current, keyword)
    if not is_htmx(request):
        return RedirectResponse(f"/ui/tables/{name}#row-{keyword}", status_code=303)
    return page("_row.html", {"console": who, "table": current, "r": grid_row(rating)})


@router.get("/tables/{name}/ratings/{keyword}/edit")
def edit_row(name: TableName, keyword: Keyword, request: Request, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """The row as a form, based on the current revision (403 without ``ratings:write``)."""
    if not who.may("ratings:write"):
        raise Forbidden("ratings:write")
    current = svc.get_table(uow=uow, name=name)
    rating = _rating(current, keyword)
    if not is_htmx(request):
        return table_page(who, current, editing=keyword)
    return page("_row_edit.html", {"console": who, "table": current, "r": grid_row(rating), "error": None})


def rating_patch(form: dict[str, str]) -> dict[str, Any]:
    """The form's fields as a rating patch, validated by the API's own schema (``RatingPatch``)."""
    document: dict[str, Any] = {}
    try:
        for field in _LEVELS:
            text = form.get(field, "").strip()
            document[field] = int(text) if text else None
        text = form.get("performance", "").strip()
        document["performance"] = float(text) if text else None
    except ValueError as exc:
        raise InvalidInput("levels are whole numbers 0-10 and performance a number 0-10") from exc
    document["reason"] = form.get("reason", "")
    try:
        return RatingPatch.model_validate(document).model_dump(exclude_unset=True)
    except ValidationError as exc:
        raise InvalidInput(problems(exc)) from exc


def _edited(name: str, keyword: str, request: Request, who: Console, form: dict[str, str], uow: UnitOfWork,
            actor: str) -> RatingTable | Response:
    """Make the form's edit of one row in ``uow``, based on the revision the form names (If-Match):
    the edited table, or the answer to a refused edit, nothing of it made.

    A concurrent edit (``StaleRevision``) answers 409 with both values side by side: the admin
    re-applies theirs (based on the new revision) or drops it. A bad value answers 422 with
    the form again.
    """
    mine = {f: form.get(f, "") for f in _FIELDS}
    expected = form_revision(form)
    try:
        changes = rating_patch(form)
        return svc.update_rating(uow=uow, name=name, algorithm=keyword, changes=changes,
                                 expected_revision=expected, author=actor)
    except StaleRevision:
        failed(request, "StaleRevision", 409)
        current = svc.get_table(uow=uow, name=name)
        conflict = {"keyword": keyword, "mine": mine, "theirs": grid_row(_rating(current, keyword)),
                    "revision": current.revision, "based_on": expected}
        if is_htmx(request):
            return page("_row_conflict.html", {"console": who, "table": current, "c": conflict}, status=409)
        return table_page(who, current, conflict=conflict, status=409)
    except InvalidInput as exc:
        failed(request, type(exc).__name__, 422)
        current = svc.get_table(uow=uow, name=name)
        error = {"keyword": keyword, "message": exc.message, "mine": mine}
        if is_htmx(request):
            return page("_row_edit.html", {"console": who, "table": current,
                                           "r": {**grid_row(_rating(current, keyword)), **mine},
                                           "error": exc.message}, status=422)
        return table_page(who, current, editing=keyword, error=error, status=422)


@router.post("/tables/{name}/ratings/{keyword}/preview")
def preview_row(name: TableName, keyword: Keyword, request: Request, who: RatingsWriter, form: FormDep,
                uow: UnitDep, actor: ActorDep, settings: SettingsDep) -> Response:
    """What saving the form's values would do to the running tunnels, nothing saved: the edit
    is made, assessed (as ``?dry_run=true`` does) and rolled back; the answer shows the
    impact with **Save** (the same values and revision, to :func:`save_row`) and **Cancel**."""
    edited = _edited(name, keyword, request, who, form, uow, actor)
    if isinstance(edited, Response):
        return edited
    assessed = impact_of(request, uow, settings)
    current = svc.get_table(uow=uow, name=name)
    shown = {"keyword": keyword, "mine": {f: form.get(f, "") for f in _FIELDS}, "revision": int(form["revision"]),
             "now": grid_row(_rating(current, keyword)), "impact": assessed}
    if is_htmx(request):
        return page("_row_preview.html", {"console": who, "table": current, "p": shown})
    return table_page(who, current, preview=shown)


@router.post("/tables/{name}/ratings/{keyword}")
def save_row(name: TableName, keyword: Keyword, request: Request, who: RatingsWriter, form: FormDep,
             uow: UnitDep, actor: ActorDep, cache: CacheDep) -> Response:
    """Save one row with If-Match semantics: the form names the revision it was based on (a
    concurrent edit or a bad value: see :func:`_edited`)."""
    saved = _edited(name, keyword, request, who, form, uow, actor)
    if isinstance(saved, Response):
        return saved
    cache.invalidate(name)
    if is_htmx(request):
        return page("_row.html", {"console": who, "table": saved, "r": grid_row(_rating(saved, keyword)),
                                  "saved": True})
    return RedirectResponse(f"/ui/tables/{name}#row-{keyword}", status_code=303)


@router.get("/tables/{name}/revisions")
def revisions(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """The history, newest first, each revision with its per-field changes."""
    return history_page(who, name, svc.table_revisions(uow=uow, name=name), base=f"/ui/tables/{name}",
                    section="tables", can_revert=who.may("ratings:write"), by_algorithm=True)


@router.post("/tables/{name}/revert")
def revert(name: TableName, request: Request, who: RatingsWriter, form: FormDep, uow: UnitDep, actor: ActorDep,
           cache: CacheDep) -> Response:
    """Go back to a revision (a new revision; history kept). The form names the current
    revision it saw: a revert over someone's newer edit is refused (409)."""
    revision, expected = form_revision(form), form_revision(form, "expected")
    svc.revert_table(uow=uow, name=name, revision=revision, expected_revision=expected, author=actor)
    cache.invalidate(name)
    return RedirectResponse(f"/ui/tables/{name}/revisions", status_code=303)


@router.get("/tables/{name}/export")
def export(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """The table as YAML, as ``GET /v1/rating-tables/{name}/export`` gives it."""
    text = files.dump_rating_table(svc.get_table(uow=uow, name=name), "yaml")
    return PlainTextResponse(text, media_type="application/yaml",
                             headers={"Content-Disposition": f'attachment; filename="{name}.yaml"'})
