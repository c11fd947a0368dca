"""``qoss policies`` changes a stored policy as ``qoss ratings`` changes a table, through a real
``qoss serve`` (in-process CLI, real HTTP on loopback, ``QOSS_URL`` and ``QOSS_TOKEN``): ``edit``
(options, or the policy in ``$EDITOR``) and ``replace`` name the revision they were made on
(If-Match) and land merged over a colleague's save of another field, refused with a 409 naming
the field when both changed the same one; ``--dry-run`` keeps nothing; ``history`` and ``revert``
show and undo; every change is audited under the token's name."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.cli.service import Service, served


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with served(tmp_path_factory.mktemp("cli-policies")) as running:
        yield running


def _policy(service: Service, name: str) -> tuple[dict[str, Any], int]:
    answer = httpx.get(f"{service.base}/v1/policies/{name}")
    assert answer.status_code == 200, answer.text
    return answer.json()["policy"], int(answer.headers["ETag"].strip('"'))


def _copy(service: Service, tmp_path: Path, name: str) -> Path:
    """A policy of this test's own: the shipped voip stored again under ``name``; its file."""
    document = yaml.safe_load(service.cli("policies", "export", "voip").stdout)
    document["name"] = name
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    made = service.cli("policies", "import", str(path))
    assert (made.exit_code, json.loads(made.stdout)) == (0, {"name": name, "revision": 1}), made.stderr
    return path


def _audit(service: Service, name: str) -> list[tuple[str, str, int]]:
    answer = httpx.get(f"{service.base}/v1/audit", params={"limit": 100, "action": "PUT"},
                       headers={"Authorization": f"Bearer {service.admin}"})
    assert answer.status_code == 200, answer.text
    return [(a["token_name"], a["action"], a["outcome"]) for a in answer.json()
            if a["object"] == f"/v1/policies/{name}"]


def _history(service: Service, name: str) -> list[dict[str, Any]]:
    out = service.cli("policies", "history", name)
    assert out.exit_code == 0, out.stderr
    return list(json.loads(out.stdout))


def _editor(tmp_path: Path, script: str) -> str:
    """An ``$EDITOR`` command: a Python script run on the file to edit (``path`` in it)."""
    program = tmp_path / "editor.py"
    program.write_text("import sys\nfrom pathlib import Path\npath = Path(sys.argv[1])\n" + script)
    return f"{sys.executable} {program}"


def test_edit_with_options_is_a_revision_audited_under_the_tokens_name(service: Service, tmp_path: Path) -> None:
    _copy(service, tmp_path, "edit-opts")
    carol = service.token("carol-ops", ["policies:write"])
    dry = service.cli("policies", "edit", "edit-opts", "--integrity", "7", "--dry-run", token=carol)
    assert dry.exit_code == 0, dry.stderr
    assert json.loads(dry.stdout) == {"policy": "edit-opts", "revision": 2, "dry_run": True, "impact": [],
                                      "sessions": []}
    assert [h["revision"] for h in _history(service, "edit-opts")] == [1]  # nothing kept
    done = service.cli("policies", "edit", "edit-opts", "--integrity", "7", "--set", "traffic.packet_size=200",
                       "--set", "deny=[des, md5]", token=carol)
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout) == {"policy": "edit-opts", "revision": 2}
    policy, revision = _policy(service, "edit-opts")
    assert (revision, policy["min_levels"]["integrity"], policy["traffic"]["packet_size"]) == (2, 7, 200)
    assert sorted(policy["deny"]) == ["des", "md5"]
    assert policy["min_levels"]["confidentiality"] == 6  # what the edit did not name is kept
    last = _history(service, "edit-opts")[-1]
    assert (last["revision"], last["author"]) == (2, "carol-ops")
    assert _audit(service, "edit-opts") == [("carol-ops", "PUT", 200)] * 2  # the dry run, the edit


