"""The commands that go through the API, against one real ``qoss serve`` (in-process CLI, real
HTTP): every change lands as any client's does, audited under the token's name; refusals are the
service's error document or one line saying why the service could not be reached; output as a
table, JSON or YAML; named contexts. One test runs ``qoss`` as a process from a directory with no
database, as an administrator on another machine would."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import Result

from app.settings import SHIPPED_POLICIES_DIR
from tests.cli.service import Service, served
from tests.fixtures.served import free_port
from tests.fixtures.tunnel_records import add_tunnel_records, unit_on


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with served(tmp_path_factory.mktemp("cli-service")) as running:
        yield running


def _audit(service: Service, **params: str | int) -> list[dict[str, object]]:
    answer = httpx.get(f"{service.base}/v1/audit", params={"limit": 50, **params},
                       headers={"Authorization": f"Bearer {service.admin}"})
    assert answer.status_code == 200, answer.text
    return list(answer.json())


def _copy_table(service: Service, tmp_path: Path, name: str) -> None:
    """A table of this test's own: esaf-2006 imported under ``name``."""
    csv = service.cli("ratings", "export", "esaf-2006", "--format", "csv")
    assert csv.exit_code == 0, csv.stderr
    (tmp_path / f"{name}.csv").write_text(csv.stdout)
    made = service.cli("ratings", "import", str(tmp_path / f"{name}.csv"), "--name", name)
    assert made.exit_code == 0, made.stderr


def test_negotiate_answers_refuses_infeasible_and_invalid_documents(service: Service) -> None:
    body = {"rating_table": "esaf-2006", "peers": [{"name": "app", "min_levels": {"integrity": 4}}]}
    out = service.cli("negotiate", "-", stdin=json.dumps(body))
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout)["suite"]["integrity"] == "sha1"
    body["peers"][0]["min_levels"] = {"integrity": 9}  # type: ignore[index]
    infeasible = service.cli("negotiate", "-", stdin=json.dumps(body))
    assert infeasible.exit_code == 2
    assert json.loads(infeasible.stderr)["error"] == "NoFeasibleSuite"
    invalid = service.cli("negotiate", "-", stdin='{"peers": [{"name": "a", "min_levels": {"x": 1}}]}')
    assert invalid.exit_code == 2
    assert "ValidationError" in invalid.stderr
    not_json = service.cli("negotiate", "-", stdin="{peers")
    assert (not_json.exit_code, json.loads(not_json.stderr)["error"]) == (2, "ValidationError")


def test_an_edit_is_a_revision_audited_under_the_tokens_name(service: Service, tmp_path: Path) -> None:
    _copy_table(service, tmp_path, "edit-me")
    bob = service.token("bob-ops", ["ratings:write"])
    history = json.loads(service.cli("ratings", "history", "edit-me").stdout)
    dry = service.cli("ratings", "edit", "edit-me", "aes128", "--confidentiality", "5", "--dry-run", token=bob)
    assert dry.exit_code == 0, dry.stderr
    assert json.loads(dry.stdout) == {"table": "edit-me", "revision": 2, "dry_run": True, "impact": [],
                                      "sessions": []}
    assert json.loads(service.cli("ratings", "history", "edit-me").stdout) == history  # nothing kept
    not_a_value = service.cli("ratings", "edit", "edit-me", "aes128", "--integrity", "5", "--dry-run", "true")
    assert not_a_value.exit_code == 2  # --dry-run is a switch: "true" is refused, and nothing is sent
    assert "unexpected extra argument" in not_a_value.stderr
    done = service.cli("ratings", "edit", "edit-me", "aes128", "--confidentiality", "5", "--reason", "audit",
                       token=bob)
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout) == {"table": "edit-me", "revision": 2}
    last = json.loads(service.cli("ratings", "history", "edit-me").stdout)[-1]
    assert (last["author"], last["changes"][0]["field"], last["changes"][0]["new"]) == ("bob-ops",
                                                                                         "confidentiality", 5)
    patched = [a for a in _audit(service, action="PATCH") if a["object"] == "/v1/rating-tables/edit-me/ratings/aes128"]
    assert [(a["token_name"], a["outcome"]) for a in patched] == [("bob-ops", 200)] * 2  # the dry run, the edit
    nothing = service.cli("ratings", "edit", "edit-me", "aes128")
    assert nothing.exit_code == 2
    assert "at least one of" in nothing.stderr


