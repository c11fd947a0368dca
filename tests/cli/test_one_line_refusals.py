"""What the command line cannot use is one line on stderr and exit status 2, never a traceback:
a CA file that is not there or holds no certificate, an agent config ``qoss serve`` cannot start
with, a configuration file named on purpose that does not exist, a URL that answers HTML (a
page, not qoss's API). A token is never sent to a service nobody named: with no URL from a
flag, ``QOSS_URL`` or a context, the command stops before connecting anywhere, proved by a
listener standing at the default address that records every connection."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner, Result

from app.cli import client, events
from app.cli.main import app
from tests.cli.run import qoss
from tests.cli.service import served
from tests.fixtures.agent_roles import agent_server_config
from tests.fixtures.served import free_port

_TOKEN = "qoss_0123456789ab_" + "s" * 43  # of the token format; never valid anywhere


@dataclass
class Recorder:
    """A listener on a loopback port that accepts and records every connection, answering none."""

    url: str
    sock: socket.socket
    seen: list[str] = field(default_factory=list)


@pytest.fixture
def default_address(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """The CLI's default service address pointed at a :class:`Recorder`."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    recorder = Recorder(f"http://127.0.0.1:{sock.getsockname()[1]}", sock)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            recorder.seen.append(f"{peer[0]}:{peer[1]}")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    monkeypatch.setattr(client, "DEFAULT_URL", recorder.url)
    try:
        yield recorder
    finally:
        stop.set()
        thread.join(timeout=5)
        sock.close()


class _NoReconnect:
    """In place of ``qoss events``' clock: its first wait to reconnect ends the command."""

    @staticmethod
    def sleep(seconds: float) -> None:
        raise RuntimeError(f"qoss events would reconnect in {seconds:g} s")


@pytest.fixture(autouse=True)
def _events_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``qoss events`` that connected where it should not ends at once instead of retrying."""
    monkeypatch.setattr(events, "time", _NoReconnect())


def _cli(tmp_path: Path, *args: str, **env: str | None) -> Result:
    """``qoss ARGS`` in-process with a clean client environment (config under ``tmp_path``)."""
    environment: dict[str, str | None] = {"QOSS_URL": None, "QOSS_TOKEN": None, "QOSS_CONTEXT": None,
                                          "QOSS_CONFIG": None, "QOSS_CA_FILE": None,
                                          "XDG_CONFIG_HOME": str(tmp_path / "config"), **env}
    return CliRunner().invoke(app, list(args), env=environment)


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("args", [("ratings", "list"), ("policies", "edit", "voip", "--integrity", "6"),
                                  ("token", "create", "--name", "ops", "--scopes", "admin"),
                                  ("events", "--count", "1"), ("events", "--token", _TOKEN, "--count", "1")],
                         ids=["ratings-list", "policies-edit", "token-create", "events", "events-token-flag"])
def test_a_token_with_no_service_named_is_sent_nowhere(tmp_path: Path, default_address: Recorder,
                                                       args: tuple[str, ...]) -> None:
    token = None if "--token" in args else _TOKEN
    out = _cli(tmp_path, *args, QOSS_TOKEN=token)
    assert out.exit_code == 2
    line = _one_line(out.stderr)
    assert "no service is named" in line or "never sent to a default address" in line
    assert _TOKEN not in out.stderr + out.stdout
    assert default_address.seen == []


def test_a_contexts_token_with_no_url_is_sent_nowhere(tmp_path: Path, default_address: Recorder) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"current-context: odd\ncontexts:\n  odd: {{token: {_TOKEN}}}\n")
    config.chmod(0o600)
    out = _cli(tmp_path, "ratings", "list", QOSS_CONFIG=str(config))
    assert out.exit_code == 2
    assert "context odd's token" in _one_line(out.stderr)
    assert default_address.seen == []


def test_with_no_token_the_default_address_is_still_asked(tmp_path: Path, default_address: Recorder) -> None:
    """The recorder's own check: an anonymous read goes to the default address, and it sees it."""
    out = _cli(tmp_path, "ratings", "list")
    assert out.exit_code == 2  # the recorder answers nothing
    _one_line(out.stderr)
    assert len(default_address.seen) >= 1


