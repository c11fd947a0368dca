"""The negotiation playground: ``POST /v1/negotiations`` as a form, and "why not X?"."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request
from pydantic import ValidationError
from starlette.responses import Response

from app.domain.algorithms import CATALOGUE
from app.domain.errors import InvalidInput, NoFeasibleSuite, QossError
from app.services import policies as policy_svc
from app.services import ratings as svc
from app.services.negotiation import run_negotiation
from app.services.why_not import why_not
from app.ui.pages.common import console_router, problems
from app.ui.render import page
from app.ui.session import ConsoleDep
from app.web.deps import ReadUnitDep, SettingsDep
from app.web.errors import status_for
from app.web.schemas import NegotiationIn

__all__ = ["router"]

router = console_router()
_PEERS = 3


def _negotiation_document(query: dict[str, str]) -> dict[str, Any]:
    """The playground's query string as a negotiation request (``POST /v1/negotiations``'s body)."""
    peers = []
    for i in range(1, _PEERS + 1):
        name = query.get(f"p{i}", "").strip()
        if not name:
            continue
        peer: dict[str, Any] = {"name": name}
        levels = {}
        for short, level in (("c", "confidentiality"), ("i", "integrity"), ("k", "key_exchange"),
                             ("q", "post_quantum")):
            text = query.get(f"p{i}{short}", "").strip()
            if text:
                try:
                    levels[level] = int(text)
                except ValueError as exc:
                    raise InvalidInput(f"peer {name}: {level} is a whole number 0-10") from exc
        if levels:
            peer["min_levels"] = levels
        if query.get(f"p{i}policy"):
            peer["policy"] = query[f"p{i}policy"]
        peers.append(peer)
    document: dict[str, Any] = {"peers": peers}
    if query.get("table"):
        document["rating_table"] = query["table"]
    size = query.get("packet_size", "").strip()
    if size:
        try:
            document["traffic"] = {"packet_size": int(size)}
        except ValueError as exc:
            raise InvalidInput("the packet size is a whole number of bytes") from exc
    return document


@router.get("/negotiate")
def negotiate(request: Request, who: ConsoleDep, uow: ReadUnitDep, settings: SettingsDep,
              run: Annotated[bool, Query()] = False) -> Response:
    """The playground: peers and their minimums in, the chosen suite and why out (a GET: it
    changes nothing, and a result can be bookmarked). With ``why``: why the negotiation did not
    choose that algorithm (:func:`app.services.why_not.why_not`)."""
    query = {k: v[:200] for k, v in request.query_params.items()}
    context: dict[str, Any] = {"console": who, "tables": svc.list_tables(uow=uow),
                               "policies": policy_svc.list_policies(uow=uow), "q": query, "peers": _PEERS,
                               "default_table": settings.default_table, "result": None, "problem": None,
                               "why": None, "keywords": list(CATALOGUE)}
    status = 200
    if run:
        problem: dict[str, Any] | None = None
        try:
            body = NegotiationIn.model_validate(_negotiation_document(query)).to_domain()
            result = run_negotiation(uow=uow, request=body, default_table=settings.default_table)
            context["result"] = result.as_dict()
            wanted = query.get("why", "").strip()
            if wanted:
                context["why"] = why_not(uow=uow, request=body, default_table=settings.default_table,
                                         keyword=wanted[:64]).as_dict()
        except ValidationError as exc:
            status, problem = 422, {"message": problems(exc)}
        except NoFeasibleSuite as exc:
            status, problem = 409, exc.detail()
        except QossError as exc:
            status, problem = status_for(exc), {"message": exc.message}
        if problem is not None:
            context["problem"] = {"unmet": [], "notes": [], **problem}
    return page("negotiate.html", context, status=status)
