"""The files and standard input the ``qoss`` commands read: at most a document's cap
(app.adapters.files.MAX_DOCUMENT_BYTES), regular files only, every refusal one clear error
and no traceback.

Each command runs as a real process whose address space is capped at 1 GiB, so a command
that reads a whole endless input dies of it rather than taking the machine's memory.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from app.adapters.files import MAX_DOCUMENT_BYTES
from tests import REPO_ROOT
from tests.cli.run import qoss

_ADDRESS_SPACE = 1 << 30


def _small_address_space() -> None:  # runs in the child, before it execs Python
    resource.setrlimit(resource.RLIMIT_AS, (_ADDRESS_SPACE, _ADDRESS_SPACE))


def _qoss_capped(*args: str, db: Path, stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    """``qoss ARGS`` with at most 1 GiB of address space and 60 s to answer."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=REPO_ROOT,
        stdin=stdin if stdin is not None else subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
        check=False, preexec_fn=_small_address_space,
        env={**os.environ, "QOSS_DATABASE_URL": f"sqlite:///{db}"},
    )


def _refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The detail of the one JSON error a refused command prints (exit status 2, no traceback)."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    error = json.loads(done.stderr)
    assert error["error"] == "InvalidInput"
    return str(error["detail"])


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite database with the shipped tables and policies."""
    path = tmp_path_factory.mktemp("inputs") / "q.db"
    done = qoss("db", "upgrade", db=path)
    assert done.returncode == 0, done.stderr
    return path


def test_ratings_import_of_dev_zero_is_refused_at_once(db: Path) -> None:
    detail = _refusal(_qoss_capped("ratings", "import", "/dev/zero", db=db))
    assert detail == "/dev/zero: not a regular file"


@pytest.mark.parametrize("args", [("negotiate", "/dev/zero"), ("policies", "import", "/dev/zero")],
                         ids=["negotiate", "policies-import"])
def test_other_document_commands_refuse_dev_zero(db: Path, args: tuple[str, ...]) -> None:
    assert _refusal(_qoss_capped(*args, db=db)) == "/dev/zero: not a regular file"


def test_tunnel_up_refuses_a_psk_file_that_is_dev_zero(db: Path) -> None:
    done = _qoss_capped("tunnel", "up", "left", "--peer", "10.99.0.2", "--psk-file", "/dev/zero",
                        "--remote-ts", "10.2.0.1/32", db=db)
    assert _refusal(done) == "/dev/zero: not a regular file"


def test_a_file_larger_than_the_cap_is_refused_before_it_is_read(db: Path, tmp_path: Path) -> None:
    huge = tmp_path / "huge.csv"
    with huge.open("wb") as fh:  # 4 GiB that take no room on disk
        fh.truncate(4 << 30)
    detail = _refusal(_qoss_capped("ratings", "import", str(huge), "--name", "huge", db=db))
    assert detail == f"{huge}: larger than {MAX_DOCUMENT_BYTES} bytes"


def test_a_fifo_is_refused_without_waiting_for_a_writer(db: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "table.yaml"
    os.mkfifo(fifo)  # no writer ever comes: a reader that opens it waits until the timeout
    assert _refusal(_qoss_capped("ratings", "import", str(fifo), db=db)) == f"{fifo}: not a regular file"


def test_endless_standard_input_is_refused_after_the_cap(db: Path) -> None:
    with open("/dev/zero", "rb") as zero:
        done = _qoss_capped("ratings", "import", "-", db=db, stdin=zero.fileno())
    assert _refusal(done) == f"standard input: larger than {MAX_DOCUMENT_BYTES} bytes"


def test_standard_input_that_is_not_utf8_is_refused(db: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "app.cli", "ratings", "import", "-"], cwd=REPO_ROOT,
                          input=b"name: caf\xe9\n", capture_output=True, timeout=60, check=False,
                          env={**os.environ, "QOSS_DATABASE_URL": f"sqlite:///{db}"})
    text = subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())
    assert _refusal(text) == "standard input: not UTF-8 text (byte 9)"


def test_a_missing_file_is_one_clear_error(db: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    done = _qoss_capped("ratings", "import", str(missing), db=db)
    assert _refusal(done) == f"{missing}: no such file"
    assert len(done.stderr.splitlines()) == 1


def test_a_directory_is_refused(db: Path, tmp_path: Path) -> None:
    assert _refusal(_qoss_capped("policies", "import", str(tmp_path), db=db)) == f"{tmp_path}: not a regular file"


def test_bench_report_refuses_a_micro_document_that_is_dev_zero(tmp_path: Path, db: Path) -> None:
    done = _qoss_capped("bench", "report", "--micro", "/dev/zero", "--out", str(tmp_path / "report"), db=db)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    assert "/dev/zero: not a regular file" in done.stderr
    assert not (tmp_path / "report").exists() or not any((tmp_path / "report").iterdir())


def test_the_bench_lab_refuses_a_prior_larger_than_the_document_cap(tmp_path: Path) -> None:
    from app.lab.bench import read_micro_prior

    big = tmp_path / "micro.json"
    with big.open("wb") as fh:
        fh.truncate(4 << 30)  # 4 GiB, sparse: never read
    with pytest.raises(ValueError, match=r"cannot read .*: InvalidInput"):  # refused by size, not parsed
        read_micro_prior(big, "this machine")


def test_version_is_printed() -> None:
    from app import __version__

    done = qoss("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"qoss {__version__}")


def test_a_bad_setting_is_one_line_naming_its_variable(db: Path) -> None:
    done = qoss("agent", "users", db=db, env={"QOSS_MAX_BODY_BYTES": "abc"})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "qoss: QOSS_MAX_BODY_BYTES: Input should be a valid integer, unable to parse string as an integer "
        "(got 'abc')"]
    assert "Traceback" not in done.stderr
