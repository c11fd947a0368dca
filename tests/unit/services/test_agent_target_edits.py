"""Agent sessions and edits (app.services.agent.target_edits) on the fakes: what a session
records at connect, what an edit does to it, and the Target closing, with the reason, the
sessions an edit leaves below their minimums."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.domain.agent import AgentSessionState, Kind, RequestInfo, agent_conn_name
from app.domain.agent.ports import AgentSession
from app.domain.tunnels import keywords_from_charon
from app.services import ratings
from app.services.agent.target_edits import SessionFollower, active_sessions, assess_sessions
from app.services.impact import preview
from tests.fakes.uow import FakeDatabase
from tests.unit.services.test_agent_roles import Roles

TABLE = "standards-2026"
#: The client's minimums: aes128gcm16 (the cheapest, confidentiality 8) meets them until it is rated below.
MINIMUMS = {"confidentiality": 6}


@pytest.fixture
def roles(database: FakeDatabase, tmp_path: Path) -> Iterator[Roles]:
    with ExitStack() as stack:
        yield Roles(database, tmp_path, stack)


def _connect(roles: Roles, min_levels: dict[str, int] | None = None) -> str:
    supports = tuple(sorted(keywords_from_charon(roles.charon.algorithms)))
    info = RequestInfo(target="hq", supports=supports, min_levels=MINIMUMS if min_levels is None else min_levels)
    request, wire = roles.client.request(Kind.CONNECT, info, 3)
    response = roles.client.accept(roles.host.handle(wire).answer, request)
    assert response.tunneling_info is not None
    return response.tunneling_info.ticket


def _record(roles: Roles, ticket: str) -> AgentSession:
    with roles.store.unit() as uow:
        found = uow.sessions.get(ticket)
    assert found is not None
    return found


def _rate(database: FakeDatabase, algorithm: str, *, commit: bool = True, **changes: Any) -> None:
    with database.unit() as uow:
        table = ratings.get_table(uow=uow, name=TABLE)
        ratings.update_rating(uow=uow, name=TABLE, algorithm=algorithm, changes=changes,
                              expected_revision=table.revision, author="test")
        if commit:
            uow.commit()


def test_a_session_records_what_it_was_negotiated_under(roles: Roles) -> None:
    origin = _record(roles, _connect(roles)).provenance
    assert origin is not None
    request = origin["request"]
    assert (request["objective_id"], request["min_levels"], request["policy"]) == (3, MINIMUMS, None)
    assert request["supports"] == sorted(keywords_from_charon(roles.charon.algorithms))
    # Target's charon (5.9.8) also has a post-quantum preshared key, which no algorithm list names.
    assert request["target_supports"] == sorted(keywords_from_charon(roles.charon.algorithms, version="5.9.8"))
    assert "ppk" in request["target_supports"]
    assert origin["tables"] == {TABLE: 1}
    assert origin["policy_revision"] is None
    assert origin["cost"] > 0


def test_without_an_edit_every_session_stays(roles: Roles, database: FakeDatabase) -> None:
    _connect(roles)
    with database.unit() as uow:
        [impact] = assess_sessions(uow, active_sessions(roles.store), default_table=TABLE)
    assert (impact.kind, impact.user, impact.objective_id) == ("stays", "alice", 3)


def test_an_algorithm_rated_below_the_minimum_makes_its_sessions_noncompliant(roles: Roles,
                                                                                database: FakeDatabase) -> None:
    ticket = _connect(roles)
    loose = _connect(roles, {})  # asks for no level: any rating of aes128gcm16 still does
    with database.unit() as uow:
        ratings.update_rating(uow=uow, name=TABLE, algorithm="aes128gcm16", changes={"confidentiality": 3},
                              expected_revision=ratings.get_table(uow=uow, name=TABLE).revision, author="test")
        impacts = {i.ticket: i for i in assess_sessions(uow, active_sessions(roles.store), default_table=TABLE)}
    impact = impacts[ticket]
    assert impact.kind == "noncompliant"
    assert impact.rejected == ("aes128gcm16",)
    assert impact.old["proposals"]["esp"] == "aes128gcm16-x25519"
    assert impact.new is not None
    assert "aes128gcm16" not in impact.new["proposals"]["esp"]
    assert impacts[loose].kind == "stays"


def test_a_session_made_before_provenance_was_kept_is_not_assessed(roles: Roles, database: FakeDatabase) -> None:
    old = replace(_record(roles, _connect(roles)), provenance=None)
    with database.unit() as uow:
        [impact] = assess_sessions(uow, [old], default_table=TABLE)
    assert impact.kind == "unassessed"


def test_the_preview_names_the_sessions_beside_the_tunnels_and_keeps_nothing(roles: Roles,
                                                                             database: FakeDatabase) -> None:
    ticket = _connect(roles)
    with database.unit() as uow:
        ratings.update_rating(uow=uow, name=TABLE, algorithm="aes128gcm16", changes={"confidentiality": 3},
                              expected_revision=1, author="test")
        report = preview(uow, default_table=TABLE, sessions=active_sessions(roles.store))
        assert ratings.get_table(uow=uow, name=TABLE).revision == 1
    assert report.impacts == ()
    assert [(s.ticket, s.kind) for s in report.sessions_by_kind()["noncompliant"]] == [(ticket, "noncompliant")]
    [answer] = report.sessions_list()
    assert (answer["ticket"], answer["user"], answer["kind"]) == (ticket, "alice", "noncompliant")
    assert answer["old"]["proposals"]["esp"] == "aes128gcm16-x25519"
    assert answer["new"]["proposals"]["esp"] != "aes128gcm16-x25519"


def _follower(roles: Roles) -> SessionFollower:
    follower = roles.target.follower(concurrency=2)
    assert follower.follow() == []  # the first look notes where the event log is
    return follower


def test_a_committed_edit_closes_the_noncompliant_session_with_the_reason(roles: Roles,
                                                                          database: FakeDatabase) -> None:
    follower = _follower(roles)
    ticket, loose = _connect(roles), _connect(roles, {})
    _rate(database, "aes128gcm16", confidentiality=3)
    assert follower.follow() == [ticket]
    closed = _record(roles, ticket)
    assert closed.state == AgentSessionState.CLOSED.value
    assert closed.reason == ("rating table standards-2026 revision 2 puts aes128gcm16 below objective 3's "
                             "minimums: connect again")
    assert agent_conn_name(ticket) not in roles.charon.conns
    assert agent_conn_name(ticket) not in roles.charon.shared
    assert closed.virtual_ip not in roles.session(loose)[2]  # its lease released
    assert _record(roles, loose).state == "active"  # merely compliant: keeps its suite
    with database.unit() as uow:
        [event] = [e for e in uow.events.after(0, scopes=None) if e["kind"] == "agent.session.closed"]
        audit = uow.audit.list(limit=10)
    assert event["subject"] == ticket
    assert event["data"]["reason"] == closed.reason
    assert event["data"]["old"]["proposals"]["esp"] == "aes128gcm16-x25519"
    assert "aes128gcm16" not in event["data"]["new"]["proposals"]["esp"]
    [entry] = [a for a in audit if a["object"] == f"/v1/agent/sessions/{ticket}"]
    assert "was aes128gcm16-x25519, a new connect gets" in entry["detail"]
    assert follower.follow() == []  # nothing new in the log


def test_a_cheaper_choice_leaves_the_session_as_it_is(roles: Roles, database: FakeDatabase) -> None:
    follower = _follower(roles)
    ticket = _connect(roles)
    _rate(database, "aes128gcm16", performance=0.1)  # still compliant, no longer the cheapest
    with database.unit() as uow:
        [impact] = assess_sessions(uow, active_sessions(roles.store), default_table=TABLE)
    assert impact.kind in ("cheaper", "different")
    assert follower.follow() == []
    assert _record(roles, ticket).state == "active"


def test_one_sessions_failure_never_stops_the_others(roles: Roles, database: FakeDatabase) -> None:
    follower = roles.target.follower(concurrency=2)
    first, second = _connect(roles), _connect(roles)
    finish = roles.target._book.finish

    def failing(ticket: str, state: AgentSessionState, reason: str) -> AgentSession | None:
        if ticket == first:
            raise RuntimeError("charon went away")
        return finish(ticket, state, reason)

    follower._finish = failing  # type: ignore[method-assign]
    _rate(database, "aes128gcm16", confidentiality=3)
    assert follower.run_once("rating table standards-2026 revision 2") == [second]
    assert (_record(roles, first).state, _record(roles, second).state) == ("active", "closed")
