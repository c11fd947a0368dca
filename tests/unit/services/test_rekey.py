"""What an edit does to the running tunnels (app.services.rekey), on the in-memory unit of work:
which fall below their minimums, which would get another choice, which stay; and what the
rekeyer does when a move cannot be made."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.domain.algorithms import CATALOGUE
from app.domain.errors import GatewayUnreachable
from app.domain.tunnels import Gateway, TunnelRecord, TunnelState
from app.services import ratings
from app.services.rekey import Rekeyer, assess, assess_one
from app.services.tunnels import negotiate_tunnel, provenance
from tests.fakes.uow import FakeDatabase, FakeUnitOfWork
from tests.fixtures.waiting import until

TABLE = "standards-2026"
ALL = frozenset(CATALOGUE)


def _gateway(name: str) -> Gateway:
    return Gateway(name=name, vici_socket=f"/run/{name}.vici", ike_address="10.0.0.1", identity=f"{name}.qoss",
                   inside_networks=("10.1.0.0/24",), backend="kernel-netlink", algorithms=ALL)


def _tunnel(uow: FakeUnitOfWork, tid: str, min_levels: dict[str, int], *, recorded: bool = True) -> TunnelRecord:
    left, right = uow.gateways.get("left"), uow.gateways.get("right")
    inputs: dict[str, Any] = {"min_levels": min_levels, "forbids": []}
    result = negotiate_tunnel(uow=uow, inputs=inputs, initiator=left, responder=right,
                              default_table=TABLE)
    record = TunnelRecord(
        id=tid, initiator="left", responder="right", local_ts=("10.1.0.0/24",), remote_ts=("10.2.0.0/24",),
        state=TunnelState.UP, negotiation=result.as_dict(),
        provenance=provenance(uow=uow, inputs=inputs, result=result, initiator=left, responder=right)
        if recorded else None)
    return uow.tunnels.add(record)


@pytest.fixture
def world(database: FakeDatabase) -> FakeDatabase:
    with database.unit() as uow:
        uow.gateways.create(_gateway("left"))
        uow.gateways.create(_gateway("right"))
        _tunnel(uow, "strong", {"confidentiality": 8, "integrity": 8})
        _tunnel(uow, "old", {"confidentiality": 8, "integrity": 8}, recorded=False)
        uow.commit()
    return database


def _esp(uow: FakeUnitOfWork, tid: str) -> str:
    return str(uow.tunnels.get(tid).negotiation["proposals"]["esp"])


def _weaken(uow: FakeUnitOfWork, algorithm: str, **changes: object) -> None:
    table = ratings.get_table(uow=uow, name=TABLE)
    ratings.update_rating(uow=uow, name=TABLE, algorithm=algorithm, changes=changes,
                          expected_revision=table.revision, author="test")


def test_without_an_edit_every_tunnel_stays(world: FakeDatabase) -> None:
    with world.unit() as uow:
        kinds = {i.tunnel: i.kind for i in assess(uow, default_table=TABLE)}
    assert kinds == {"strong": "stays", "old": "unassessed"}


def test_an_algorithm_rated_below_the_minimum_makes_its_tunnels_noncompliant(world: FakeDatabase) -> None:
    with world.unit() as uow:
        chosen = uow.tunnels.get("strong").negotiation["suite"]["encryption"]
        _weaken(uow, chosen, confidentiality=5)
        impact = assess_one(uow, uow.tunnels.get("strong"), default_table=TABLE)
    assert impact.kind == "noncompliant"
    assert impact.result is not None and impact.new is not None  # noqa: PT018
    assert impact.result.suite.encryption != chosen
    assert impact.result.levels.confidentiality >= 8
    assert "no longer meets its minimums" in impact.reason


def test_a_slower_choice_is_a_cheaper_alternative_not_a_violation(world: FakeDatabase) -> None:
    with world.unit() as uow:
        chosen = uow.tunnels.get("strong").negotiation["suite"]["encryption"]
        _weaken(uow, chosen, performance=0.001)
        impact = assess_one(uow, uow.tunnels.get("strong"), default_table=TABLE)
    assert impact.kind == "cheaper", impact
    assert impact.result is not None and impact.result.suite.encryption != chosen  # noqa: PT018


def test_nothing_meeting_the_minimums_any_more_is_noncompliant_without_a_new_suite(world: FakeDatabase) -> None:
    with world.unit() as uow:
        table = ratings.get_table(uow=uow, name=TABLE)
        for keyword, rating in table.ratings.items():
            if (rating.confidentiality or 0) >= 8:
                _weaken(uow, keyword, confidentiality=1)
        impact = assess_one(uow, uow.tunnels.get("strong"), default_table=TABLE)
    assert (impact.kind, impact.new, impact.result) == ("noncompliant", None, None)
    assert "nothing meets its minimums" in impact.reason


def _unreachable(path: str) -> Any:
    raise GatewayUnreachable(path, "no such socket (is charon running?)")


@pytest.mark.parametrize("teardown", [False, True])
def test_a_tunnel_that_cannot_be_moved_is_marked_noncompliant_or_torn_down(world: FakeDatabase, teardown: bool
                                                                          ) -> None:
    with world.unit() as uow:
        _weaken(uow, uow.tunnels.get("strong").negotiation["suite"]["encryption"], confidentiality=5)
        uow.commit()
    rekeyer = Rekeyer(units=world.unit, vici=_unreachable, default_table=TABLE, teardown_noncompliant=teardown,
                      attempts=1)
    try:
        impacts = rekeyer.run_once("test edit")
    finally:
        rekeyer.stop()
    assert {i.tunnel: i.kind for i in impacts} == {"strong": "noncompliant", "old": "unassessed"}
    assert (rekeyer.moved, rekeyer.refused) == (0, 1)
    with world.unit() as uow:
        ids = [t.id for t in uow.tunnels.list()]
        if teardown:
            assert ids == ["old"]
        else:
            record = uow.tunnels.get("strong")
            assert record.state is TunnelState.NONCOMPLIANT
            assert "test edit" in record.detail and "unreachable" in record.detail  # noqa: PT018
        (entry,) = [e for e in uow.audit.list() if e["object"] == "/v1/tunnels/strong"]
        assert entry["outcome"] == 409
        told = [(e["kind"], e["subject"]) for e in uow.events.after(0, scopes={"tunnels:read"})
                if e["kind"].startswith("tunnel.")]
    assert told == [("tunnel.deleted" if teardown else "tunnel.state", "strong")]


def test_tunnels_left_noncompliant_are_tried_again_later(world: FakeDatabase) -> None:
    with world.unit() as uow:
        _weaken(uow, uow.tunnels.get("strong").negotiation["suite"]["encryption"], confidentiality=5)
        uow.commit()
    rekeyer = Rekeyer(units=world.unit, vici=_unreachable, default_table=TABLE, retry=0.1, attempts=1)
    rekeyer.start()
    try:
        rekeyer.schedule("test edit")
        deadline = time.monotonic() + 10
        while rekeyer.refused < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        rekeyer.stop()
    assert rekeyer.refused >= 3  # the edit's run, then tries every 0.1 s while it stays noncompliant
    with world.unit() as uow:
        assert "another try" in uow.tunnels.get("strong").detail


def test_a_database_away_when_the_rekeyer_starts_delays_it_and_never_stops_it(world: FakeDatabase) -> None:
    looks = 0

    def reads() -> FakeUnitOfWork:
        nonlocal looks
        looks += 1
        if looks == 1:
            raise TimeoutError("no connection was free")  # the pool timeout of a saturated process
        return world.unit()

    rekeyer = Rekeyer(units=world.unit, reads=reads, vici=_unreachable, default_table=TABLE, attempts=1,
                      watch=0.05)
    rekeyer.start()
    try:
        assert until(lambda: looks >= 3)  # it looks again after the failed first look
        with world.unit() as uow:
            _weaken(uow, uow.tunnels.get("strong").negotiation["suite"]["encryption"], confidentiality=5)
            uow.commit()
        assert until(lambda: rekeyer.refused >= 1)  # and acts on an edit made after it
    finally:
        rekeyer.stop()


def test_one_run_outside_the_background_closes_every_old_sa_itself(world: FakeDatabase,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from app.services import rekey

    closed: list[str] = []

    def moved(*, record: TunnelRecord, **_: Any) -> Any:
        return lambda: closed.append(record.id)

    monkeypatch.setattr(rekey, "move", moved)
    with world.unit() as uow:
        _weaken(uow, uow.tunnels.get("strong").negotiation["suite"]["encryption"], confidentiality=5)
        uow.commit()
    rekeyer = Rekeyer(units=world.unit, vici=_unreachable, default_table=TABLE, drain=0.05)
    try:
        rekeyer.run_once("test edit")  # as the command line runs it: no background threads
    finally:
        rekeyer.stop()
    assert (rekeyer.moved, closed) == (1, ["strong"])
    with world.unit() as uow:
        record = uow.tunnels.get("strong")
        assert record.state is TunnelState.UP
        assert record.detail.startswith("moved from")


class _Rekeying:
    """A charon whose tunnels' CHILD_SAs are rekeyed in ``seconds`` (``list-sas``'s ``rekey-time``)."""

    def __init__(self, seconds: int | None) -> None:
        self.seconds = seconds

    def list_sas(self, *, ike: str | None = None) -> list[Any]:
        from app.adapters.vici.models import ChildSa, IkeSa

        child = ChildSa(name=str(ike), uniqueid=1, state="INSTALLED", protocol="ESP", mode="TUNNEL",
                        encr_alg="AES_GCM_16", encr_keysize=256, integ_alg=None, dh_group=None, bytes_in=0,
                        bytes_out=0, packets_in=0, packets_out=0, local_ts=(), remote_ts=(),
                        rekey_time=self.seconds)
        return [IkeSa(name=str(ike), uniqueid=1, state="ESTABLISHED", local_host="", remote_host="",
                      encr_alg=None, encr_keysize=None, integ_alg=None, prf_alg=None, dh_group=None,
                      children=(child,))]


def test_a_cheaper_choice_waits_for_the_tunnels_own_rekey_then_moves(world: FakeDatabase,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from app.services import rekey

    moved: list[str] = []

    def move(*, record: TunnelRecord, **_: Any) -> Any:
        moved.append(record.id)
        return lambda: None

    monkeypatch.setattr(rekey, "move", move)
    monkeypatch.setattr(rekey, "_BEFORE_REKEY", 0.0)
    charon = _Rekeying(seconds=1)
    rekeyer = Rekeyer(units=world.unit, vici=lambda path: charon, default_table=TABLE, cheaper="on-next-rekey",
                      drain=0.0)
    rekeyer.start()
    try:
        with world.unit() as uow:
            _weaken(uow, uow.tunnels.get("strong").negotiation["suite"]["encryption"], performance=0.001)
            uow.commit()
        rekeyer.schedule("test edit")
        assert until(lambda: "strong" in rekeyer.pending_at_rekey())
        assert moved == []  # still compliant: it waits for its rekey
        assert 0 < rekeyer.pending_at_rekey()["strong"] <= 1
        assert until(lambda: moved == ["strong"], 5)  # moved when charon would have rekeyed it
        assert rekeyer.pending_at_rekey() == {}
    finally:
        rekeyer.stop()
    with world.unit() as uow:
        assert "(at its rekey)" in uow.tunnels.get("strong").detail


def test_a_pending_move_whose_choice_is_back_is_not_made(world: FakeDatabase,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from app.services import rekey

    moved: list[str] = []
    monkeypatch.setattr(rekey, "move", lambda *, record, **_: moved.append(record.id) or (lambda: None))
    monkeypatch.setattr(rekey, "_BEFORE_REKEY", 0.0)
    rekeyer = Rekeyer(units=world.unit, vici=lambda path: _Rekeying(seconds=1), default_table=TABLE,
                      cheaper="on-next-rekey", drain=0.0)
    rekeyer.start()
    try:
        with world.unit() as uow:
            algorithm = uow.tunnels.get("strong").negotiation["suite"]["encryption"]
            performance = ratings.get_table(uow=uow, name=TABLE).ratings[algorithm].performance
            _weaken(uow, algorithm, performance=0.001)
            uow.commit()
        rekeyer.schedule("test edit")
        assert until(lambda: "strong" in rekeyer.pending_at_rekey())
        with world.unit() as uow:  # the edit is undone before the rekey comes
            _weaken(uow, algorithm, performance=performance)
            uow.commit()
        assert until(lambda: rekeyer.pending_at_rekey() == {}, 5)
        assert rekeyer.idle(5)
        time.sleep(0.2)
    finally:
        rekeyer.stop()
    assert moved == []


def test_the_rekey_time_charon_reports_is_read() -> None:
    from app.adapters.vici.models import parse_ike_sa

    sa = parse_ike_sa("qoss-x", {"uniqueid": "1", "state": "ESTABLISHED", "child-sas": {
        "qoss-x-1": {"name": "qoss-x", "uniqueid": "2", "state": "INSTALLED", "protocol": "ESP",
                     "rekey-time": "3412"}}})
    assert sa.children[0].rekey_time == 3412
