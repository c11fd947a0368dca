"""Rating tables: the list, the grid with in-place cell edits (If-Match underneath), a concurrent
edit shown side by side, history and revert, YAML export.

Each handler reads its input, calls one service through the request's unit of work, and
renders a template; a change answers htmx with a fragment and a plain browser with a
redirect (reading works without JavaScript).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request
from pydantic import ValidationError
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from app.adapters import files
from app.domain.algorithms import CATALOGUE, lookup
from app.domain.auth import Forbidden
from app.domain.errors import EditConflict, InvalidInput, NotFound, StaleRevision
from app.domain.ports import UnitOfWork
from app.domain.ratings import Rating, RatingTable, relevant_dimensions
from app.domain.revisions import diff_tables
from app.measure.services.latest import latest_measurement
from app.services import ratings as svc
from app.services.impact import ImpactReport
from app.settings import Settings
from app.ui.pages.common import (
    Keyword,
    RatingsWriter,
    changed_by,
    confirm_revert_page,
    console_router,
    failed,
    form_revision,
    history_page,
    impact_of,
    needs,
    problems,
)
from app.ui.pages.common import Name as TableName
from app.ui.render import page
from app.ui.routing import is_htmx
from app.ui.session import Console, ConsoleDep, FormDep
from app.web.deps import ActorDep, ReadUnitDep, SettingsDep, UnitDep
from app.web.schemas import RatingPatch

__all__ = ["grid_row", "list_page", "rating_patch", "router", "table_page"]

router = console_router()

#: The editable fields of a row, in the grid's order.
_LEVELS = ("confidentiality", "integrity", "key_exchange", "post_quantum")
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
    """One grid row: the rating's own fields, its kind, the levels that kind carries (``levels``:
    an AEAD confidentiality and integrity, a cipher confidentiality alone, ...), its measured time
    per byte."""
    measured = rating.measurement.a_ns_per_byte if rating.measurement is not None else None
    blank = {"confidentiality": None, "integrity": None, "key_exchange": None, "post_quantum": None, "reason": ""}
    kind = lookup(rating.algorithm).kind
    return {**blank, **rating.as_dict(), "kind": kind, "levels": relevant_dimensions(kind), "ns_per_byte": measured}


def _editable(rating: Rating) -> tuple[str, ...]:
    """The fields of ``rating``'s row its edit form offers: the levels its kind carries, then
    performance and reason."""
    return (*relevant_dimensions(lookup(rating.algorithm).kind), "performance", "reason")


def _grid(table: RatingTable) -> list[dict[str, Any]]:
    return [grid_row(r) for r in table.ratings.values()]


def table_page(who: Console, table: RatingTable, *, editing: str | None = None,
               conflict: dict[str, Any] | None = None, error: dict[str, Any] | None = None,
               notice: str | None = None, adding: dict[str, str] | None = None,
               preview: dict[str, Any] | None = None, status: int = 200, marked: str | None = None,
               merged: str | None = None, kept: str | None = None) -> Response:
    """The grid; ``notice`` says why a change was refused, ``adding`` refills the add-a-row form,
    ``preview`` is an edit's impact shown in its row, ``merged`` (the status line) says what
    became of the admin's last change (the row ``marked`` saved over others' newer changes, a
    preview shown), ``kept`` is the text of a YAML file a refused replacement keeps for the next try."""
    rows = _grid(table)
    if error is not None:  # the row being edited shows what the admin typed
        rows = [{**r, **error["mine"]} if r["algorithm"] == error["keyword"] else r for r in rows]
    missing = [{"keyword": k, "kind": a.kind.value} for k, a in CATALOGUE.items() if k not in table.ratings]
    return page("table.html", {"console": who, "table": table, "rows": _with_conflict(rows, conflict),
                               "editing": editing, "conflict": conflict, "error": error, "notice": notice,
                               "adding": adding or {}, "missing": missing, "preview": preview, "marked": marked,
                               "status": merged, "kept": kept}, status=status)


def _with_conflict(rows: list[dict[str, Any]], conflict: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The grid's rows, with a place for the conflict of a row removed since (at the end)."""
    if conflict is None or any(r["algorithm"] == conflict["keyword"] for r in rows):
        return rows
    return [*rows, {"algorithm": conflict["keyword"]}]