def test_import_export_round_trip_keeps_the_description(service: Service, tmp_path: Path) -> None:
    _copy_table(service, tmp_path, "round-trip")
    listed = json.loads(service.cli("ratings", "list").stdout)
    assert {"esaf-2006", "round-trip"} <= {t["name"] for t in listed}
    before = yaml.safe_load(service.cli("ratings", "export", "round-trip").stdout)
    csv = str(tmp_path / "round-trip.csv")
    again = service.cli("ratings", "import", csv, "--name", "round-trip", "--revision", "1")
    assert again.exit_code == 0, again.stderr
    assert json.loads(again.stdout) == {"name": "round-trip", "revision": 2, "ratings": 9}
    after = yaml.safe_load(service.cli("ratings", "export", "round-trip").stdout)
    assert (after["description"], after["source"]) == (before["description"], before["source"])
    stale = service.cli("ratings", "import", csv, "--name", "round-trip", "--revision", "1")
    assert stale.exit_code == 2
    assert json.loads(stale.stderr)["error"] in ("Conflict", "EditConflict", "StaleRevision")
    missing = service.cli("ratings", "import", str(tmp_path / "absent.csv"), "--name", "x")
    assert (missing.exit_code, json.loads(missing.stderr)["detail"]) == (2, f"{tmp_path / 'absent.csv'}: no such file")


def test_history_and_revert_of_a_table_and_a_policy(service: Service, tmp_path: Path) -> None:
    _copy_table(service, tmp_path, "revert-me")
    exported = service.cli("ratings", "export", "revert-me").stdout
    (tmp_path / "edited.yaml").write_text(exported.replace("Blowfish", "Blowfish (edited)", 1))
    assert service.cli("ratings", "import", str(tmp_path / "edited.yaml"), "--revision", "1").exit_code == 0
    out = service.cli("ratings", "revert", "revert-me", "--to", "1", "--message", "undo")
    assert out.exit_code == 0, out.stderr
    assert json.loads(out.stdout) == {"table": "revert-me", "revision": 3, "reverted_to": 1}
    history = json.loads(service.cli("ratings", "history", "revert-me").stdout)
    assert [(h["revision"], h["message"]) for h in history][-1] == (3, "reverted to 1: undo")
    assert service.cli("ratings", "export", "revert-me").stdout == exported
    again = service.cli("ratings", "revert", "revert-me", "--to", "3")
    assert (again.exit_code, json.loads(again.stderr)["error"]) == (2, "InvalidInput")
    assert service.cli("policies", "revert", "voip", "--to", "1").exit_code == 2  # its current revision
    missing = service.cli("policies", "revert", "voip", "--to", "9")
    assert json.loads(missing.stderr)["error"] == "NotFound"
    assert [h["revision"] for h in json.loads(service.cli("policies", "history", "voip").stdout)] == [1]


def test_policies_list_export_import_and_a_shipped_one_restored(service: Service, tmp_path: Path) -> None:
    names = {p["name"] for p in json.loads(service.cli("policies", "list").stdout)}
    assert "voip" in names
    exported = yaml.safe_load(service.cli("policies", "export", "voip").stdout)
    assert exported == yaml.safe_load((SHIPPED_POLICIES_DIR / "voip.yaml").read_text()) | exported
    exported["name"] = "voip-copy"
    (tmp_path / "copy.yaml").write_text(yaml.safe_dump(exported))
    made = service.cli("policies", "import", str(tmp_path / "copy.yaml"))
    assert (made.exit_code, json.loads(made.stdout)) == (0, {"name": "voip-copy", "revision": 1})
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmin_levels: {integrity: 11}\n")
    refused = service.cli("policies", "import", str(bad))
    assert refused.exit_code == 2
    assert "bad" not in {p["name"] for p in json.loads(service.cli("policies", "list").stdout)}
    present = service.cli("policies", "import", "--shipped", "voip")
    assert (present.exit_code, json.loads(present.stderr)["error"]) == (2, "AlreadyExists")
    assert httpx.delete(f"{service.base}/v1/policies/voip",
                        headers={"Authorization": f"Bearer {service.admin}"}).status_code == 204
    restored = service.cli("policies", "import", "--shipped", "voip")
    assert (restored.exit_code, json.loads(restored.stdout)) == (0, {"name": "voip", "revision": 1})
    unknown = service.cli("ratings", "import", "--shipped", "no-such-table")
    assert json.loads(unknown.stderr)["error"] == "NotFound"