def test_edit_refuses_bad_input_before_sending_anything(service: Service, tmp_path: Path) -> None:
    _copy(service, tmp_path, "edit-bad")
    unknown = service.cli("policies", "edit", "edit-bad", "--set", "colour=blue")
    assert (unknown.exit_code, "--set" in unknown.stderr) == (2, True)
    out_of_range = service.cli("policies", "edit", "edit-bad", "--set", "min_levels.integrity=11")
    assert out_of_range.exit_code == 2
    assert json.loads(out_of_range.stderr)["error"] == "InvalidPolicy"
    renamed = service.cli("policies", "edit", "edit-bad", env={"EDITOR": _editor(
        tmp_path, "path.write_text(path.read_text().replace('name: edit-bad', 'name: other'))\n")})
    assert (renamed.exit_code, json.loads(renamed.stderr)["error"]) == (2, "InvalidPolicy")
    failed = service.cli("policies", "edit", "edit-bad", env={"EDITOR": _editor(tmp_path, "sys.exit(3)\n")})
    assert failed.exit_code == 2
    assert "exited with status 3; nothing sent" in failed.stderr
    unchanged = service.cli("policies", "edit", "edit-bad", env={"EDITOR": _editor(tmp_path, "pass\n")})
    assert (unchanged.exit_code, "nothing sent" in unchanged.stderr) == (0, True)
    assert [h["revision"] for h in _history(service, "edit-bad")] == [1]
    assert _audit(service, "edit-bad") == []  # not one PUT reached the service


def test_a_colleagues_save_of_another_field_during_an_edit_is_merged(service: Service, tmp_path: Path) -> None:
    _copy(service, tmp_path, "edit-merge")
    bob = service.token("bob-ops", ["policies:write"])
    # While the editor is open on revision 1, bob saves revision 2 (confidentiality 8); the
    # editor's user changes the integrity: both land.
    script = f"""import httpx
url = "{service.base}/v1/policies/edit-merge"
got = httpx.get(url)
policy = got.json()["policy"]
policy["min_levels"]["confidentiality"] = 8
saved = httpx.put(url, json=policy, headers={{"Authorization": "Bearer {bob}", "If-Match": got.headers["ETag"]}})
assert saved.status_code == 200, saved.text
path.write_text(path.read_text().replace("integrity: 5", "integrity: 7"))
"""
    edited = service.cli("policies", "edit", "edit-merge", env={"EDITOR": _editor(tmp_path, script)})
    assert edited.exit_code == 0, edited.stderr
    assert json.loads(edited.stdout) == {"policy": "edit-merge", "revision": 3}
    policy, _ = _policy(service, "edit-merge")
    assert policy["min_levels"] == {"confidentiality": 8, "integrity": 7, "key_exchange": 6, "post_quantum": 0}
    assert [(h["revision"], h["author"]) for h in _history(service, "edit-merge")] == [
        (1, "cli-admin"), (2, "bob-ops"), (3, "cli-admin")]
    assert sorted(_audit(service, "edit-merge")) == [("bob-ops", "PUT", 200), ("cli-admin", "PUT", 200)]


def test_a_colleagues_save_of_the_same_field_is_a_409_naming_it(service: Service, tmp_path: Path) -> None:
    _copy(service, tmp_path, "edit-clash")
    bob = service.token("bob-clash", ["policies:write"])
    script = f"""import httpx
url = "{service.base}/v1/policies/edit-clash"
got = httpx.get(url)
policy = got.json()["policy"]
policy["min_levels"]["integrity"] = 6
saved = httpx.put(url, json=policy, headers={{"Authorization": "Bearer {bob}", "If-Match": got.headers["ETag"]}})
assert saved.status_code == 200, saved.text
path.write_text(path.read_text().replace("integrity: 5", "integrity: 9"))
"""
    clash = service.cli("policies", "edit", "edit-clash", env={"EDITOR": _editor(tmp_path, script)})
    assert clash.exit_code == 2
    refusal = json.loads(clash.stderr)
    assert refusal["error"] == "EditConflict"
    assert [(c["field"], c["theirs"], c["mine"]) for c in refusal["detail"]["conflicts"]] == [
        ("min_levels.integrity", 6, 9)]
    assert "min_levels.integrity" in refusal["detail"]["message"]
    policy, revision = _policy(service, "edit-clash")
    assert (revision, policy["min_levels"]["integrity"]) == (2, 6)  # bob's, and nothing of the refused edit


