"""The measurements page's plots are kept in the service's own directory and served only as the
service wrote them there: a link planted in a shared temporary folder or in the state
directory (to a file the service can read, or as a whole digest folder) is never followed,
neither to serve a file's content nor to write a plot or report into another folder."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from app.settings import Settings
from tests import REPO_ROOT
from tests.ui.conftest import sign_in

pytest.importorskip("matplotlib")  # the bench extra draws the plots

pytestmark = pytest.mark.anyio
Browser = Callable[[], httpx.AsyncClient]
MICRO = REPO_ROOT / "docs" / "measurements" / "micro.json"
PLOT = re.compile(r'<img src="/ui/measurements/plots/([0-9a-f]{16})/([a-z_]+\.png)"')
#: The shared folder any local user can write to, where a console could once have drawn plots.
SHARED = Path(tempfile.gettempdir()) / "qoss-console-plots"


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A file only the service's user may read."""
    secret = tmp_path / "shadow"
    secret.write_text(f"root:$6$only-the-service-reads-this-{secrets.token_hex(8)}\n")
    secret.chmod(0o600)
    return secret


@pytest.fixture
def shared_digest() -> Iterator[Callable[[str], Path]]:
    """``plant(digest)``: the digest's folder under the shared temporary folder, removed after."""
    planted: list[Path] = []

    def plant(digest: str) -> Path:
        SHARED.mkdir(exist_ok=True)
        planted.append(SHARED / digest)
        return SHARED / digest

    yield plant
    for folder in planted:
        if folder.is_symlink() or folder.is_file():
            folder.unlink()
        elif folder.is_dir():
            shutil.rmtree(folder)


def _measure(settings: Settings) -> str:
    """A measurement of its own (a digest no other test has) in the measurements folder; its digest."""
    data = json.loads(MICRO.read_text())
    data["note"] = secrets.token_hex(8)
    raw = json.dumps(data).encode()
    settings.measurements_dir.mkdir(parents=True, exist_ok=True)
    (settings.measurements_dir / "micro.json").write_bytes(raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


async def test_plots_are_drawn_into_the_state_directory_and_served_from_it(
        browser: Browser, token: Callable[..., str], settings: Settings) -> None:
    digest = _measure(settings)
    client = browser()
    await sign_in(client, token("viewer", ["metrics:read"]))
    page = await client.get("/ui/measurements")
    plots = PLOT.findall(page.text)
    assert sorted(name for _, name in plots) == ["kex.png", "latency_fit.png", "throughput_micro.png"], page.text
    assert {d for d, _ in plots} == {digest}
    kept = settings.state_dir / "plots" / digest
    assert _files(kept) == ["kex.png", "latency_fit.png", "plots.txt", "report.md", "throughput_micro.png"]
    assert all((p.stat().st_mode & 0o077) == 0 for p in [settings.state_dir, kept, *kept.iterdir()])
    for _, name in plots:
        image = await client.get(f"/ui/measurements/plots/{digest}/{name}")
        assert (image.status_code, image.headers["content-type"]) == (200, "image/png")
        assert image.content == (kept / name).read_bytes() and image.content.startswith(b"\x89PNG")  # noqa: PT018
    assert not (SHARED / digest).exists()
    again = await client.get("/ui/measurements")  # drawn once: the kept files are served again
    assert PLOT.findall(again.text) == plots
    assert _files(kept) == ["kex.png", "latency_fit.png", "plots.txt", "report.md", "throughput_micro.png"]


async def test_a_link_planted_in_the_shared_temporary_folder_is_not_served(
        browser: Browser, token: Callable[..., str], secret_file: Path,
        shared_digest: Callable[[str], Path]) -> None:
    digest = secrets.token_hex(8)
    folder = shared_digest(digest)
    folder.mkdir()
    (folder / "kex.png").symlink_to(secret_file)
    client = browser()
    await sign_in(client, token("viewer", ["metrics:read"]))
    answer = await client.get(f"/ui/measurements/plots/{digest}/kex.png")
    assert answer.status_code == 404
    assert "no plot kex.png" in answer.text
    assert secret_file.read_bytes() not in answer.content


async def test_a_link_planted_in_the_state_directory_is_not_served(
        browser: Browser, token: Callable[..., str], settings: Settings, secret_file: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    to_file, to_folder = secrets.token_hex(8), secrets.token_hex(8)
    plots = settings.state_dir / "plots"
    (plots / to_file).mkdir(parents=True)
    (plots / to_file / "kex.png").symlink_to(secret_file)
    elsewhere = secret_file.parent / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(secret_file, elsewhere / "kex.png")
    (plots / to_folder).symlink_to(elsewhere, target_is_directory=True)
    client = browser()
    await sign_in(client, token("viewer", ["metrics:read"]))
    for digest in (to_file, to_folder):
        answer = await client.get(f"/ui/measurements/plots/{digest}/kex.png")
        assert answer.status_code == 404, digest
        assert "no plot kex.png" in answer.text
        assert secret_file.read_bytes() not in answer.content
    refused = [r.getMessage() for r in caplog.records if r.name == "qoss.measurements"]
    assert len(refused) == 2 and all("refused" in m for m in refused), refused  # noqa: PT018


async def test_a_digest_folder_linked_elsewhere_gets_nothing_written_into_it(
        browser: Browser, token: Callable[..., str], settings: Settings, tmp_path: Path,
        shared_digest: Callable[[str], Path], caplog: pytest.LogCaptureFixture) -> None:
    digest = _measure(settings)
    shared_target, state_target = tmp_path / "etc-shared", tmp_path / "etc-state"
    shared_target.mkdir()
    state_target.mkdir()
    shared_digest(digest).symlink_to(shared_target, target_is_directory=True)
    (settings.state_dir / "plots").mkdir(parents=True)
    (settings.state_dir / "plots" / digest).symlink_to(state_target, target_is_directory=True)
    client = browser()
    await sign_in(client, token("viewer", ["metrics:read"]))
    page = await client.get("/ui/measurements")
    assert page.status_code == 200
    assert "aes128gcm16" in page.text and not PLOT.findall(page.text)  # noqa: PT018
    assert _files(shared_target) == [] and _files(state_target) == []  # noqa: PT018
    assert any("not kept" in r.getMessage() for r in caplog.records if r.name == "qoss.measurements")
    answer = await client.get(f"/ui/measurements/plots/{digest}/kex.png")
    assert answer.status_code == 404
    assert _files(shared_target) == [] and _files(state_target) == []  # noqa: PT018