def test_check_validates_files_without_a_service(service: Service, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmin_levels: {integrity: 11}\n")
    out = service.cli("policies", "check", str(SHIPPED_POLICIES_DIR / "voip.yaml"), str(bad),
                      env={"QOSS_URL": "http://127.0.0.1:9"})
    assert out.exit_code == 1
    assert "voip.yaml: ok" in out.stdout
    assert "bad.yaml: INVALID" in out.stdout


def test_output_as_a_table_json_or_yaml(service: Service) -> None:
    as_json = json.loads(service.cli("ratings", "list", "-o", "json").stdout)
    as_yaml = yaml.safe_load(service.cli("ratings", "list", "-o", "yaml").stdout)
    assert as_json == as_yaml
    table = service.cli("ratings", "list", "-o", "table").stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "REVISION"] or "NAME" in table[0].split()
    assert any(line.startswith("esaf-2006 ") for line in table[1:])
    assert len(table) == len(as_json) + 1
    wrong = service.cli("ratings", "list", "-o", "xml")
    assert wrong.exit_code == 2
    assert "xml" in wrong.stderr


def test_tokens_made_listed_and_revoked_through_the_service(service: Service) -> None:
    made = service.cli("token", "create", "--name", "colleague", "--scopes", "tunnels:read", "-o", "json")
    assert made.exit_code == 0, made.stderr
    token = json.loads(made.stdout)
    assert httpx.get(f"{service.base}/v1/tunnels", headers={"Authorization": f"Bearer {token['token']}"}
                     ).status_code == 200
    listed = service.cli("token", "list")
    assert token["token"] not in listed.stdout
    assert {t["name"] for t in json.loads(listed.stdout)} >= {"colleague", "cli-admin"}
    created = [a for a in _audit(service, action="POST") if a["object"] == "/v1/tokens"]
    assert created[0]["token_name"] == "cli-admin"
    assert token["token"] not in json.dumps(created)
    assert service.cli("token", "revoke", token["id"]).exit_code == 0
    assert httpx.get(f"{service.base}/v1/tunnels", headers={"Authorization": f"Bearer {token['token']}"}
                     ).status_code == 401
    weak = service.cli("token", "list", token=service.token("weak", ["tunnels:read"]))
    assert (weak.exit_code, json.loads(weak.stderr)["error"]) == (2, "Forbidden")


def test_gateways_and_tunnels_refuse_clearly(service: Service, tmp_path: Path) -> None:
    assert json.loads(service.cli("gateways").stdout) == []
    gone = service.cli("gateways", "remove", "nowhere")
    assert (gone.exit_code, json.loads(gone.stderr)["error"]) == (2, "NotFound")
    unreachable = service.cli("gateways", "add", "gw", "--vici-socket", "/nonexistent/charon.vici",
                              "--ike-address", "10.0.0.1", "--inside", "10.1.0.0/24")
    assert unreachable.exit_code == 2
    assert json.loads(unreachable.stderr)["error"] in ("GatewayUnreachable", "InvalidInput")
    no_file = service.cli("tunnel", "up", "left", "--peer", "10.99.0.2", "--remote-ts", "10.2.0.1/32")
    assert (no_file.exit_code, "--psk-file" in no_file.stderr) == (2, True)
    short = tmp_path / "psk"
    short.write_text("short-secret-value\n")
    refused = service.cli("tunnel", "up", "left", "--peer", "10.99.0.2", "--psk-file", str(short), "--remote-ts",
                          "10.2.0.1/32")
    assert refused.exit_code == 2
    assert "psk" in refused.stderr
    assert "short-secret-value" not in refused.stderr + refused.stdout
    good = tmp_path / "good"
    good.write_text("p" * 40)
    both = service.cli("tunnel", "up", "left", "right", "--peer", "10.99.0.2", "--psk-file", str(good))
    assert (both.exit_code, "exactly one of responder" in both.stderr) == (2, True)
    unknown = service.cli("tunnel", "up", "left", "right", "--confidentiality", "8")
    assert (unknown.exit_code, json.loads(unknown.stderr)["error"]) == (2, "NotFound")