def _grid_answer(who: Console, table: RatingTable, *, marked: str | None = None,
                 conflict: dict[str, Any] | None = None, merged: str | None = None, status: int = 200) -> Response:
    """An edit's answer to htmx: every row of ``table`` (the grid's body swapped whole, so that no
    row keeps an older revision's values), its revision in the heading and in the page's other
    forms (add a row, replace from a file), and the status line."""
    context = {"console": who, "table": table, "rows": _with_conflict(_grid(table), conflict), "editing": None,
               "conflict": conflict, "error": None, "preview": None, "marked": marked, "status": merged}
    return page("_grid_answer.html", context, status=status,
                headers={"HX-Retarget": "#grid-rows", "HX-Reswap": "outerHTML"})


def _merged_note(uow: UnitOfWork, table: RatingTable, keyword: str, over: int) -> str | None:
    """What the status line says after ``keyword``'s edit made on revision ``over`` was saved
    over newer revisions (None if it was not: ``table`` is the next revision)."""
    if table.revision <= over + 1:
        return None
    try:
        base = svc.table_revision(uow=uow, name=table.name, revision=over)
    except NotFound:
        return None
    others = sorted({c["algorithm"] or c["field"] for c in diff_tables(base.as_dict(), table.as_dict())
                     if c["algorithm"] != keyword})
    by = changed_by([h for h in svc.table_revisions(uow=uow, name=table.name) if h["revision"] < table.revision],
                    since=over)
    kept = "; ".join(part for part in (", ".join(others), by) if part)
    return (f"Your edit of {keyword} is saved in revision {table.revision}, merged with what others saved since "
            f"revision {over}{f' ({kept})' if kept else ''}. The grid shows revision {table.revision}.")


def _rating(table: RatingTable, keyword: str) -> Rating:
    rating = table.get(keyword)
    if rating is None:
        raise NotFound(f"{table.name} has no row {keyword!r}")
    return rating


@router.get("/tables/{name}")
def table(name: TableName, who: ConsoleDep, uow: ReadUnitDep,
          saved: Annotated[str | None, Query(max_length=64, pattern=r"^[a-z0-9][a-z0-9_-]*$")] = None,
          over: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) -> Response:
    """The grid; after a plain form's edit saved over newer revisions (``saved``, made on
    revision ``over``), its status line says so."""
    current = svc.get_table(uow=uow, name=name)
    merged = _merged_note(uow, current, saved, over) if saved and over else None
    return table_page(who, current, marked=saved if merged else None, merged=merged)