def test_replace_from_files_made_on_one_revision_merges_or_names_the_field(service: Service, tmp_path: Path) -> None:
    path = _copy(service, tmp_path, "replace-me")
    made_on = yaml.safe_load(path.read_text())
    for who, field, value in (("alice", "integrity", 7), ("bob", "key_exchange", 7), ("carol", "integrity", 8)):
        document = json.loads(json.dumps(made_on))
        document["min_levels"][field] = value
        (tmp_path / f"{who}.yaml").write_text(yaml.safe_dump(document))
    dry = service.cli("policies", "replace", str(tmp_path / "alice.yaml"), "--revision", "1", "--dry-run")
    assert (dry.exit_code, json.loads(dry.stdout)["dry_run"]) == (0, True), dry.stderr
    alice = service.cli("policies", "replace", str(tmp_path / "alice.yaml"), "--revision", "1")
    assert (alice.exit_code, json.loads(alice.stdout)) == (0, {"policy": "replace-me", "revision": 2}), alice.stderr
    bob = service.cli("policies", "import", str(tmp_path / "bob.yaml"), "--revision", "1")  # import's way
    assert (bob.exit_code, json.loads(bob.stdout)) == (0, {"policy": "replace-me", "revision": 3}), bob.stderr
    carol = service.cli("policies", "replace", str(tmp_path / "carol.yaml"), "--revision", "1")
    assert carol.exit_code == 2
    assert [c["field"] for c in json.loads(carol.stderr)["detail"]["conflicts"]] == ["min_levels.integrity"]
    policy, revision = _policy(service, "replace-me")
    assert (revision, policy["min_levels"]) == (
        3, {"confidentiality": 6, "integrity": 7, "key_exchange": 7, "post_quantum": 0})
    current = service.cli("policies", "replace", str(tmp_path / "carol.yaml"))  # on the current revision
    assert (current.exit_code, json.loads(current.stdout)["revision"]) == (0, 4), current.stderr
    assert _policy(service, "replace-me")[0]["min_levels"]["key_exchange"] == 6  # the file as it stands
    again = service.cli("policies", "import", str(tmp_path / "carol.yaml"))
    assert again.exit_code == 2
    refusal = json.loads(again.stderr)
    assert refusal["error"] == "AlreadyExists"
    assert "qoss policies replace" in refusal["hint"]


def test_history_and_revert_of_an_edited_policy(service: Service, tmp_path: Path) -> None:
    _copy(service, tmp_path, "revert-pol")
    before, _ = _policy(service, "revert-pol")
    assert service.cli("policies", "edit", "revert-pol", "--confidentiality", "9").exit_code == 0
    history = _history(service, "revert-pol")
    assert [(h["revision"], h["message"]) for h in history] == [(1, "created"), (2, "replaced")]
    assert any(c["field"].startswith("min_levels") for c in history[-1]["changes"])
    table = service.cli("policies", "history", "revert-pol", "-o", "table")
    assert table.stdout.splitlines()[0].split()[:2] == ["REVISION", "AUTHOR"]
    back = service.cli("policies", "revert", "revert-pol", "--to", "1", "--message", "too strict")
    assert (back.exit_code, json.loads(back.stdout)) == (0, {"policy": "revert-pol", "revision": 3,
                                                            "reverted_to": 1}), back.stderr
    assert _policy(service, "revert-pol") == (before, 3)
    assert _history(service, "revert-pol")[-1]["message"] == "reverted to 1: too strict"


def test_a_url_of_the_console_is_not_the_api(service: Service) -> None:
    for url in (f"{service.base}/ui", f"{service.base}/ui/"):
        out = service.cli("policies", "edit", "voip", "--integrity", "6", env={"QOSS_URL": url})
        assert out.exit_code == 2
        assert len(out.stderr.splitlines()) == 1
        assert "is not qoss's API" in out.stderr
        assert "<" not in out.stderr  # none of the page's HTML
    assert _policy(service, "voip")[1] == 1
