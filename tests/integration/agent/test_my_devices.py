"""A user's devices from the user's side, against the lab's real charons and a stock client: ``qoss
lab up --agent``, a phone enrolled with ``qoss lab device`` joins with Debian's ``charon-cmd`` in
``PREFIX-device``; its user asks Target, through Host, for their devices (a request signed with
their key, the answer sealed to them) and sees it active; another user can neither see nor revoke
it, and a replayed request is refused; the user revokes it: its tunnel is gone from Target's
charon within 5 s, its next join with the same profile is refused, and the administrator's listing
(``GET /v1/agent/users/{user_id}/devices`` at Host) shows it revoked. The administrator revokes
another device of the user (``DELETE``): its conn is gone from Target's charon."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.adapters.vici.gateway import ViciGateway
from app.lab.agent import TARGET_ID, AgentLab
from app.lab.agent_users import enroll
from tests.api.conftest import make_token
from tests.fixtures.stock_client import CharonCmd
from tests.integration.agent.test_device_join import LabCli, agent_lab, enrol, ping, stock_profile, wait_for

pytestmark = pytest.mark.charon

_REPO = Path(__file__).resolve().parents[3]

#: The user's side, run in the client's namespace with the user's client config and keys: a list of
#: their devices, a revoke, or the same list request sent twice.
_USER_SIDE = r"""
import json, sys
from pathlib import Path
from app.adapters.agent.crypto import CRYPTO, load_keys
from app.adapters.vici.gateway import ViciGateway
from app.bootstrap import agent_post
from app.domain.agent import Kind, RequestInfo
from app.domain.errors import QossError
from app.services.agent.client import AgentClient
from app.services.agent.config import load_client_config
from app.settings import Settings

config, op, target = load_client_config(Path(sys.argv[1])), sys.argv[2], sys.argv[3]
client = AgentClient(config=config, keys=load_keys(config.key_dir, config.user), crypto=CRYPTO,
                     vici=ViciGateway(config.vici_socket, 5.0), post=agent_post(Settings()))
url = f"{client.host.url}/v1/agent/requests"
try:
    if op == "revoke":
        request, wire = client.request(Kind.DISCONNECT, RequestInfo(target=target, ticket=sys.argv[4]),
                                       int(sys.argv[5]))
        print(json.dumps({"kind": client.accept(client._post(url, wire), request).kind.value}))
    else:
        request, wire = client.request(Kind.DEVICES, RequestInfo(target=target), 3)
        answer = client.accept(client._post(url, wire), request)
        out = {"devices": [d.as_dict() for d in answer.devices]}
        if op == "replay":
            try:
                client._post(url, wire)
                out["replay"] = "answered"
            except QossError as exc:
                out["replay"] = type(exc).__name__
        print(json.dumps(out))
except QossError as exc:
    print(json.dumps({"refused": type(exc).__name__}))
