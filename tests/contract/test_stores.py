"""The unit-of-work contract (``app.domain.ports``): the SQL adapters on SQLite and
PostgreSQL and the in-memory fakes of ``tests/fakes`` pass the same tests, so a service test
on the fakes says something about the service on a database."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.adapters import files
from app.adapters.db.unit_of_work import sql_units_of_work
from app.domain.auth import TokenRecord
from app.domain.errors import AlreadyExists, Conflict, NotFound, StaleRevision
from app.domain.policies import Policy
from app.domain.ports import UnitOfWork, UnitOfWorkFactory
from app.domain.ratings import RatingTable
from app.domain.sessions import SessionRecord
from app.domain.tunnels import Gateway, PeerEnd, TunnelRecord, TunnelState
from app.settings import SHIPPED_POLICIES_DIR, SHIPPED_RATINGS_DIR
from tests.contract.databases import migrated_sessions
from tests.fakes.uow import FakeDatabase

Units = Callable[[], UnitOfWork]


@pytest.fixture(params=["fake", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def units(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitOfWorkFactory]:
    """Units of work on an empty, migrated store of each kind."""
    if request.param == "fake":
        yield FakeDatabase().unit
        return
    with migrated_sessions(request.param, tmp_path) as sessions:
        yield sql_units_of_work(sessions)


def _table(name: str = "t1") -> RatingTable:
    shipped = files.load_rating_tables(SHIPPED_RATINGS_DIR)[0]
    return RatingTable.from_dict({**shipped.as_dict(), "name": name})


def _policy(name: str = "p1") -> Policy:
    shipped = files.load_policies(SHIPPED_POLICIES_DIR)[0]
    return Policy.from_dict({**shipped.as_dict(), "name": name})


# ------------------------------------------------------------------ transactions


def test_what_is_committed_is_seen_by_the_next_unit_and_a_rollback_leaves_nothing(units: Units) -> None:
    with units() as uow:
        uow.tables.create(_table("kept"), author="a", message="m")
        uow.commit()
    with units() as uow:
        uow.tables.create(_table("dropped"), author="a", message="m")
        uow.rollback()
    with units() as uow:
        uow.policies.create(_policy("left-uncommitted"), author="a")
    with units() as uow:
        assert [t["name"] for t in uow.tables.list()] == ["kept"]
        assert uow.policies.list() == []


# ------------------------------------------------------------------ revisioned documents


def test_revisions_move_by_compare_and_set(units: Units) -> None:
    with units() as uow:
        assert uow.tables.create(_table(), author="alice", message="created") == 1
        uow.commit()
    with units() as uow:
        table = uow.tables.get("t1")
        assert table.revision == 1
        edited = table.with_rating(table.ratings[sorted(table.ratings)[0]])
        assert uow.tables.update(edited, expected_revision=1, author="bob", message="edit") == 2
        with pytest.raises(StaleRevision):
            uow.tables.update(edited, expected_revision=1, author="carol", message="late")
        uow.commit()
    with units() as uow:
        assert uow.tables.current_revision("t1") == 2
        assert uow.tables.get_revision("t1", 1).revision == 1
        history = uow.tables.revisions("t1")
        assert [(h["revision"], h["author"], h["message"]) for h in history] == [(1, "alice", "created"),
                                                                                (2, "bob", "edit")]
        assert {"revision", "author", "created_at", "message", "changes"} <= set(history[0])


def test_documents_refuse_duplicates_and_name_what_is_missing(units: Units) -> None:
    with units() as uow:
        uow.tables.create(_table(), author="a", message="")
        uow.policies.create(_policy(), author="a")
        with pytest.raises(AlreadyExists):
            uow.tables.create(_table(), author="a", message="")
        with pytest.raises(AlreadyExists):
            uow.policies.create(_policy(), author="a")
        for call in (lambda: uow.tables.get("nope"), lambda: uow.tables.current_revision("nope"),
                     lambda: uow.tables.get_revision("t1", 9), lambda: uow.policies.get("nope"),
                     lambda: uow.policies.revisions("nope"), lambda: uow.tables.delete("nope")):
            with pytest.raises(NotFound):
                call()
        uow.commit()
    with units() as uow:
        uow.tables.delete("t1")
        uow.commit()
    with units() as uow:
        with pytest.raises(NotFound):
            uow.tables.get("t1")
        assert uow.tables.create(_table(), author="a", message="again") == 1  # a name can be used again


def test_policy_history_names_each_changed_field(units: Units) -> None:
    with units() as uow:
        policy = _policy()
        uow.policies.create(policy, author="a")
        changed = Policy.from_dict({**policy.as_dict(), "description": "changed"})
        assert uow.policies.update(changed, expected_revision=1, author="b") == 2
        assert uow.policies.get("p1") == (changed, 2)
        history = uow.policies.revisions("p1")
        assert history[0]["changes"] == []
        assert history[1]["changes"] == [{"field": "description", "old": policy.description, "new": "changed"}]
        assert [p["name"] for p in uow.policies.list()] == ["p1"]


def test_one_winner_among_concurrent_writers(units: Units) -> None:
    with units() as uow:
        uow.tables.create(_table(), author="a", message="")
        uow.commit()
    outcomes: list[str] = []

    def write(i: int) -> None:
        with units() as uow:
            try:
                table = uow.tables.get_revision("t1", 1)
                uow.tables.update(table, expected_revision=1, author=f"w{i}", message="race")
                uow.commit()
                outcomes.append("won")
            except StaleRevision:
                outcomes.append("stale")
            except Exception as exc:  # a database that reports its lock instead of waiting
                outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes.count("won") == 1, outcomes
    with units() as uow:
        assert uow.tables.current_revision("t1") == 2


# ------------------------------------------------------------------ gateways and tunnels


def _gateway(name: str = "left") -> Gateway:
    return Gateway(name=name, vici_socket=f"/run/{name}.vici", ike_address="10.0.0.1", identity=f"{name}.qoss",
                   inside_networks=("10.1.0.0/24",))


def test_gateways_and_tunnels(units: Units) -> None:
    with units() as uow:
        uow.gateways.create(_gateway("right"))
        uow.gateways.create(_gateway("left"))
        with pytest.raises(AlreadyExists):
            uow.gateways.create(_gateway("left"))
        uow.gateways.update(Gateway(**{**_gateway("left").__dict__, "backend": "kernel-libipsec",
                                       "version": "charon 5.9", "algorithms": frozenset({"aes128gcm16"})}))
        record = TunnelRecord(id="abc123", initiator="left", responder="right", local_ts=("10.1.0.0/24",),
                              remote_ts=("10.2.0.0/24",), state=TunnelState.UP, negotiation={"suite": {}},
                              provenance={"request": {"min_levels": {"confidentiality": 8}}})
        stored = uow.tunnels.add(record)
        assert stored.created_at is not None
        uow.commit()
    with units() as uow:
        assert [g.name for g in uow.gateways.list()] == ["left", "right"]
        left = uow.gateways.get("left")
        assert (left.backend, left.algorithms) == ("kernel-libipsec", frozenset({"aes128gcm16"}))
        uow.tunnels.set_state("abc123", TunnelState.DOWN, "went down")
        got = uow.tunnels.get("abc123")
        assert (got.state, got.detail, got.local_ts) == (TunnelState.DOWN, "went down", ("10.1.0.0/24",))
        assert got.provenance == {"request": {"min_levels": {"confidentiality": 8}}}
        assert [t.id for t in uow.tunnels.list()] == ["abc123"]
        uow.tunnels.set_negotiation("abc123", {"suite": {"encryption": "x"}}, {"table": "t", "table_revision": 2},
                                    "moved")
        moved = uow.tunnels.get("abc123")
        assert (moved.state, moved.negotiation, moved.provenance, moved.detail) == (
            TunnelState.UP, {"suite": {"encryption": "x"}}, {"table": "t", "table_revision": 2}, "moved")
        uow.tunnels.delete("abc123")
        uow.gateways.delete("right")
        for call in (lambda: uow.tunnels.get("abc123"), lambda: uow.gateways.get("right"),
                     lambda: uow.tunnels.set_state("abc123", TunnelState.UP, ""), lambda: uow.gateways.delete("x"),
                     lambda: uow.tunnels.delete("abc123")):
            with pytest.raises(NotFound):
                call()


def test_a_move_the_state_machine_has_not_is_refused_and_changes_nothing(units: Units) -> None:
    with units() as uow:
        uow.gateways.create(_gateway("left"))
        uow.tunnels.add(TunnelRecord(id="sm1", initiator="left", responder=None, local_ts=("10.1.0.0/24",),
                                     remote_ts=("10.2.0.0/24",), state=TunnelState.UP, negotiation={"suite": {}}))
        uow.tunnels.set_state("sm1", TunnelState.DOWN, "went down")
        with pytest.raises(Conflict, match="from down to noncompliant"):
            uow.tunnels.set_state("sm1", TunnelState.NONCOMPLIANT, "an edit")
        with pytest.raises(Conflict, match="from down to requested"):
            uow.tunnels.set_state("sm1", TunnelState.REQUESTED, "")
        got = uow.tunnels.get("sm1")
        assert (got.state, got.detail) == (TunnelState.DOWN, "went down")
        uow.tunnels.set_state("sm1", TunnelState.FAILED, "reconcile gave up")
        uow.tunnels.set_negotiation("sm1", {"suite": {}}, None, "restored")
        assert uow.tunnels.get("sm1").state is TunnelState.UP


def test_a_provenance_is_replaced_only_if_the_record_is_as_it_was_read(units: Units) -> None:
    with units() as uow:
        uow.gateways.create(_gateway("left"))
        uow.tunnels.add(TunnelRecord(id="pv1", initiator="left", responder=None, local_ts=("10.1.0.0/24",),
                                     remote_ts=("10.2.0.0/24",), state=TunnelState.UP, negotiation={"suite": {}},
                                     provenance={"request": {}}))
        uow.commit()
    with units() as uow:
        seen = uow.tunnels.get("pv1").updated_at
    assert seen is not None
    with units() as uow:
        assert uow.tunnels.set_provenance("pv1", {"request": {}, "claim": 1}, unless_changed_since=seen)
        uow.commit()
    with units() as uow:  # a second writer that read the same record loses
        assert not uow.tunnels.set_provenance("pv1", {"request": {}, "claim": 2}, unless_changed_since=seen)
        assert not uow.tunnels.set_provenance("gone", {}, unless_changed_since=seen)
        uow.commit()
    with units() as uow:
        got = uow.tunnels.get("pv1")
    assert got.provenance == {"request": {}, "claim": 1}
    assert (got.state, got.negotiation) == (TunnelState.UP, {"suite": {}})


def test_tunnels_page_in_creation_order_from_a_key_that_may_be_gone(units: Units) -> None:
    ids = ["t5", "t3", "t1", "t4", "t2", "t6"]
    with units() as uow:
        for n, tunnel_id in enumerate(ids):
            uow.tunnels.add(TunnelRecord(id=tunnel_id, initiator="left", responder="right", local_ts=("10.1.0.0/24",),
                                         remote_ts=("10.2.0.0/24",), negotiation={"suite": {}},
                                         state=TunnelState.DOWN if n % 2 else TunnelState.UP))
        uow.commit()

    def key(record: TunnelRecord) -> tuple[str, str]:
        return record.created_at or "", record.id

    with units() as uow:
        ordered = sorted(uow.tunnels.list(), key=lambda r: (datetime.fromisoformat(r.created_at or ""), r.id))
        assert len(ordered) == 6
        walked: list[str] = []
        after = None
        while page := uow.tunnels.page(limit=4, after=after):
            walked += [r.id for r in page]
            after = key(page[-1])
        assert walked == [r.id for r in ordered]
        assert [r.id for r in uow.tunnels.page(limit=100, state=TunnelState.DOWN)] == [
            r.id for r in ordered if r.state is TunnelState.DOWN]
        assert [r.id for r in uow.tunnels.page(limit=1, after=key(ordered[0]), state=TunnelState.UP)] == [
            next(r.id for r in ordered[1:] if r.state is TunnelState.UP)]
        uow.tunnels.delete(ordered[2].id)  # the tunnel a cursor names is torn down: the next page is unchanged
        uow.commit()
    with units() as uow:
        assert [r.id for r in uow.tunnels.page(limit=2, after=key(ordered[2]))] == [r.id for r in ordered[3:5]]
        assert uow.tunnels.page(limit=2, after=key(ordered[5])) == []


def test_a_tunnel_joining_a_gateway_to_a_far_end_is_found_by_its_identities(units: Units) -> None:
    def record(tunnel_id: str, initiator: str, peer: PeerEnd | None) -> TunnelRecord:
        return TunnelRecord(id=tunnel_id, initiator=initiator, responder=None if peer else "right",
                            local_ts=("10.1.0.0/24",), remote_ts=("10.2.0.0/24",), negotiation={"suite": {}},
                            state=TunnelState.UP, peer=peer)

    with units() as uow:
        uow.tunnels.add(record("local", "left", None))
        uow.tunnels.add(record("p1", "left", PeerEnd(address="192.0.2.7", identity="far", local_identity="left.qoss")))
        uow.tunnels.add(record("p2", "left", PeerEnd(address="192.0.2.8", identity="far", local_identity="left.qoss")))
        uow.tunnels.add(record("o1", "other", PeerEnd(address="192.0.2.9", identity="far2",
                                                      local_identity="other.qoss")))
        uow.tunnels.add(record("s1", "left", PeerEnd(address="192.0.2.10", identity="b.gw-b", local_identity="a.gw-a",
                                                     site="site-b", gateway="gw-b", role="initiator")))
        uow.commit()
    with units() as uow:
        assert uow.tunnels.joining("left", "far", "left.qoss") == "p1"  # the oldest of two
        assert uow.tunnels.joining("left", "b.gw-b", "a.gw-a") == "s1"  # a peered tunnel's far end too
        assert uow.tunnels.joining("other", "far", "left.qoss") is None  # another gateway's
        assert uow.tunnels.joining("left", "far", "other.qoss") is None  # one identity of the two
        assert uow.tunnels.joining("left", "far2", "other.qoss") is None
        assert uow.tunnels.joining("left", "", "") is None  # the local tunnel has no far end


def test_the_tunnels_carried_with_a_peer_are_found_by_its_name_alone(units: Units) -> None:
    def record(tunnel_id: str, peer: PeerEnd | None) -> TunnelRecord:
        return TunnelRecord(id=tunnel_id, initiator="left", responder=None if peer else "right",
                            local_ts=("10.1.0.0/24",), remote_ts=("10.2.0.0/24",), negotiation={"suite": {}},
                            state=TunnelState.UP, peer=peer)

    def peered(site: str, role: str) -> PeerEnd:
        return PeerEnd(address="192.0.2.10", identity=f"{site}.gw", local_identity="a.gw-a", site=site,
                       gateway="gw" if role == "initiator" else None, role=role)

    with units() as uow:
        uow.tunnels.add(record("b1", peered("site-b", "initiator")))
        uow.tunnels.add(record("local", None))
        uow.tunnels.add(record("unmanaged", PeerEnd(address="192.0.2.7", identity="far", local_identity="left.qoss")))
        uow.tunnels.add(record("c1", peered("site-c", "initiator")))
        uow.tunnels.add(record("b2", peered("site-b", "responder")))
        uow.tunnels.add(record("prefix", peered("site-b2", "initiator")))
        uow.commit()
    with units() as uow:
        assert [r.id for r in uow.tunnels.with_peer("site-b")] == ["b1", "b2"]  # either role, oldest first
        found = uow.tunnels.with_peer("site-c")
        assert [r.id for r in found] == ["c1"]
        assert found[0] == uow.tunnels.get("c1")  # the whole record
        assert uow.tunnels.with_peer("site") == []  # a name, not a prefix
        assert uow.tunnels.with_peer("") == []  # the local and unmanaged tunnels have no peer's name
        # Every peer's at once, ids alone, in the same order; no entry for the others.
        assert uow.tunnels.ids_by_peer() == {"site-b": ["b1", "b2"], "site-c": ["c1"], "site-b2": ["prefix"]}


# ------------------------------------------------------------------ tokens, audit, keys


def test_tokens_revoke_once(units: Units) -> None:
    now = datetime.now(UTC)
    record = TokenRecord(id="0123456789ab", name="ops", scopes=frozenset({"admin"}), secret_hash="h" * 64,
                         created_at=now, expires_at=now + timedelta(days=1), revoked_at=None)
    with units() as uow:
        uow.tokens.add(record, created_by="test")
        uow.commit()
    with units() as uow:
        assert uow.tokens.find("0123456789ab") == record
        assert uow.tokens.find("ffffffffffff") is None
        uow.tokens.revoke("0123456789ab")
        first = uow.tokens.find("0123456789ab")
        assert first is not None and first.revoked_at is not None  # noqa: PT018
        uow.tokens.revoke("0123456789ab")
        assert uow.tokens.find("0123456789ab") == first
        with pytest.raises(NotFound):
            uow.tokens.revoke("ffffffffffff")
        assert [t.id for t in uow.tokens.list()] == ["0123456789ab"]


def test_sessions_are_found_by_hash_and_forgotten_when_ended(units: Units) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    token = TokenRecord(id="0123456789ab", name="ops", scopes=frozenset({"admin"}), secret_hash="h" * 64,
                        created_at=now, expires_at=now + timedelta(days=1), revoked_at=None)
    live = SessionRecord(id_hash="a" * 64, token_id=token.id, created_at=now, expires_at=now + timedelta(hours=1))
    ended = SessionRecord(id_hash="b" * 64, token_id=token.id, created_at=now - timedelta(hours=2),
                          expires_at=now - timedelta(hours=1))
    with units() as uow:
        uow.tokens.add(token, created_by="test")
        uow.sessions.add(live)
        uow.sessions.add(ended)
        uow.commit()
    with units() as uow:
        assert uow.sessions.find("a" * 64) == live
        assert uow.sessions.find("c" * 64) is None
        assert uow.sessions.delete_ended(now) == 1
        assert uow.sessions.find("b" * 64) is None
        uow.sessions.delete("a" * 64)
        uow.sessions.delete("a" * 64)  # ending an ended session is no error
        uow.commit()
    with units() as uow:
        assert uow.sessions.find("a" * 64) is None


def test_the_audit_log_filters_by_outcome_and_action(units: Units) -> None:
    with units() as uow:
        uow.audit.append_many([{"request_id": f"r{i}", "scopes": [], "source": "local", "action": action,
                                "object": f"/v1/x/{i}", "outcome": outcome}
                               for i, (action, outcome) in enumerate([("POST", 201), ("POST", 403), ("PATCH", 403),
                                                                      ("GET", 401), ("POST", 403)])])
        uow.commit()
    with units() as uow:
        assert [e["object"] for e in uow.audit.list(outcome=403)] == ["/v1/x/4", "/v1/x/2", "/v1/x/1"]
        assert [e["object"] for e in uow.audit.list(outcome=403, action="POST")] == ["/v1/x/4", "/v1/x/1"]
        newest = uow.audit.list(action="POST", limit=1)
        older = uow.audit.list(action="POST", before_id=newest[0]["id"])
        assert [e["object"] for e in older] == ["/v1/x/1", "/v1/x/0"]
        assert uow.audit.list(action="DELETE") == []


def test_the_audit_log_pages_newest_first(units: Units) -> None:
    with units() as uow:
        uow.audit.append_many([{"request_id": f"r{i}", "scopes": [], "source": "local", "action": "POST",
                                "object": f"/v1/x/{i}", "outcome": 200} for i in range(5)])
        uow.commit()
    with units() as uow:
        page = uow.audit.list(limit=2)
        assert [e["object"] for e in page] == ["/v1/x/4", "/v1/x/3"]
        older = uow.audit.list(limit=10, before_id=page[-1]["id"])
        assert [e["object"] for e in older] == ["/v1/x/2", "/v1/x/1", "/v1/x/0"]
        assert older[0]["detail"] == "" and older[0]["token_id"] is None  # noqa: PT018


def test_idempotency_claims_are_unique_and_released_only_unanswered(units: Units) -> None:
    with units() as uow:
        assert uow.idempotency.reserve("tok", "k1", "h1") is True
        uow.commit()
    with units() as uow:
        assert uow.idempotency.reserve("tok", "k1", "h2") is False
        assert uow.idempotency.reserve("other", "k1", "h2") is True  # keys are per token
        found = uow.idempotency.find("tok", "k1")
        assert found is not None and (found.request_hash, found.status) == ("h1", 0)  # noqa: PT018
        uow.idempotency.complete("tok", "k1", status=201, body={"id": "x"})
        uow.idempotency.release("tok", "k1")  # answered: stays
        uow.idempotency.release("other", "k1")  # unanswered: gone
        uow.commit()
    with units() as uow:
        answered = uow.idempotency.find("tok", "k1")
        assert answered is not None and (answered.status, answered.body) == (201, {"id": "x"})  # noqa: PT018
        assert uow.idempotency.find("other", "k1") is None


def test_an_unanswered_claim_older_than_a_moment_is_taken_over_once(units: Units) -> None:
    with units() as uow:
        assert uow.idempotency.reserve("tok", "k1", "h1") is True
        assert uow.idempotency.reserve("tok", "k2", "h1") is True
        uow.idempotency.complete("tok", "k2", status=201, body={"id": "x"})
        uow.commit()
    with units() as uow:
        uow_found = uow.idempotency.find("tok", "k1")
        assert uow_found is not None and uow_found.reserved_at is not None  # noqa: PT018
        claimed = uow_found.reserved_at
        assert uow.idempotency.take_over("tok", "k1", claimed_before=claimed) is False  # not older
        later = datetime.now(UTC) + timedelta(seconds=1)
        assert uow.idempotency.take_over("tok", "k2", claimed_before=later) is False  # answered
        assert uow.idempotency.take_over("tok", "nope", claimed_before=later) is False
        assert uow.idempotency.take_over("tok", "k1", claimed_before=later) is True
        uow.commit()
    with units() as uow:
        again = uow.idempotency.find("tok", "k1")
        assert again is not None and again.status == 0 and again.reserved_at is not None  # noqa: PT018
        assert again.reserved_at > claimed  # claimed anew: a second taker needs it older still
        assert uow.idempotency.take_over("tok", "k1", claimed_before=claimed + timedelta(microseconds=1)) is False


def test_server_keys_are_made_once_and_shipped_loads_remembered(units: Units) -> None:
    with units() as uow:
        first = uow.server_keys.get_or_create("idempotency", lambda: "aa" * 32)
        assert uow.server_keys.get_or_create("idempotency", lambda: "bb" * 32) == first == "aa" * 32
        uow.shipped.record("rating_table", "esaf-2006")
        uow.shipped.record("rating_table", "esaf-2006")
        uow.shipped.record("policy", "voip")
        uow.commit()
    with units() as uow:
        assert uow.server_keys.get_or_create("idempotency", lambda: "cc" * 32) == "aa" * 32
        assert uow.shipped.loaded("rating_table") == {"esaf-2006"}
        assert uow.shipped.loaded("policy") == {"voip"}


def test_events_come_in_order_filtered_by_scope_and_are_pruned(units: Units) -> None:
    with units() as uow:
        assert uow.events.last_id() == 0
        uow.events.append("tunnel.state", "t1", {"state": "down"}, scope="tunnels:read")
        uow.events.append("rating_table.revision", "esaf-2006", {"revision": 2})
        uow.events.append("audit", "7", {"outcome": 200}, scope="audit:read")
        uow.commit()
    with units() as uow:
        everything = uow.events.after(0, scopes=None)
        assert [e["kind"] for e in everything] == ["tunnel.state", "rating_table.revision", "audit"]
        assert everything[0]["data"] == {"state": "down"}
        assert set(everything[0]) == {"id", "at", "kind", "subject", "data"}
        ids = [e["id"] for e in everything]
        assert ids == sorted(ids)
        assert uow.events.last_id() == ids[-1]
        seen = uow.events.after(0, scopes={"tunnels:read"})
        assert [e["kind"] for e in seen] == ["tunnel.state", "rating_table.revision"]
        assert [e["kind"] for e in uow.events.after(ids[0], scopes=set())] == ["rating_table.revision"]
        assert uow.events.after(ids[-1], scopes=None) == []
        assert len(uow.events.after(0, scopes=None, limit=2)) == 2
        edits = uow.events.after(0, scopes=None, kinds={"rating_table.revision", "policy.deleted"})
        assert [(e["kind"], e["data"]) for e in edits] == [("rating_table.revision", {"revision": 2})]
        assert uow.events.after(ids[1], scopes=None, kinds={"rating_table.revision"}) == []
        assert uow.events.after(0, scopes=None, kinds=set()) == []
    with units() as uow:
        assert uow.events.prune(datetime.now(UTC) + timedelta(seconds=1)) == 3
        uow.commit()
    with units() as uow:
        uow.events.append("tunnel.state", "t2", {}, scope="tunnels:read")
        uow.commit()
    with units() as uow:
        (later,) = uow.events.after(0, scopes=None)
        assert later["id"] > ids[-1]  # ids are never given twice
