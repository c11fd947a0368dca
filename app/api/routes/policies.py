"""Policies: what a party requires."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from app.adapters import files
from app.domain.policies import Policy
from app.services import policies as svc
from app.web.deps import ActorDep, IfMatchDep, NamePath, ReadUnitDep, SettingsDep, UnitDep, reader, require
from app.web.edits import EditDep, count_revision
from app.web.routing import QossRoute
from app.web.schemas import PolicyIn, PolicyOut, RevertIn, RevisionOut, error_responses

__all__ = ["router"]

router = APIRouter(tags=["policies"], route_class=QossRoute)
_POLICIES_WRITE = [Depends(require("policies:write"))]
_READ = [Depends(reader)]

PolicyName = NamePath
_ERRORS = error_responses(404, 409, 422, 428)


def _out(policy: Policy, revision: int, response: Response) -> dict[str, Any]:
    response.headers["ETag"] = f'"{revision}"'
    return {"name": policy.name, "revision": revision, "policy": policy.as_dict()}


@router.get("/policies", dependencies=_READ)
def list_policies(uow: ReadUnitDep) -> list[dict[str, Any]]:
    """Every stored policy."""
    return svc.list_policies(uow=uow)


@router.post("/policies", dependencies=_POLICIES_WRITE, status_code=201, response_model=PolicyOut, responses=_ERRORS)
def create_policy(body: PolicyIn, uow: UnitDep, actor: ActorDep, response: Response,
                  request: Request) -> dict[str, Any]:
    """Store a policy."""
    policy, revision = svc.create_policy(uow=uow, document=body.model_dump(exclude_none=True), author=actor)
    count_revision(request, "policy")
    return _out(policy, revision, response)


@router.post("/policies/{name}/restore", dependencies=_POLICIES_WRITE, status_code=201, response_model=PolicyOut,
             responses=_ERRORS)
def restore_shipped_policy(name: PolicyName, uow: UnitDep, actor: ActorDep, settings: SettingsDep, response: Response,
                           request: Request) -> dict[str, Any]:
    """Put the shipped policy ``name`` (from the service's ``policies/``) back at revision 1 after
    it was deleted: 404 if none is shipped by that name, 409 if the database has a policy of that name."""
    policy, revision = svc.restore_shipped_policy(uow=uow, policies=files.load_policies(settings.policies_dir),
                                                  name=name, author=actor)
    count_revision(request, "policy")
    return _out(policy, revision, response)


@router.get("/policies/{name}", dependencies=_READ, response_model=PolicyOut, responses=_ERRORS)
def get_policy(name: PolicyName, uow: ReadUnitDep, response: Response) -> dict[str, Any]:
    """One policy; its ETag is the revision."""
    policy, revision = svc.get_policy(uow=uow, name=name)
    return _out(policy, revision, response)


@router.put("/policies/{name}", dependencies=_POLICIES_WRITE, response_model=PolicyOut, responses=_ERRORS)
def replace_policy(name: PolicyName, body: PolicyIn, uow: UnitDep, actor: ActorDep, expected: IfMatchDep,
                   response: Response, edit: EditDep) -> Any:
    """Replace a policy. ``If-Match`` names the revision the edit was made on; if others saved
    since, it lands on top of theirs when none of the values it changes was changed since, else
    409 ``EditConflict`` naming each field with their value and yours. ``?dry_run=true``: nothing
    is kept; the answer is what it would make and its impact on the running tunnels. Otherwise
    the tunnels it concerns are negotiated again (and moved) after it."""
    policy, revision = svc.replace_policy(uow=uow, name=name, document=body.model_dump(exclude_none=True),
                                          expected_revision=expected, author=actor)
    return edit.finish(uow, _out(policy, revision, response), "policy")


@router.post("/policies/{name}/revert", dependencies=_POLICIES_WRITE, response_model=PolicyOut, responses=_ERRORS)
def revert_policy(name: PolicyName, body: RevertIn, uow: UnitDep, actor: ActorDep, expected: IfMatchDep,
                  response: Response, edit: EditDep) -> Any:
    """Go back to revision ``revision``: a new revision with its content ("reverted to N").
    ``If-Match`` must name the current revision (409 if stale); reverting to the current
    revision is refused (422); an unknown policy or revision is 404."""
    policy, revision = svc.revert_policy(uow=uow, name=name, revision=body.revision,
                                         expected_revision=expected, author=actor, message=body.message)
    return edit.finish(uow, _out(policy, revision, response), "policy")


@router.delete("/policies/{name}", dependencies=_POLICIES_WRITE, status_code=204, responses=_ERRORS)
def delete_policy(name: PolicyName, uow: UnitDep) -> Response:
    """Delete a policy."""
    svc.delete_policy(uow=uow, name=name)
    return Response(status_code=204)


@router.get("/policies/{name}/revisions", dependencies=_READ, response_model=list[RevisionOut], responses=_ERRORS)
def policy_revisions(name: PolicyName, uow: ReadUnitDep) -> list[dict[str, Any]]:
    """A policy's history."""
    return svc.policy_revisions(uow=uow, name=name)
