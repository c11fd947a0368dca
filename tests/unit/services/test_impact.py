"""An edit's impact before it is kept (app.services.impact): grouped as an admin reads it, and
nothing of the edit left behind."""

from __future__ import annotations

from app.services import ratings
from app.services.impact import preview
from tests.fakes.uow import FakeDatabase
from tests.unit.services.test_rekey import TABLE, _gateway, _tunnel


def test_a_preview_groups_the_tunnels_and_keeps_nothing_of_the_edit(database: FakeDatabase) -> None:
    with database.unit() as uow:
        uow.gateways.create(_gateway("left"))
        uow.gateways.create(_gateway("right"))
        _tunnel(uow, "strong", {"confidentiality": 8, "integrity": 8})  # aes128gcm16
        _tunnel(uow, "secret", {"confidentiality": 9, "integrity": 5})  # aes256gcm16
        _tunnel(uow, "signed", {"confidentiality": 1, "integrity": 9})  # an AEAD's 8 is not enough
        _tunnel(uow, "old", {"confidentiality": 8, "integrity": 8}, recorded=False)
        uow.commit()
    with database.unit() as uow:
        before = ratings.get_table(uow=uow, name=TABLE).revision
        ratings.update_rating(uow=uow, name=TABLE, algorithm="aes128gcm16", expected_revision=before,
                              changes={"confidentiality": 10, "integrity": 5}, author="test")
        report = preview(uow, default_table=TABLE)
        assert ratings.get_table(uow=uow, name=TABLE).revision == before
    assert [(i.tunnel, i.kind) for i in report.noncompliant] == [("strong", "noncompliant")]
    assert [(i.tunnel, i.kind) for i in report.changed] == [("secret", "cheaper")]
    assert report.stays == 1
    assert [i.tunnel for i in report.unassessed] == ["old"]
    assert [i["tunnel"] for i in report.as_list()] == ["strong", "secret", "signed", "old"]
