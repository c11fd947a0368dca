"""app.domain.merge: an edit made on an older revision of a rating table, merged row by row and
field by field over the latest revision."""

from __future__ import annotations

from typing import Any

from app.domain.merge import WHOLE_ROW, FieldConflict, merge_policies, merge_tables
from app.domain.ratings import RatingTable

AES128 = {"algorithm": "aes128", "confidentiality": 8, "performance": 8.0}
MD5 = {"algorithm": "md5", "integrity": 2, "performance": 9.0}
SHA1 = {"algorithm": "sha1", "integrity": 5, "performance": 6.0}


def doc(*rows: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": "t", "description": description, "source": "", "ratings": [dict(r) for r in rows]}


BASE = doc(AES128, MD5, SHA1)


def _rows(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["algorithm"]: r for r in document["ratings"]}


def test_edits_of_different_rows_both_land() -> None:
    theirs = doc({**AES128, "performance": 7.0}, MD5, SHA1)
    mine = doc(AES128, {**MD5, "integrity": 1}, SHA1)
    merged, conflicts = merge_tables(BASE, theirs, mine)
    assert conflicts == []
    assert merged == doc({**AES128, "performance": 7.0}, {**MD5, "integrity": 1}, SHA1)
    assert RatingTable.from_dict(merged).as_dict() == merged  # a valid table as it stands


def test_edits_of_different_fields_of_one_row_both_land() -> None:
    theirs = doc(AES128, {**MD5, "performance": 8.5}, SHA1)
    mine = doc(AES128, {**MD5, "integrity": 1, "reason": "broken"}, SHA1)
    merged, conflicts = merge_tables(BASE, theirs, mine)
    assert conflicts == []
    assert _rows(merged)["md5"] == {**MD5, "integrity": 1, "performance": 8.5, "reason": "broken"}


def test_the_same_value_on_both_sides_is_no_conflict() -> None:
    theirs = doc(AES128, {**MD5, "integrity": 1}, SHA1)
    merged, conflicts = merge_tables(BASE, theirs, theirs)
    assert (merged, conflicts) == (theirs, [])


def test_one_field_changed_to_different_values_is_a_conflict_naming_row_field_and_both_values() -> None:
    theirs = doc(AES128, {**MD5, "integrity": 3}, SHA1)
    mine = doc({**AES128, "reason": "fine"}, {**MD5, "integrity": 1, "performance": 9.5}, SHA1)
    _, conflicts = merge_tables(BASE, theirs, mine)
    assert conflicts == [FieldConflict("md5", "integrity", base=2, theirs=3, mine=1)]
    assert conflicts[0].as_dict() == {"algorithm": "md5", "field": "integrity", "base": 2, "theirs": 3, "mine": 1}


def test_a_field_one_side_cleared_and_the_other_changed_is_a_conflict() -> None:
    base = doc({**AES128, "reason": "old"})
    theirs = doc(AES128)  # reason cleared
    mine = doc({**AES128, "reason": "new"})
    assert merge_tables(base, theirs, mine)[1] == [FieldConflict("aes128", "reason", "old", None, "new")]


def test_a_row_added_on_one_side_is_kept() -> None:
    sha256 = {"algorithm": "sha256", "integrity": 8, "performance": 3.0}
    theirs = doc(AES128, MD5, SHA1, sha256)
    mine = doc(AES128, {**MD5, "integrity": 1}, SHA1)
    merged, conflicts = merge_tables(BASE, theirs, mine)
    assert conflicts == []
    assert list(_rows(merged)) == ["aes128", "md5", "sha1", "sha256"]
    merged, conflicts = merge_tables(BASE, doc(AES128, MD5, SHA1), doc(AES128, MD5, SHA1, sha256))
    assert (list(_rows(merged)), conflicts) == (["aes128", "md5", "sha1", "sha256"], [])


def test_a_row_added_on_both_sides_merges_field_by_field() -> None:
    sha256 = {"algorithm": "sha256", "integrity": 8, "performance": 3.0}
    same, conflicts = merge_tables(BASE, doc(AES128, MD5, SHA1, sha256), doc(AES128, MD5, SHA1, sha256))
    assert (_rows(same)["sha256"], conflicts) == (sha256, [])
    _, conflicts = merge_tables(BASE, doc(AES128, MD5, SHA1, sha256),
                                doc(AES128, MD5, SHA1, {**sha256, "integrity": 9}))
    assert conflicts == [FieldConflict("sha256", "integrity", None, 8, 9)]


def test_a_row_removed_on_one_side_and_untouched_on_the_other_is_removed() -> None:
    theirs = doc(AES128, SHA1)  # md5 removed
    mine = doc({**AES128, "performance": 7.5}, MD5, SHA1)
    merged, conflicts = merge_tables(BASE, theirs, mine)
    assert (list(_rows(merged)), conflicts) == (["aes128", "sha1"], [])
    assert _rows(merged)["aes128"]["performance"] == 7.5
    merged, conflicts = merge_tables(BASE, doc(AES128, MD5, {**SHA1, "integrity": 6}), doc(AES128, SHA1))
    assert (list(_rows(merged)), conflicts) == (["aes128", "sha1"], [])


def test_a_row_removed_on_one_side_and_changed_on_the_other_is_a_conflict_over_the_whole_row() -> None:
    edited = {**MD5, "integrity": 1}
    _, conflicts = merge_tables(BASE, doc(AES128, SHA1), doc(AES128, edited, SHA1))
    assert conflicts == [FieldConflict("md5", WHOLE_ROW, MD5, None, edited)]
    _, conflicts = merge_tables(BASE, doc(AES128, edited, SHA1), doc(AES128, SHA1))
    assert conflicts == [FieldConflict("md5", WHOLE_ROW, MD5, edited, None)]


def test_the_description_merges_like_a_field() -> None:
    merged, conflicts = merge_tables(BASE, doc(AES128, MD5, SHA1, description="theirs"),
                                     doc(AES128, {**MD5, "integrity": 1}, SHA1))
    assert (merged["description"], conflicts) == ("theirs", [])
    _, conflicts = merge_tables(BASE, doc(AES128, MD5, SHA1, description="theirs"),
                                doc(AES128, MD5, SHA1, description="mine"))
    assert conflicts == [FieldConflict(None, "description", "", "theirs", "mine")]


def test_a_policy_merges_field_by_field_and_mappings_key_by_key() -> None:
    base = {"name": "p", "min_levels": {"confidentiality": 6, "integrity": 5}, "traffic": {"packet_size": 160},
            "deny": ["md5"], "pfs": True}
    theirs = {**base, "min_levels": {"confidentiality": 6, "integrity": 7}, "pfs": False}
    mine = {**base, "traffic": {"packet_size": 1400}, "deny": ["md5", "3des"]}
    merged, conflicts = merge_policies(base, theirs, mine)
    assert conflicts == []
    assert merged == {"name": "p", "min_levels": {"confidentiality": 6, "integrity": 7},
                      "traffic": {"packet_size": 1400}, "deny": ["md5", "3des"], "pfs": False}


def test_a_policy_field_both_changed_is_a_conflict_named_by_its_path() -> None:
    base = {"name": "p", "min_levels": {"integrity": 5}, "deny": ["md5"]}
    theirs = {"name": "p", "min_levels": {"integrity": 7}, "deny": ["md5", "sha1"]}
    mine = {"name": "p", "min_levels": {"integrity": 9}, "deny": []}
    _, conflicts = merge_policies(base, theirs, mine)
    assert [c.as_dict() for c in conflicts] == [
        {"algorithm": None, "field": "min_levels.integrity", "base": 5, "theirs": 7, "mine": 9},
        {"algorithm": None, "field": "deny", "base": ["md5"], "theirs": ["md5", "sha1"], "mine": []}]
