"""Policies: the list, one policy as a form (Objective-IDs included) saved over If-Match with a
concurrent edit shown side by side, history and revert."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Query, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from app.domain.errors import InvalidInput, NotFound, StaleRevision
from app.domain.policies import OBJECTIVE_IDS, OBJECTIVE_THREATS, Policy
from app.domain.ports import UnitOfWork
from app.domain.revisions import diff_policies
from app.services import policies as policy_svc
from app.services import ratings as table_svc
from app.ui.pages.common import (
    Name,
    PoliciesWriter,
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
from app.ui.render import page
from app.ui.session import Console, ConsoleDep, FormDep
from app.web.deps import ActorDep, ReadUnitDep, SettingsDep, UnitDep
from app.web.edits import count_revision
from app.web.schemas import PolicyIn

__all__ = ["router"]

router = console_router()

#: The form's fields, in order, with their labels (the conflict view compares them one by one).
FIELDS = (("description", "Description"), ("confidentiality", "Confidentiality ≥"),
          ("integrity", "Integrity ≥"), ("key_exchange", "Key exchange ≥"), ("post_quantum", "Post-quantum ≥"),
          ("objective_id", "Objective-ID"),
          ("objectives", "Objectives"), ("allow", "Allow only"), ("deny", "Deny"), ("mode", "Mode"),
          ("pfs", "PFS"), ("strict", "Strict"), ("rating_table", "Rating table"),
          ("packet_size", "Packet size"), ("min_throughput_mbps", "Minimum throughput (Mbit/s)"),
          ("ike_lifetime", "IKE lifetime (s)"), ("child_lifetime", "CHILD lifetime (s)"))
OBJECTIVE_NAMES = tuple(sorted(OBJECTIVE_THREATS))
_IDS = {"1": "1 — Native (no IPsec)", "2": "2 — AH", "3": "3 — ESP", "4": "4 — AH+ESP"}


def _values(policy: Policy) -> dict[str, str]:
    """A policy as the form's text values."""
    doc = policy.as_dict()
    traffic = doc.get("traffic") or {}
    return {
        "description": doc["description"], **{k: str(v) for k, v in doc["min_levels"].items()},
        "objective_id": "" if doc["objective_id"] is None else str(doc["objective_id"]),
        "objectives": " ".join(o for o in doc["objectives"] if o not in _implied(doc["objective_id"])),
        "allow": "" if doc["allow"] is None else " ".join(doc["allow"]), "deny": " ".join(doc["deny"]),
        "mode": doc["mode"], "pfs": "on" if doc["pfs"] else "", "strict": "on" if doc["strict"] else "",
        "rating_table": doc["rating_table"] or "",
        "packet_size": str(traffic["packet_size"]) if traffic else "",
        "min_throughput_mbps": str(traffic.get("min_throughput_mbps") or "") if traffic else "",
        "ike_lifetime": str(doc["ike_lifetime"]), "child_lifetime": str(doc["child_lifetime"]),
    }


def _implied(objective_id: int | None) -> frozenset[str]:
    """The objectives an Objective-ID stands for (the form shows only those named beyond it)."""
    return OBJECTIVE_IDS[objective_id][1] if objective_id in OBJECTIVE_IDS else frozenset()


def _posted(form: dict[str, str]) -> dict[str, str]:
    """The posted form as the same text values (objectives from their checkboxes, or re-applied as text)."""
    mine = {field: form.get(field, "").strip() for field, _ in FIELDS}
    mine["description"] = form.get("description", "")
    if "objectives" not in form:
        mine["objectives"] = " ".join(o for o in OBJECTIVE_NAMES if form.get(f"objective:{o}"))
    return mine


def _words(text: str) -> list[str]:
    return [w for w in re.split(r"[\s,]+", text) if w]


