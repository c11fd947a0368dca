"""Single sign-on on the phone in the agent lab, end to end: the lab's Host signs in with the suite's
OpenID provider (zitadel/oidc's example OP, run in Host's namespace, where Host reaches it as
``localhost``, and relayed to this machine's ``localhost`` for the phone's browser); a user of the
enrolling group signs in on the phone (headless chromium, 390 by 844, touch), gets the ``.sswan``
and the passphrase, and that profile joins with Debian's stock ``charon-cmd`` in ``PREFIX-device``
(a virtual IP, a ping to Target's protected network). A user outside the group is refused with a
page that says so."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from app.lab.agent import AgentLab
from tests.fixtures.oidc_provider import OidcUser
from tests.fixtures.secrets import keep_log, register
from tests.fixtures.served import free_port
from tests.fixtures.stock_client import CharonCmd
from tests.integration.agent.test_device_join import ping, wait_for
from tests.ui.browser.conftest import BOB, CAROL, CLIENT_SECRET, NewContext
from tests.ui.browser.test_join_sign_in import phone_sign_in
from tests.ui.browser.test_phone_join import _stock, downloads, passphrase

pytestmark = pytest.mark.charon

MAPPING = {"groups": {"staff": ["agent:enroll-device"]}}


@contextmanager
def _relay(agent: AgentLab, netns: str, port: int, to: str) -> Iterator[None]:
    """``127.0.0.1:port`` here relayed to ``to`` inside ``netns`` (:mod:`app.lab.relay`), until the block ends."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-m", "app.lab.relay", "--fd",
                                 str(listener.fileno()), "--to", to], env=agent.env(),
                                pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextmanager
def _provider_in(netns: str, binary: Path, port: int, users: list[OidcUser], workdir: Path) -> Iterator[str]:
    """The test provider listening on ``127.0.0.1:port`` inside ``netns``; its issuer."""
    issuer = f"http://localhost:{port}/"
    config = workdir / "oidc-op.json"
    config.write_text(json.dumps({
        "issuer": issuer, "listen": f"127.0.0.1:{port}",
        "client": {"id": "qoss-console", "secret": CLIENT_SECRET,
                   "redirect_uris": ["http://127.0.0.1:*/ui/oidc/callback"],
                   "post_logout_redirect_uris": ["http://127.0.0.1:*/ui/login"]},
        "users": [{"id": u.id, "username": u.username, "password": u.password, "email": u.email,
                   "email_verified": True, "groups": list(u.groups)} for u in users]}))
    log = workdir / "oidc-op.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["ip", "netns", "exec", netns, str(binary), str(config)], stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield issuer
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        keep_log(log, "join-sign-in-lab-oidc-op.log")


def test_a_phone_signs_in_gets_a_profile_and_it_joins_with_charon_cmd(
        provider_binary: Path, new_context: NewContext, tmp_path: Path) -> None:
    register(CLIENT_SECRET)
    web, idp = free_port(), free_port()
    root = Path(tempfile.mkdtemp(prefix="qoss-sso-", dir="/tmp"))
    agent = AgentLab(root / "agent", prefix=f"qs{os.getpid() % 100000}", server_env={
        "QOSS_OIDC_ISSUER": f"http://localhost:{idp}/", "QOSS_OIDC_CLIENT_ID": "qoss-console",
        "QOSS_OIDC_CLIENT_SECRET": CLIENT_SECRET, "QOSS_OIDC_PROVIDER_NAME": "Test IdP",
        "QOSS_OIDC_SCOPES_BY_CLAIM": json.dumps(MAPPING),
        "QOSS_OIDC_REDIRECT_URL": f"http://127.0.0.1:{web}/ui/oidc/callback"})
    try:
        with ExitStack() as stack:
            up = agent.up()
            host = agent.host(agent.host_server)
            stack.enter_context(_provider_in(host.netns, provider_binary, idp, [BOB, CAROL], tmp_path))
            stack.enter_context(_relay(agent, host.netns, idp, f"127.0.0.1:{idp}"))
            stack.enter_context(_relay(agent, host.netns, web, f"{host.gateway_ike_address}:{agent.port}"))
            base = f"http://127.0.0.1:{web}"
            assert wait_for(lambda: _answers(f"http://localhost:{idp}/.well-known/openid-configuration"), 20, 0.2)

            page, _ = phone_sign_in(new_context, base, BOB)
            expect(page.locator("#join-status")).to_contain_text("Ready", timeout=30_000)
            page.locator("#join-button").tap()
            secret = passphrase(page)
            ((name, (data, _)),) = downloads(page).items()
            assert name.endswith(".sswan")

            netns, target = up["device"]["netns"], up["target"]
            inside = target["protected"][0].split("/")[0]
            stock = _stock(json.loads(data), secret, tmp_path / "device")
            with CharonCmd(netns, tmp_path / "joined", stock, limit=60) as joined:
                joined.type_passphrase()
                assert wait_for(lambda: ping(netns, inside), 20, 0.2), joined.log()[-3000:]
                assert joined.virtual_ip() is not None

            outsider, _ = phone_sign_in(new_context, base, CAROL)
            expect(outsider.locator("#refused-title")).to_have_text("Not allowed to enrol devices")
    finally:
        for log in (root / "agent" / "host.log", root / "agent" / "target.log"):
            if log.exists():
                keep_log(log, f"join-sign-in-lab-{log.name}")
        agent.down()
        shutil.rmtree(root, ignore_errors=True)
    assert not list(Path("/run/netns").glob(f"qs{os.getpid() % 100000}-*"))


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2, trust_env=False).is_success
    except httpx.TransportError:
        return False
