"""Rating tables: read, edit (revisions, If-Match), history, import and export."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.responses import PlainTextResponse
from fastapi.types import DecoratedCallable

from app.adapters import files
from app.domain.ratings import RatingTable
from app.services import ratings as svc
from app.web.deps import (
    MAX_DB_INT,
    ActorDep,
    IfMatchDep,
    NamePath,
    ReadUnitDep,
    SettingsDep,
    UnitDep,
    reader,
    require,
)
from app.web.edits import EditDep, count_revision
from app.web.routing import QossRoute
from app.web.schemas import (
    NO_NUL,
    RatingPatch,
    RatingTableIn,
    RatingTableOut,
    RevertIn,
    RevisionOut,
    error_responses,
)

__all__ = ["router"]

router = APIRouter(tags=["rating tables"], route_class=QossRoute)
_RATINGS_WRITE = [Depends(require("ratings:write"))]
_READ = [Depends(reader)]

TableName = NamePath
Format = Annotated[Literal["yaml", "csv"], Query()]
#: Errors of a text/plain route are still JSON: say so, or the schema would claim text.
_JSON_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"description": "error",
           "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}}
    for code in (401, 404, 422)
}
_ERRORS = error_responses(404, 409, 422, 428)


def _out(table: RatingTable, response: Response) -> dict[str, Any]:
    response.headers["ETag"] = f'"{table.revision}"'
    return {**table.as_dict(), "revision": table.revision}


def _creating(path: str) -> Callable[[DecoratedCallable], DecoratedCallable]:
    """``POST path``: a change that makes a table, answered 201 with it (:func:`_created`)."""
    return router.post(path, dependencies=_RATINGS_WRITE, status_code=201, response_model=RatingTableOut,
                       responses=_ERRORS)


def _created(table: RatingTable, request: Request, response: Response) -> dict[str, Any]:
    """The answer of a :func:`_creating` route: the new table, its revision as ETag (counted)."""
    count_revision(request, "rating_table")
    return _out(table, response)


@router.get("/rating-tables", dependencies=_READ)
def list_tables(uow: ReadUnitDep) -> list[dict[str, Any]]:
    """Every table with its current revision."""
    return svc.list_tables(uow=uow)


@_creating("/rating-tables")
def create_table(
    body: RatingTableIn, uow: UnitDep, actor: ActorDep, response: Response, request: Request,
) -> dict[str, Any]:
    """Create a table (revision 1)."""
    table = svc.create_table(uow=uow, document=body.model_dump(exclude_none=True), author=actor)
    return _created(table, request, response)


@_creating("/rating-tables/import")
def import_table(
    request: Request,
    uow: UnitDep,
    actor: ActorDep,
    response: Response,
    text: Annotated[str, Body(media_type="text/plain", max_length=1_048_576, pattern=NO_NUL)],
    format: Format = "yaml",
    name: Annotated[str | None, Query(max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")] = None,
    revision: Annotated[int | None, Query(ge=1, le=MAX_DB_INT, description="replace this current revision")] = None,
) -> dict[str, Any]:
    """Import YAML or CSV: a new table, or with ``revision`` a new revision of an existing one.

    YAML anchors and aliases are refused: a few lines of them expand to billions of nodes.
    """
    table = svc.import_table(uow=uow, table=files.parse_rating_table(text, format, name=name), fmt=format,
                             author=actor, expected_revision=revision)
    return _created(table, request, response)


@_creating("/rating-tables/{name}/restore")
def restore_shipped_table(name: TableName, uow: UnitDep, actor: ActorDep, settings: SettingsDep, response: Response,
                          request: Request) -> dict[str, Any]:
    """Put the shipped table ``name`` (from the service's ``ratings/``) back at revision 1 after it
    was deleted: 404 if none is shipped by that name, 409 if the database has a table of that name."""
    table = svc.restore_shipped_table(uow=uow, tables=files.load_rating_tables(settings.ratings_dir), name=name,
                                      author=actor)
    return _created(table, request, response)


@router.get("/rating-tables/{name}", dependencies=_READ, response_model=RatingTableOut, responses=_ERRORS)
def get_table(name: TableName, uow: ReadUnitDep, response: Response) -> dict[str, Any]:
    """The current revision; its ETag is the revision number."""
    return _out(svc.get_table(uow=uow, name=name), response)


@router.put("/rating-tables/{name}", dependencies=_RATINGS_WRITE, response_model=RatingTableOut, responses=_ERRORS)
def replace_table(
    name: TableName, body: RatingTableIn, uow: UnitDep, actor: ActorDep, expected: IfMatchDep,
    response: Response, edit: EditDep) -> Any:
    """Replace the whole table. ``If-Match`` must name the current revision (409 if stale).
    ``?dry_run=true``: nothing is kept; the answer is what it would make and its impact on the
    running tunnels. Otherwise the tunnels it concerns are negotiated again (and moved) after it."""
    table = svc.replace_table(uow=uow, name=name, document=body.model_dump(exclude_none=True),
                              expected_revision=expected, author=actor)
    return edit.finish(uow, _out(table, response), "rating_table")


@router.patch(
    "/rating-tables/{name}/ratings/{algorithm}",
    dependencies=_RATINGS_WRITE,
    response_model=RatingTableOut,
    responses=_ERRORS,
)
def update_rating(
    name: TableName, algorithm: Annotated[str, Path(min_length=1, max_length=64)], body: RatingPatch,
    uow: UnitDep, actor: ActorDep, expected: IfMatchDep, response: Response, edit: EditDep) -> Any:
    """Edit (or add) one algorithm's rating: a new revision of the table. ``If-Match`` names the
    revision the edit was made on; if others saved since, the edit lands on top of theirs when
    none of the values it changes was changed since, else 409 ``EditConflict`` naming each row
    and field with their value and yours (nothing written). ``?dry_run=true``:
    nothing is kept; the answer is the table it would make and, for every running tunnel,
    whether it would fall below its minimums, get a cheaper or different choice, or stay
    (old and new suite). Otherwise the tunnels it concerns are negotiated again after it: one
    below its minimums moves to its new suite make-before-break."""
    table = svc.update_rating(uow=uow, name=name, algorithm=algorithm,
                              changes=body.model_dump(exclude_unset=True), expected_revision=expected,
                              author=actor)
    return edit.finish(uow, _out(table, response), "rating_table")


@router.delete("/rating-tables/{name}", dependencies=_RATINGS_WRITE, status_code=204, responses=_ERRORS)
def delete_table(name: TableName, uow: UnitDep, settings: SettingsDep) -> Response:
    """Delete a table and its history (never the default table)."""
    svc.delete_table(uow=uow, name=name, default_table=settings.default_table)
    return Response(status_code=204)


@router.get("/rating-tables/{name}/revisions", dependencies=_READ, response_model=list[RevisionOut], responses=_ERRORS)
def list_revisions(name: TableName, uow: ReadUnitDep) -> list[dict[str, Any]]:
    """The table's history, oldest first: who, when, what changed."""
    return svc.table_revisions(uow=uow, name=name)


@router.post(
    "/rating-tables/{name}/revert",
    dependencies=_RATINGS_WRITE,
    response_model=RatingTableOut,
    responses=_ERRORS,
)
def revert_table(name: TableName, body: RevertIn, uow: UnitDep, actor: ActorDep, expected: IfMatchDep,
                 response: Response, edit: EditDep) -> Any:
    """Go back to revision ``revision``: a new revision with its content, history kept
    ("reverted to N"). ``If-Match`` must name the current revision (409 if stale); reverting to
    the current revision is refused (422); an unknown table or revision is 404."""
    table = svc.revert_table(uow=uow, name=name, revision=body.revision, expected_revision=expected,
                             author=actor, message=body.message)
    return edit.finish(uow, _out(table, response), "rating_table")


@router.get(
    "/rating-tables/{name}/revisions/{revision}",
    dependencies=_READ,
    response_model=RatingTableOut,
    responses=_ERRORS,
)
def get_revision(name: TableName, revision: Annotated[int, Path(ge=1, le=10**9)], uow: ReadUnitDep,
                 response: Response) -> dict[str, Any]:
    """One past revision."""
    return _out(svc.table_revision(uow=uow, name=name, revision=revision), response)


@router.get(
    "/rating-tables/{name}/export", dependencies=_READ, response_class=PlainTextResponse, responses=_JSON_ERRORS
)
def export_table(name: TableName, uow: ReadUnitDep, format: Format = "yaml") -> PlainTextResponse:
    """The table as YAML or CSV."""
    text = files.dump_rating_table(svc.get_table(uow=uow, name=name), format)
    media = "text/csv" if format == "csv" else "application/yaml"
    return PlainTextResponse(text, media_type=media)