def _document(name: str, mine: dict[str, str]) -> dict[str, Any]:
    """The form's values as ``PUT /v1/policies/{name}``'s body, validated by the API's schema."""
    def number(field: str, kind: type[int] | type[float]) -> int | float | None:
        text = mine[field]
        try:
            return kind(text) if text else None
        except ValueError as exc:
            raise InvalidInput(f"{dict(FIELDS)[field]}: {text[:20]!r} is not a number") from exc

    doc: dict[str, Any] = {
        "name": name, "description": mine["description"],
        "min_levels": {k: number(k, int) or 0 for k in ("confidentiality", "integrity", "key_exchange",
                                                        "post_quantum")},
        "objective_id": number("objective_id", int), "objectives": _words(mine["objectives"]) or None,
        "allow": _words(mine["allow"]) or None, "deny": _words(mine["deny"]) or None,
        "mode": mine["mode"] or "tunnel", "pfs": bool(mine["pfs"]), "strict": bool(mine["strict"]),
        "rating_table": mine["rating_table"] or None,
        "ike_lifetime": number("ike_lifetime", int), "child_lifetime": number("child_lifetime", int),
    }
    if mine["packet_size"] or mine["min_throughput_mbps"]:
        doc["traffic"] = {k: v for k, v in (("packet_size", number("packet_size", int)),
                                            ("min_throughput_mbps", number("min_throughput_mbps", float)))
                          if v is not None}
    try:
        return PolicyIn.model_validate({k: v for k, v in doc.items() if v is not None}).model_dump(exclude_none=True)
    except ValidationError as exc:
        raise InvalidInput(problems(exc)) from exc


def _page(who: Console, uow: UnitOfWork, name: str, *, mine: dict[str, str] | None = None,
          error: str | None = None, conflict: dict[str, Any] | None = None, preview: dict[str, Any] | None = None,
          status: int = 200) -> Response:
    policy, revision = policy_svc.get_policy(uow=uow, name=name)
    shown = mine if mine is not None and conflict is None else _values(policy)
    return page("policy.html", {
        "console": who, "name": name, "revision": revision, "v": shown, "fields": FIELDS, "ids": _IDS,
        "objective_names": OBJECTIVE_NAMES, "tables": table_svc.list_tables(uow=uow), "error": error,
        "conflict": conflict, "preview": preview, "can_edit": who.may("policies:write")}, status=status)


def _rows(theirs: dict[str, str], mine: dict[str, str]) -> list[dict[str, Any]]:
    """Each field's stored value beside the admin's, and whether they differ."""
    return [{"field": f, "label": label, "theirs": theirs[f], "mine": mine[f], "differs": theirs[f] != mine[f]}
            for f, label in FIELDS]


@router.get("/policies")
def policies(who: ConsoleDep, uow: ReadUnitDep) -> Response:
    return page("policies.html", {"console": who, "policies": policy_svc.list_policies(uow=uow)})