@router.get("/tables/{name}/ratings/{keyword}")
def row(name: TableName, keyword: Keyword, request: Request, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """One row as shown (htmx: cancel an edit, or drop one's own values after a conflict)."""
    current = svc.get_table(uow=uow, name=name)
    rating = _rating(current, keyword)
    if not is_htmx(request):
        return RedirectResponse(f"/ui/tables/{name}#row-{keyword}", status_code=303)
    return page("_row_answer.html", {"console": who, "table": current, "r": grid_row(rating),
                                     "status": f"{keyword} as saved in revision {current.revision}: nothing changed."})


@router.get("/tables/{name}/ratings/{keyword}/edit")
def edit_row(name: TableName, keyword: Keyword, request: Request, who: ConsoleDep, uow: ReadUnitDep,
             revision: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None) -> Response:
    """The row as a form (403 without ``ratings:write``), based on the current revision, or for
    htmx on ``revision``, the one the grid shows: the admin edits the values they see, and
    saving merges the edit over whatever was saved since."""
    if not who.may("ratings:write"):
        raise Forbidden("ratings:write")
    current = svc.get_table(uow=uow, name=name)
    shown = current
    if is_htmx(request) and revision is not None and revision < current.revision:
        past = svc.table_revision(uow=uow, name=name, revision=revision)
        shown = past if past.get(keyword) is not None else current
    rating = _rating(shown, keyword)  # 404 for a row the table lacks
    if not is_htmx(request):
        return table_page(who, current, editing=keyword)
    return page("_row_edit.html", {"console": who, "table": shown, "r": grid_row(rating), "error": None})


def rating_patch(form: dict[str, str]) -> dict[str, Any]:
    """The form's fields as a rating patch, validated by the API's own schema (``RatingPatch``).

    A level the form carries empty is removed; one it does not carry keeps its value (the edit
    form offers only the levels the row's kind carries: :func:`grid_row`)."""
    document: dict[str, Any] = {}
    try:
        for field in _LEVELS:
            if field not in form:
                continue
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

    An edit made on an older revision is merged over the latest one by the service; a value
    others changed since to another value (``EditConflict``) answers 409 with the whole grid at
    the latest revision and, in the row, each such field with their value and the admin's, to
    keep theirs or re-apply the admin's (both previewed over the latest revision). A bad value answers
    422 with the form again.
    """
    mine = {f: form.get(f, "") for f in _FIELDS}
    expected = form_revision(form)
    try:
        changes = rating_patch(form)
        return svc.update_rating(uow=uow, name=name, algorithm=keyword, changes=changes,
                                 expected_revision=expected, author=actor)
    except StaleRevision as exc:
        failed(request, type(exc).__name__, 409)
        current = svc.get_table(uow=uow, name=name)
        conflict = _conflict(uow, current, keyword, form, exc)
        if is_htmx(request):
            return _grid_answer(who, current, conflict=conflict, status=409)
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


def _shown(value: Any) -> str:
    """A value as a form field holds it: nothing for None."""
    return "" if value is None else str(value)


def _values(rating: Rating | None) -> dict[str, Any]:
    """A row's editable fields (None where absent, the reason "" where none)."""
    row = rating.as_dict() if rating is not None else {}
    return {**{f: row.get(f) for f in _FIELDS}, "reason": row.get("reason") or ""}


def _clash_text(clash: dict[str, Any], current: int, based_on: int) -> str:
    """One field changed on both sides, in words: theirs, the admin's, and what it was."""
    if clash["field"] == "*":
        return (f"{clash['algorithm']} was removed from the table in revision {current}: nothing to edit. "
                "To rate it again, add it with Add an algorithm.")
    field = str(clash["field"]).replace("_", " ")
    return (f"{field} is {_shown(clash['theirs']) or 'empty'} in revision {current} (theirs); you entered "
            f"{_shown(clash['mine']) or 'nothing'}; it was {_shown(clash['base']) or 'empty'} in revision {based_on}.")


def _conflict(uow: UnitOfWork, current: RatingTable, keyword: str, form: dict[str, str],
              exc: StaleRevision) -> dict[str, Any]:
    """A refused edit of ``keyword``'s row, shown in the row: each field both sides changed, and
    what each way out sends (previewed over the latest revision): ``reapply`` the admin's values
    where they clash, ``keep`` theirs there (None when the admin changed nothing else: then
    keeping theirs is showing the row). Fields only the admin changed go with either; fields only
    others changed keep their value."""
    based_on = form_revision(form)
    clashes = [c for c in exc.conflicts if c["algorithm"] == keyword] if isinstance(exc, EditConflict) else []
    by = changed_by(svc.table_revisions(uow=uow, name=current.name), since=based_on, algorithm=keyword)
    conflict: dict[str, Any] = {"keyword": keyword, "based_on": based_on, "revision": current.revision,
                                "clashes": [_clash_text(c, current.revision, based_on) for c in clashes],
                                "fields": [], "reapply": None, "keep": None, "theirs": None, "by": by}
    theirs_rating = current.get(keyword)
    if theirs_rating is None:
        return conflict
    try:
        base_rating = svc.table_revision(uow=uow, name=current.name, revision=based_on).get(keyword)
    except NotFound:
        base_rating = theirs_rating
    typed = {f: form.get(f, "") for f in _FIELDS}
    mine = {**_values(None), **rating_patch(form)}
    mine["reason"] = mine["reason"] or ""
    base, theirs = _values(base_rating), _values(theirs_rating)
    clashing = {c["field"] for c in clashes}
    fields = _editable(theirs_rating)
    reapply, keep = {}, {}
    for f in fields:
        if f in clashing:
            reapply[f], keep[f] = typed[f], _shown(theirs[f])
        else:
            reapply[f] = keep[f] = typed[f] if mine[f] != base[f] else _shown(theirs[f])
        conflict["fields"].append({"name": f, "theirs": _shown(theirs[f]), "mine": reapply[f],
                                   "base": _shown(base[f])})
    others = any(keep[f] != _shown(theirs[f]) for f in fields)
    return {**conflict, "theirs": grid_row(theirs_rating), "reapply": reapply, "keep": keep if others else None}


@router.post("/tables/{name}/ratings/{keyword}/preview")
def preview_row(name: TableName, keyword: Keyword, request: Request, who: RatingsWriter, form: FormDep,
                uow: UnitDep, actor: ActorDep, settings: SettingsDep) -> Response:
    """What saving the form's values would do to the running tunnels, nothing saved: the edit
    is made, assessed (as ``?dry_run=true`` does) and rolled back; the answer shows the
    impact with **Save** (the same values and revision, to :func:`save_row`) and **Cancel**."""
    edited = _edited(name, keyword, request, who, form, uow, actor)
    if isinstance(edited, Response):
        return edited
    rating = _rating(edited, keyword)
    after = grid_row(rating)  # the row as saving would make it (merged over newer revisions)
    assessed = impact_of(request, uow, settings)
    current = svc.get_table(uow=uow, name=name)
    mine = {f: form.get(f, "") for f in _editable(rating)}  # sent again: only the fields its kind carries
    shown = {"keyword": keyword, "mine": mine, "revision": int(form["revision"]),
             "now": grid_row(_rating(current, keyword)), "now_revision": current.revision,
             "after": {f: _shown(after[f]) for f in _FIELDS}, "impact": assessed}
    said = _previewed(keyword, assessed["report"])
    if is_htmx(request):
        return page("_row_preview_answer.html", {"console": who, "table": current, "p": shown, "status": said})
    return table_page(who, current, preview=shown, merged=said)


def _previewed(keyword: str, report: ImpactReport) -> str:
    """What the status line says of a preview: nothing saved, what saving would do, what to press."""
    tunnels = (f"{len(report.noncompliant)} running tunnel(s) would fall below their minimums and "
               f"{len(report.changed)} would have a cheaper or different choice" if report.impacts
               else "no tunnel is running")
    return f"Preview of {keyword}: nothing is saved yet; {tunnels}. Save {keyword} or Cancel below."


@router.post("/tables/{name}/ratings/{keyword}")
def save_row(name: TableName, keyword: Keyword, request: Request, who: RatingsWriter, form: FormDep,
             uow: UnitDep, actor: ActorDep) -> Response:
    """Save one row with If-Match semantics: the form names the revision it was based on (merged
    over newer revisions, a conflict or a bad value: see :func:`_edited`). htmx gets the whole
    grid at the saved revision, whose status line says when the edit was merged; a plain form
    is sent to the grid (with ``saved`` and ``over`` when merged)."""
    saved = _edited(name, keyword, request, who, form, uow, actor)
    if isinstance(saved, Response):
        return saved
    over = form_revision(form)
    merged = _merged_note(uow, saved, keyword, over)
    if is_htmx(request):
        said = merged or f"{keyword} saved in revision {saved.revision}."
        return _grid_answer(who, saved, marked=keyword, merged=said)
    if merged is not None:
        return RedirectResponse(f"/ui/tables/{name}?saved={keyword}&over={over}#row-{keyword}", status_code=303)
    return RedirectResponse(f"/ui/tables/{name}#row-{keyword}", status_code=303)


@router.get("/tables/{name}/revisions")
def revisions(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """The history, newest first, each revision with its per-field changes."""
    return history_page(who, name, svc.table_revisions(uow=uow, name=name), base=f"/ui/tables/{name}",
                    section="tables", can_revert=who.may("ratings:write"), by_algorithm=True)


@router.get("/tables/{name}/revert")
def confirm_revert(name: TableName, request: Request, who: ConsoleDep, uow: UnitDep, actor: ActorDep,
                   settings: SettingsDep, revision: Annotated[int, Query(ge=1, le=2**31 - 1)]) -> Response:
    """Ask before going back to ``revision``, showing what it changes against the current
    revision, row by row, and what it would do to the running tunnels and agent sessions (the
    revert made, assessed and rolled back, as ``?dry_run=true`` does: nothing kept); the form
    names the revision it was asked at."""
    needs(who, "ratings:write")
    current = svc.get_table(uow=uow, name=name)
    reverted = svc.revert_table(uow=uow, name=name, revision=revision, expected_revision=current.revision,
                                author=actor)
    return confirm_revert_page(request, who, uow, settings, section="tables", name=name, revision=revision,
                               current=current.revision, changes=diff_tables(current.as_dict(), reverted.as_dict()),
                               by_algorithm=True)


@router.post("/tables/{name}/revert")
def revert(name: TableName, request: Request, who: RatingsWriter, form: FormDep, uow: UnitDep,
           actor: ActorDep) -> Response:
    """Go back to a revision (a new revision; history kept), as asked on :func:`confirm_revert`.
    The form names the current revision it saw: a revert over someone's newer edit is refused (409)."""
    revision, expected = form_revision(form), form_revision(form, "expected")
    svc.revert_table(uow=uow, name=name, revision=revision, expected_revision=expected, author=actor)
    return RedirectResponse(f"/ui/tables/{name}/revisions", status_code=303)


@router.get("/tables/{name}/export")
def export(name: TableName, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """The table as YAML, as ``GET /v1/rating-tables/{name}/export`` gives it."""
    text = files.dump_rating_table(svc.get_table(uow=uow, name=name), "yaml")
    return PlainTextResponse(text, media_type="application/yaml",
                             headers={"Content-Disposition": f'attachment; filename="{name}.yaml"'})
