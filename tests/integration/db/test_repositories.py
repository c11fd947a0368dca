"""Repositories against real SQLite and PostgreSQL, on a schema built by the migrations only."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.adapters.db.models import PolicyRevisionRow, PolicyRow, RatingTableRevisionRow, RatingTableRow, TunnelRow
from app.adapters.db.repositories import GatewayRepository, PolicyRepository, RatingTableRepository, TunnelRepository
from app.domain.errors import AlreadyExists, NotFound, StaleRevision
from app.domain.policies import Policy
from app.domain.ratings import Rating, RatingTable
from app.domain.tunnels import Gateway, TunnelRecord, TunnelState

TABLE = RatingTable.of(
    "t",
    [Rating("aes128", confidentiality=8, performance=8), Rating("sha1", integrity=5, performance=6)],
    description="two rows",
)
POLICY = Policy.from_dict({"name": "p", "min_levels": {"confidentiality": 8, "integrity": 4}, "objective_id": 3})

WRITERS = 20


def _count(session: Session, model: type[object]) -> int:
    return session.scalar(select(func.count()).select_from(model)) or 0


def _race(writers: int, write: Callable[[int], None]) -> list[str]:
    """Start ``writers`` threads at once; each calls ``write(i)``. Returns their outcomes."""
    barrier = threading.Barrier(writers)
    outcomes: list[str] = []
    lock = threading.Lock()

    def run(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            write(i)
            result = "won"
        except StaleRevision:
            result = "stale"
        except Exception as exc:  # reported in the assertion, not swallowed
            result = f"error: {exc!r}"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return outcomes


# -- rating tables ------------------------------------------------------------------


def test_create_then_get_returns_the_table_at_revision_1(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        assert RatingTableRepository(s).create(TABLE, author="alice", message="first") == 1
    with session_factory() as s:
        got = RatingTableRepository(s).get("t")
    assert got == TABLE
    assert got.revision == 1
    assert got.as_dict() == TABLE.as_dict()


def test_repository_never_commits(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s:
        RatingTableRepository(s).create(TABLE, author="alice")
        PolicyRepository(s).create(POLICY, author="alice")
        s.rollback()
    with session_factory() as s:
        assert _count(s, RatingTableRow) == 0
        assert _count(s, PolicyRow) == 0


def test_list_summarises_every_table_by_name(session_factory: sessionmaker[Session]) -> None:
    other = RatingTable.of("a-first", [Rating("sha256", integrity=8, performance=3)])
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
        RatingTableRepository(s).create(other, author="alice")
        RatingTableRepository(s).update(TABLE, expected_revision=1, author="bob")
    with session_factory() as s:
        summary = RatingTableRepository(s).list()
    assert [(t["name"], t["revision"], t["ratings"]) for t in summary] == [("a-first", 1, 1), ("t", 2, 2)]
    assert summary[1]["description"] == "two rows"


def test_current_revision_follows_updates(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        repo = RatingTableRepository(s)
        repo.create(TABLE, author="alice")
        assert repo.current_revision("t") == 1
        repo.update(TABLE, expected_revision=1, author="alice")
        assert repo.current_revision("t") == 2


def test_missing_table_is_not_found_everywhere(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s:
        repo = RatingTableRepository(s)
        for call in (
            lambda: repo.get("nope"),
            lambda: repo.get_revision("nope", 1),
            lambda: repo.current_revision("nope"),
            lambda: repo.revisions("nope"),
            lambda: repo.delete("nope"),
            lambda: repo.update(RatingTable.of("nope", TABLE.ratings.values()), expected_revision=1, author="a"),
        ):
            with pytest.raises(NotFound):
                call()


def test_missing_revision_is_not_found(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
        with pytest.raises(NotFound, match="no revision 7"):
            RatingTableRepository(s).get_revision("t", 7)


def test_duplicate_name_is_already_exists_and_writes_nothing(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
    clash = RatingTable.of("t", [Rating("des", confidentiality=2, performance=4)])
    with session_factory() as s, s.begin(), pytest.raises(AlreadyExists):
        RatingTableRepository(s).create(clash, author="bob")
    with session_factory() as s:
        assert _count(s, RatingTableRow) == 1
        assert _count(s, RatingTableRevisionRow) == 1
        assert RatingTableRepository(s).get("t") == TABLE
        assert [h["author"] for h in RatingTableRepository(s).revisions("t")] == ["alice"]


def test_duplicate_name_leaves_the_session_usable(session_factory: sessionmaker[Session]) -> None:
    other = RatingTable.of("u", [Rating("des", confidentiality=2, performance=4)])
    with session_factory() as s, s.begin():
        repo = RatingTableRepository(s)
        repo.create(TABLE, author="alice")
        with pytest.raises(AlreadyExists):
            repo.create(TABLE, author="bob")
        repo.create(other, author="alice")
    with session_factory() as s:
        assert [t["name"] for t in RatingTableRepository(s).list()] == ["t", "u"]


def test_update_makes_a_revision_with_author_time_message_and_changes(
    session_factory: sessionmaker[Session],
) -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice", message="first")
    edited = TABLE.with_rating(Rating("sha1", integrity=5, performance=7)).without("aes128")
    with session_factory() as s, s.begin():
        assert RatingTableRepository(s).update(edited, expected_revision=1, author="bob", message="faster") == 2
    with session_factory() as s:
        repo = RatingTableRepository(s)
        history = repo.revisions("t")
        assert [(h["revision"], h["author"], h["message"]) for h in history] == [
            (1, "alice", "first"), (2, "bob", "faster"),
        ]
        for h in history:
            created = datetime.fromisoformat(h["created_at"])
            assert created.utcoffset() == timedelta(0)
            assert before <= created <= datetime.now(UTC) + timedelta(seconds=5)
        assert history[0]["changes"] == [
            {"algorithm": "aes128", "field": "*", "old": None, "new": "added"},
            {"algorithm": "sha1", "field": "*", "old": None, "new": "added"},
        ]
        assert history[1]["changes"] == [
            {"algorithm": "sha1", "field": "performance", "old": 6.0, "new": 7.0},
            {"algorithm": "aes128", "field": "*", "old": "present", "new": "removed"},
        ]
        assert repo.get("t") == RatingTable.of("t", edited.ratings.values(), description="two rows", revision=2)
        assert repo.get_revision("t", 1) == TABLE


def test_stale_update_is_refused_and_writes_nothing(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
        RatingTableRepository(s).update(TABLE, expected_revision=1, author="alice")
    late = TABLE.with_rating(Rating("aes128", confidentiality=1, performance=1))
    with session_factory() as s, s.begin(), pytest.raises(StaleRevision) as refused:
        RatingTableRepository(s).update(late, expected_revision=1, author="bob")
    assert refused.value.current == 2
    with session_factory() as s:
        repo = RatingTableRepository(s)
        assert repo.current_revision("t") == 2
        assert [h["author"] for h in repo.revisions("t")] == ["alice", "alice"]
        assert repo.get("t").ratings == TABLE.ratings


def test_stale_update_inside_a_transaction_keeps_earlier_work(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        repo = RatingTableRepository(s)
        repo.create(TABLE, author="alice")
        with pytest.raises(StaleRevision):
            repo.update(TABLE, expected_revision=5, author="bob")
        assert repo.update(TABLE, expected_revision=1, author="carol") == 2
    with session_factory() as s:
        assert [h["author"] for h in RatingTableRepository(s).revisions("t")] == ["alice", "carol"]


def test_delete_removes_the_table_and_its_history(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")
        RatingTableRepository(s).update(TABLE, expected_revision=1, author="alice")
    with session_factory() as s, s.begin():
        RatingTableRepository(s).delete("t")
    with session_factory() as s:
        with pytest.raises(NotFound):
            RatingTableRepository(s).get("t")
        assert RatingTableRepository(s).list() == []
        assert _count(s, RatingTableRevisionRow) == 0
    with session_factory() as s, s.begin():  # the name is free again
        assert RatingTableRepository(s).create(TABLE, author="bob") == 1


def test_twenty_concurrent_table_updates_exactly_one_wins(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        RatingTableRepository(s).create(TABLE, author="alice")

    def write(i: int) -> None:
        table = TABLE.with_rating(Rating("aes128", confidentiality=8, performance=1 + i / 10))
        with session_factory() as s, s.begin():
            RatingTableRepository(s).update(table, expected_revision=1, author=f"w{i}")

    outcomes = _race(WRITERS, write)
    assert sorted(outcomes) == ["stale"] * (WRITERS - 1) + ["won"]
    with session_factory() as s:
        repo = RatingTableRepository(s)
        assert repo.current_revision("t") == 2
        history = repo.revisions("t")
        assert [h["revision"] for h in history] == [1, 2]
        winner = int(history[1]["author"].removeprefix("w"))
        assert repo.get("t").ratings["aes128"].performance == pytest.approx(1 + winner / 10)
        assert _count(s, RatingTableRevisionRow) == 2


# -- policies -----------------------------------------------------------------------


def test_policy_create_then_get_returns_it_at_revision_1(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        assert PolicyRepository(s).create(POLICY, author="alice") == 1
    with session_factory() as s:
        assert PolicyRepository(s).get("p") == (POLICY, 1)
        assert PolicyRepository(s).current_revision("p") == 1


def test_policy_list_summarises_every_policy_by_name(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        PolicyRepository(s).create(POLICY, author="alice")
        PolicyRepository(s).create(Policy.from_dict({"name": "a-first"}), author="alice")
    with session_factory() as s:
        summary = PolicyRepository(s).list()
    assert [(p["name"], p["revision"]) for p in summary] == [("a-first", 1), ("p", 1)]
    assert summary[1]["min_levels"] == {"confidentiality": 8, "integrity": 4, "key_exchange": 0, "post_quantum": 0}
    assert summary[1]["objectives"] == sorted(POLICY.objectives)


def test_missing_policy_is_not_found_everywhere(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s:
        repo = PolicyRepository(s)
        for call in (
            lambda: repo.get("nope"),
            lambda: repo.current_revision("nope"),
            lambda: repo.revisions("nope"),
            lambda: repo.delete("nope"),
            lambda: repo.update(Policy.from_dict({"name": "nope"}), expected_revision=1, author="a"),
        ):
            with pytest.raises(NotFound):
                call()


def test_policy_duplicate_name_is_already_exists_and_writes_nothing(
    session_factory: sessionmaker[Session],
) -> None:
    with session_factory() as s, s.begin():
        PolicyRepository(s).create(POLICY, author="alice")
    with session_factory() as s, s.begin(), pytest.raises(AlreadyExists):
        PolicyRepository(s).create(Policy.from_dict({"name": "p", "pfs": False}), author="bob")
    with session_factory() as s:
        assert _count(s, PolicyRow) == 1
        assert _count(s, PolicyRevisionRow) == 1
        assert PolicyRepository(s).get("p") == (POLICY, 1)


def test_policy_update_records_author_time_and_changed_fields(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        PolicyRepository(s).create(POLICY, author="alice", message="first")
    edited = Policy.from_dict({**POLICY.as_dict(), "pfs": False, "deny": ["sha1"]})
    with session_factory() as s, s.begin():
        assert PolicyRepository(s).update(edited, expected_revision=1, author="bob", message="no pfs") == 2
    with session_factory() as s:
        repo = PolicyRepository(s)
        assert repo.get("p") == (edited, 2)
        history = repo.revisions("p")
    assert [(h["revision"], h["author"], h["message"]) for h in history] == [
        (1, "alice", "first"), (2, "bob", "no pfs"),
    ]
    assert all(datetime.fromisoformat(h["created_at"]).utcoffset() == timedelta(0) for h in history)
    assert history[0]["changes"] == []
    assert history[1]["changes"] == [
        {"field": "deny", "old": [], "new": ["sha1"]},
        {"field": "pfs", "old": True, "new": False},
    ]


def test_policy_stale_update_is_refused_and_writes_nothing(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        PolicyRepository(s).create(POLICY, author="alice")
        PolicyRepository(s).update(POLICY, expected_revision=1, author="alice")
    with session_factory() as s, s.begin(), pytest.raises(StaleRevision) as refused:
        PolicyRepository(s).update(Policy.from_dict({"name": "p", "pfs": False}), expected_revision=1, author="bob")
    assert refused.value.current == 2
    with session_factory() as s:
        assert PolicyRepository(s).get("p") == (POLICY, 2)
        assert [h["author"] for h in PolicyRepository(s).revisions("p")] == ["alice", "alice"]


def test_policy_delete_removes_it_and_its_history(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        PolicyRepository(s).create(POLICY, author="alice")
        PolicyRepository(s).update(POLICY, expected_revision=1, author="alice")
    with session_factory() as s, s.begin():
        PolicyRepository(s).delete("p")
    with session_factory() as s:
        assert PolicyRepository(s).list() == []
        assert _count(s, PolicyRevisionRow) == 0
        with pytest.raises(NotFound):
            PolicyRepository(s).get("p")


def test_twenty_concurrent_policy_updates_exactly_one_wins(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        PolicyRepository(s).create(POLICY, author="alice")

    def write(i: int) -> None:
        policy = Policy.from_dict({**POLICY.as_dict(), "ike_lifetime": 3600 + i})
        with session_factory() as s, s.begin():
            PolicyRepository(s).update(policy, expected_revision=1, author=f"w{i}")

    outcomes = _race(WRITERS, write)
    assert sorted(outcomes) == ["stale"] * (WRITERS - 1) + ["won"]
    with session_factory() as s:
        policy, revision = PolicyRepository(s).get("p")
        history = PolicyRepository(s).revisions("p")
        assert revision == 2
        assert [h["revision"] for h in history] == [1, 2]
        assert policy.ike_lifetime == 3600 + int(history[1]["author"].removeprefix("w"))
        assert _count(s, PolicyRevisionRow) == 2


def _gateway(name: str) -> Gateway:
    return Gateway(name=name, vici_socket=f"/run/{name}.vici", ike_address="10.99.0.1", identity=name,
                   inside_networks=("10.1.0.0/24",), backend="kernel-libipsec", version="5.9.8",
                   algorithms=frozenset({"aes128", "sha256"}))


def test_gateways_in_one_read_or_not_found_naming_the_first_missing(session_factory: sessionmaker[Session]) -> None:
    with session_factory() as s, s.begin():
        for name in ("left", "right", "other"):
            GatewayRepository(s).create(_gateway(name))
    with session_factory() as s:
        repo = GatewayRepository(s)
        assert repo.get_many(["right", "left"]) == {"left": repo.get("left"), "right": repo.get("right")}
        with pytest.raises(NotFound, match="'ghost'"):
            repo.get_many(["left", "ghost", "phantom"])


@pytest.mark.parametrize("keep_transaction", [True, False])
def test_a_taken_tunnel_id_is_already_exists_with_or_without_keeping_the_transaction(
        session_factory: sessionmaker[Session], keep_transaction: bool) -> None:
    record = TunnelRecord(id="t1", initiator="left", responder=None, local_ts=("10.1.0.0/24",),
                          remote_ts=("10.2.0.0/24",), state=TunnelState.UP, negotiation={"suite": {}})
    with session_factory() as s, s.begin():
        GatewayRepository(s).create(_gateway("left"))
        TunnelRepository(s).add(record)
    with session_factory() as s:
        s.begin()
        with pytest.raises(AlreadyExists):
            TunnelRepository(s).add(dataclasses.replace(record, state=TunnelState.DOWN),
                                    keep_transaction=keep_transaction)
        if keep_transaction:  # the transaction goes on
            TunnelRepository(s).add(dataclasses.replace(record, id="t2"))
            s.commit()
        else:  # it is to be rolled back, and nothing of it stays
            s.rollback()
    with session_factory() as s:
        tunnels = TunnelRepository(s).list()
        assert [(t.id, t.state) for t in tunnels] == ([("t1", TunnelState.UP), ("t2", TunnelState.UP)]
                                                      if keep_transaction else [("t1", TunnelState.UP)])


def test_a_tunnels_state_alone(session_factory: sessionmaker[Session]) -> None:
    record = TunnelRecord(id="t1", initiator="left", responder=None, local_ts=("10.1.0.0/24",),
                          remote_ts=("10.2.0.0/24",), state=TunnelState.UP, negotiation={"suite": {}})
    with session_factory() as s, s.begin():
        GatewayRepository(s).create(_gateway("left"))
        TunnelRepository(s).add(record)
        TunnelRepository(s).set_state("t1", TunnelState.DOWN, "SA went down")
    with session_factory() as s:
        assert TunnelRepository(s).states(["t2", "t1"]) == {"t1": TunnelState.DOWN}
        assert TunnelRepository(s).states([]) == {}
        assert TunnelRepository(s).states(["t1"]) == {"t1": TunnelState.DOWN}
        assert TunnelRepository(s).states(["t2"]) == {}
    with session_factory() as s:  # a change this session has not written yet is read through
        row = s.get(TunnelRow, "t1")
        assert row is not None
        row.state = TunnelState.FAILED.value
        assert TunnelRepository(s).states(["t1"]) == {"t1": TunnelState.FAILED}
        s.rollback()