def test_a_configuration_file_named_but_missing_is_an_error(tmp_path: Path, default_address: Recorder) -> None:
    missing = tmp_path / "nope.yaml"
    for token in (None, _TOKEN):
        out = _cli(tmp_path, "ratings", "list", QOSS_CONFIG=str(missing), QOSS_TOKEN=token)
        assert out.exit_code == 2
        line = _one_line(out.stderr)
        assert "QOSS_CONFIG" in line
        assert str(missing) in line
    assert default_address.seen == []
    made = _cli(tmp_path, "context", "set", "lab", "--url", "http://127.0.0.1:9", QOSS_CONFIG=str(missing))
    assert made.exit_code == 0, made.stderr  # a context set makes the file it names
    assert missing.exists()


def test_a_ca_file_that_cannot_be_used_is_one_line_naming_it(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for path, why in (("/nope.pem", "does not exist"), (str(junk), "holds no PEM CA certificate")):
        done = qoss("ratings", "list", env={"QOSS_CA_FILE": path, "QOSS_URL": "https://127.0.0.1:9",
                                            "QOSS_TOKEN": "", "QOSS_CONFIG": "", "XDG_CONFIG_HOME": str(tmp_path)})
        assert done.returncode == 2
        assert _one_line(done.stderr) == f"qoss: QOSS_CA_FILE names {path}, which {why}"


def test_a_contexts_ca_file_that_is_not_there_names_the_context(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("current-context: far\ncontexts:\n  far: {url: 'https://127.0.0.1:9', ca-file: /nope.pem}\n")
    out = _cli(tmp_path, "ratings", "list", QOSS_CONFIG=str(config))
    assert out.exit_code == 2
    assert _one_line(out.stderr) == "qoss: context far's ca-file names /nope.pem, which does not exist"


@pytest.mark.parametrize(("content", "why"), [
    ("id: [t1\nkey_dir: keys\n", "is not YAML (line 2, column 8)"),
    ("id: t1\nkey_dir: keys\n", "configure the host role, the target role, or both"),
    (None, "no such file or directory"),
], ids=["not-yaml", "no-role", "no-file"])
def test_serve_with_an_agent_config_it_cannot_use_is_one_line(tmp_path: Path, content: str | None,
                                                              why: str) -> None:
    config = tmp_path / "agent.yaml"
    if content is not None:
        config.write_text(content)
    database = tmp_path / "q.db"
    done = qoss("serve", "--port", str(free_port()), db=database, timeout=60,
                env={"QOSS_AGENT_CONFIG": str(config), "QOSS_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line.startswith("qoss: QOSS_AGENT_CONFIG")
    assert str(config) in line
    assert why in line
    assert not database.exists()  # refused before the database is made


def test_serve_with_a_good_agent_config_still_starts(tmp_path: Path) -> None:
    config, _ = agent_server_config(tmp_path / "agent")
    with served(tmp_path, QOSS_AGENT_CONFIG=str(config)) as running:
        assert httpx.get(f"{running.base}/healthz").status_code == 200


class _Page(http.server.BaseHTTPRequestHandler):
    """A web server that is not qoss: an HTML page at every path, or a redirect at /moved/."""

    def do_GET(self) -> None:
        if self.path.startswith("/moved/"):
            self.send_response(302)
            self.send_header("Location", "/login")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"<!doctype html><html><head><title>Sign in</title></head><body>" + b"x" * 4000 + b"</body></html>"
        self.send_response(200 if "/ok/" in self.path else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web_page() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("command", [("ratings", "list"), ("events", "--count", "1")], ids=["ratings", "events"])
@pytest.mark.parametrize("where", ["/ui", "/ok/ui", "/moved/ui"])
def test_a_url_that_answers_html_is_not_qoss_api(tmp_path: Path, web_page: str, where: str,
                                                 command: tuple[str, ...]) -> None:
    out = _cli(tmp_path, *command, QOSS_URL=web_page + where, QOSS_TOKEN=_TOKEN)
    assert out.exit_code == 2
    line = _one_line(out.stderr)
    assert f"{web_page}{where} (named by QOSS_URL) is not qoss's API" in line
    assert "<" not in line
    assert out.stdout == ""