"""

#: An administrator's request to Host's API from the client's namespace: method, URL, token.
_ADMIN = r"""
import json, sys, urllib.request, urllib.error
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
request = urllib.request.Request(sys.argv[2], method=sys.argv[1], headers={"Authorization": f"Bearer {sys.argv[3]}"})
try:
    with opener.open(request, timeout=20) as answer:
        print(json.dumps({"status": answer.status, "body": json.loads(answer.read())}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": json.loads(exc.read() or b"null")}))
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[tuple[LabCli, dict[str, Any]]]:
    with agent_lab("qm") as made:
        yield made


def _in_client(agent: AgentLab, script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(["ip", "netns", "exec", agent.host("client").netns, sys.executable, "-c", script, *args],
                          capture_output=True, text=True, timeout=60, check=False, cwd=_REPO,
                          env=agent.env())
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def user_side(agent: AgentLab, user: str, op: str, *args: str) -> dict[str, Any]:
    return _in_client(agent, _USER_SIDE, str(agent.client_config_path(user)), op, TARGET_ID, *args)


def host_token(agent: AgentLab, monkeypatch: pytest.MonkeyPatch, name: str, scopes: list[str]) -> str:
    """A token of Host's own database (its audit chain keyed with the lab servers' key)."""
    monkeypatch.setenv("QOSS_STATE_DIR", str(agent.state_dir / "var"))
    return make_token(agent.database_url(agent.host_server), name, scopes)


def admin(agent: AgentLab, token: str, method: str, path: str) -> dict[str, Any]:
    return _in_client(agent, _ADMIN, method, f"{agent.url(agent.host_server)}{path}", token)


def test_the_user_revokes_a_joined_phone_its_tunnel_ends_its_profile_is_refused_and_the_admin_sees_it(
        lab: tuple[LabCli, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli, up = lab
    agent = AgentLab(cli.root / "lab" / "agent")
    netns, target = up["device"]["netns"], up["target"]
    inside = target["protected"][0].split("/")[0]
    report = enrol(cli, "mona", "android", tmp_path / "out", "--confidentiality", "8")
    ticket = report["ticket"]
    enroll(agent, "nils")
    profile = stock_profile(report, tmp_path / "device")
    gateway = ViciGateway(target["vici_socket"], 10.0)
    token = host_token(agent, monkeypatch, "lab-admin", ["agent:enroll"])

    with CharonCmd(netns, tmp_path / "joined", profile, limit=90) as joined:
        joined.type_passphrase()
        assert wait_for(lambda: ping(netns, inside), 15, 0.2), joined.log()[-3000:]

        # The user's own list, signed by their key: the phone, active.
        listed = {d["ticket"]: d for d in user_side(agent, "mona", "list")["devices"]}
        assert (listed[ticket]["state"], listed[ticket]["platform"]) == ("active", "android")

        # Another user: neither sees it nor revokes it with their own signed request; a replay is refused.
        theirs = user_side(agent, "nils", "replay")
        assert ticket not in {d["ticket"] for d in theirs["devices"]}
        assert theirs["replay"] == "AgentRejected"
        assert user_side(agent, "nils", "revoke", ticket, "3") == {"refused": "AgentRejected"}
        assert ping(netns, inside)
        assert any(s.remote_id == profile.identity for s in gateway.list_sas())

        # The user revokes it: the tunnel is gone from Target's charon within 5 s.
        started = time.monotonic()
        assert user_side(agent, "mona", "revoke", ticket, str(listed[ticket]["objective_id"])) == {"kind": "closed"}
        assert wait_for(lambda: not any(s.remote_id == profile.identity for s in gateway.list_sas()), 5.0)
        assert time.monotonic() - started <= 5.0 + 5.0  # the user side's own start-up included
        assert wait_for(lambda: not joined.alive() or joined.virtual_ip() is None, 5.0), joined.log()[-2000:]
    assert not ping(netns, inside)
    assert f"qoss-agent-{ticket[:16]}" not in gateway.list_conns()

    # The next join with the same profile is refused.
    again = CharonCmd(netns, tmp_path / "again", profile, limit=30)
    with again:
        again.type_passphrase()
        assert again.wait_exit(20) not in (None, 0), again.log()[-2000:]
    assert not any(s.remote_id == profile.identity for s in gateway.list_sas())

    # The user and the administrator both see it revoked.
    mine = {d["ticket"]: d for d in user_side(agent, "mona", "list")["devices"]}
    assert (mine[ticket]["state"], mine[ticket]["reason"]) == ("revoked", "device revoked by its user")
    seen = admin(agent, token, "GET", "/v1/agent/users/mona/devices")
    assert seen["status"] == 200, seen
    (row,) = [d for d in seen["body"]["devices"] if d["ticket"] == ticket]
    assert (row["state"], row["target"], row["platform"]) == ("revoked", TARGET_ID, "android")
    assert seen["body"]["unanswered"] == {}


def test_the_administrator_revokes_a_users_device_and_its_conn_is_gone(
        lab: tuple[LabCli, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cli, up = lab
    agent = AgentLab(cli.root / "lab" / "agent")
    gateway = ViciGateway(up["target"]["vici_socket"], 10.0)
    report = enrol(cli, "olga", "apple", tmp_path / "out")
    conn = f"qoss-agent-{report['ticket'][:16]}"
    assert conn in gateway.list_conns()
    token = host_token(agent, monkeypatch, "lab-admin-2", ["agent:enroll"])
    done = admin(agent, token, "DELETE", f"/v1/agent/users/olga/devices/{report['ticket']}")
    assert done == {"status": 200, "body": {"user_id": "olga", "ticket": report["ticket"], "target": TARGET_ID,
                                            "revoked": True}}
    assert conn not in gateway.list_conns()
    again = admin(agent, token, "DELETE", f"/v1/agent/users/olga/devices/{report['ticket']}")
    assert again["status"] == 404
    mine = {d["ticket"]: d for d in user_side(agent, "olga", "list")["devices"]}
    assert (mine[report["ticket"]]["state"], mine[report["ticket"]]["reason"]) == (
        "revoked", "device revoked by an administrator")
    reader = host_token(agent, monkeypatch, "lab-reader", ["tunnels:read"])
    assert admin(agent, reader, "GET", "/v1/agent/users/olga/devices")["status"] == 403