def test_no_service_no_token_and_a_bad_token_are_one_line(service: Service) -> None:
    nobody = service.cli("ratings", "list", env={"QOSS_URL": f"http://127.0.0.1:{free_port()}"})
    assert nobody.exit_code == 2
    assert nobody.stderr.startswith("qoss: cannot reach qoss at http://127.0.0.1:")
    assert "qoss serve" in nobody.stderr
    assert len(nobody.stderr.splitlines()) == 1
    anonymous = service.cli("token", "list", token="")
    assert anonymous.exit_code == 2
    assert "QOSS_TOKEN" in json.loads(anonymous.stderr)["hint"]
    wrong = service.cli("token", "list", token="qoss_not-a-token")
    assert (wrong.exit_code, json.loads(wrong.stderr)["error"]) == (2, "Unauthenticated")
    assert "qoss_not-a-token" not in wrong.stderr


def test_contexts_choose_the_service_and_keep_tokens_private(service: Service, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    token_file = tmp_path / "token"
    token_file.write_text(service.admin + "\n")
    env = {"QOSS_CONFIG": str(config), "QOSS_URL": None, "QOSS_TOKEN": None}
    down = f"http://127.0.0.1:{free_port()}"

    def cli(*args: str, stdin: str | None = None) -> Result:
        return service.cli(*args, env=env, token="", stdin=stdin)

    assert cli("context", "set", "prod", "--url", service.base, "--token-file", str(token_file)).exit_code == 0
    assert cli("context", "set", "other", "--url", down, "--token-stdin", stdin=service.admin).exit_code == 0
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    listed = json.loads(cli("context", "list").stdout)
    assert [(c["name"], c["current"]) for c in listed] == [("other", False), ("prod", True)]
    assert service.admin not in json.dumps(listed)
    assert cli("token", "list").exit_code == 0  # the current context: prod
    assert cli("--context", "other", "token", "list").exit_code == 2
    assert cli("context", "use", "other").exit_code == 0
    unreachable = cli("token", "list")
    assert down in unreachable.stderr
    assert service.cli("token", "list", env={**env, "QOSS_URL": service.base}, token="").exit_code == 0
    config.chmod(0o644)  # a token others can read is refused, as ssh refuses such a key
    exposed = cli("token", "list")
    assert exposed.exit_code == 2
    assert "chmod 600" in exposed.stderr
    config.chmod(0o600)
    assert cli("context", "remove", "other").exit_code == 0
    assert "current-context" not in yaml.safe_load(config.read_text())
    unknown = cli("--context", "nope", "token", "list")
    assert unknown.exit_code == 2
    assert "no context 'nope'" in unknown.stderr


def test_an_admin_elsewhere_edits_through_the_service_from_a_directory_with_no_database(
        service: Service, tmp_path: Path) -> None:
    _copy_table(service, tmp_path, "far-away")
    token = service.token("alice-remote", ["ratings:write"])
    empty = tmp_path / "elsewhere"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QOSS_")}
    env.update(QOSS_URL=service.base, QOSS_TOKEN=token, XDG_CONFIG_HOME=str(empty / "config"))
    done = subprocess.run([sys.executable, "-m", "app.cli", "ratings", "edit", "far-away", "3des",
                           "--confidentiality", "2", "--reason", "Sweet32"],
                          cwd=empty, env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"table": "far-away", "revision": 2}
    assert list(empty.iterdir()) == []  # no database, no file made here
    entry = next(a for a in _audit(service, action="PATCH") if a["object"] == "/v1/rating-tables/far-away/ratings/3des")
    assert (entry["token_name"], entry["outcome"]) == ("alice-remote", 200)


def test_tunnel_list_follows_every_page(service: Service) -> None:
    ordered = add_tunnel_records(service.database_url, 1001)  # two pages of at most 1000
    with unit_on(service.database_url) as uow:
        records = {t.id: t.as_dict() for t in uow.tunnels.list()}
    listed = service.cli("tunnel", "list")
    assert listed.exit_code == 0, listed.stderr
    assert [t["id"] for t in json.loads(listed.stdout)] == ordered
    assert json.loads(listed.stdout) == json.loads(json.dumps([records[i] for i in ordered], default=str))