@router.get("/policies/{name}")
def policy(name: Name, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """One policy: a form to a token with ``policies:write``, read-only otherwise."""
    return _page(who, uow, name)


def _replaced(name: str, request: Request, who: Console, mine: dict[str, str], form: dict[str, str],
              uow: UnitOfWork, actor: str) -> Response | None:
    """Replace the policy with the admin's values in ``uow``, based on the revision the form
    names (If-Match): None, or the answer to a refused edit, nothing of it made.

    A concurrent edit answers 409 with both values side by side (preview mine over the new
    revision, or drop mine); an invalid value answers 422 with the form again.
    """
    expected = form_revision(form)
    try:
        policy_svc.replace_policy(uow=uow, name=name, document=_document(name, mine), expected_revision=expected,
                                  author=actor)
    except StaleRevision:
        uow.rollback()
        failed(request, "StaleRevision", 409)
        current, revision = policy_svc.get_policy(uow=uow, name=name)
        by = changed_by(policy_svc.policy_revisions(uow=uow, name=name), since=expected)
        conflict = {"based_on": expected, "revision": revision, "rows": _rows(_values(current), mine), "mine": mine,
                    "by": by}
        return _page(who, uow, name, conflict=conflict, status=409)
    except InvalidInput as exc:
        uow.rollback()
        failed(request, type(exc).__name__, 422)
        return _page(who, uow, name, mine=mine, error=exc.message, status=422)
    return None


@router.post("/policies/{name}/preview")
def preview_policy(name: Name, request: Request, who: PoliciesWriter, form: FormDep, uow: UnitDep,
                   actor: ActorDep, settings: SettingsDep) -> Response:
    """What saving the form's values would do to the running tunnels, nothing saved: the edit
    is made, assessed (as ``?dry_run=true`` does) and rolled back; the page shows the impact
    with **Save** (the same values and revision, to :func:`save_policy`) and **Cancel**."""
    mine = _posted(form)
    refused = _replaced(name, request, who, mine, form, uow, actor)
    if refused is not None:
        return refused
    assessed = impact_of(request, uow, settings)
    stored, _ = policy_svc.get_policy(uow=uow, name=name)
    changes = [row for row in _rows(_values(stored), mine) if row["differs"]]
    preview = {"revision": int(form["revision"]), "changes": changes, "mine": mine, "impact": assessed}
    return _page(who, uow, name, mine=mine, preview=preview)


@router.post("/policies/{name}")
def save_policy(name: Name, request: Request, who: PoliciesWriter, form: FormDep, uow: UnitDep,
                actor: ActorDep) -> Response:
    """Replace the policy with the form's values, based on the revision it was opened at (a
    concurrent edit or an invalid value: see :func:`_replaced`)."""
    refused = _replaced(name, request, who, _posted(form), form, uow, actor)
    if refused is not None:
        return refused
    count_revision(request, "policy")
    return RedirectResponse(f"/ui/policies/{name}", status_code=303)


@router.get("/policies/{name}/live")
def policy_live(name: Name, who: ConsoleDep, uow: ReadUnitDep,
                revision: Annotated[int, Query(ge=0, le=2**31 - 1)]) -> Response:
    """What the policy page opened at ``revision`` says once the policy changed elsewhere (the page
    reads it after the policy's events): the revision now, who saved it, and how to see it. The
    page's form is never replaced: what the admin typed stays until they choose."""
    try:
        latest: dict[str, Any] | None = policy_svc.policy_revisions(uow=uow, name=name)[-1]
    except NotFound:
        latest = None
    return page("_policy_live.html", {"console": who, "name": name, "revision": revision, "latest": latest,
                                      "can_edit": who.may("policies:write")})


@router.get("/policies/{name}/revisions")
def policy_revisions(name: Name, who: ConsoleDep, uow: ReadUnitDep) -> Response:
    """A policy's history, newest first, each revision with its per-field changes."""
    return history_page(who, name, policy_svc.policy_revisions(uow=uow, name=name), base=f"/ui/policies/{name}",
                        section="policies", can_revert=who.may("policies:write"), by_algorithm=False)


@router.get("/policies/{name}/revert")
def confirm_revert_policy(name: Name, request: Request, who: ConsoleDep, uow: UnitDep, actor: ActorDep,
                          settings: SettingsDep, revision: Annotated[int, Query(ge=1, le=2**31 - 1)]) -> Response:
    """Ask before going back to ``revision`` of a policy, showing what it changes against the
    current revision and what it would do to the running tunnels and agent sessions (the revert
    made, assessed and rolled back: nothing kept)."""
    needs(who, "policies:write")
    current, at = policy_svc.get_policy(uow=uow, name=name)
    reverted, _ = policy_svc.revert_policy(uow=uow, name=name, revision=revision, expected_revision=at, author=actor)
    return confirm_revert_page(request, who, uow, settings, section="policies", name=name, revision=revision,
                               current=at, changes=diff_policies(current.as_dict(), reverted.as_dict()),
                               by_algorithm=False)


@router.post("/policies/{name}/revert")
def revert_policy(name: Name, who: PoliciesWriter, form: FormDep, uow: UnitDep, actor: ActorDep) -> Response:
    """Go back to a revision of a policy (a new revision; 409 if it changed since the page was
    loaded), as asked on :func:`confirm_revert_policy`."""
    revision, expected = form_revision(form), form_revision(form, "expected")
    policy_svc.revert_policy(uow=uow, name=name, revision=revision, expected_revision=expected, author=actor)
    return RedirectResponse(f"/ui/policies/{name}/revisions", status_code=303)
