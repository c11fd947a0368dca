"""Run ``qoss`` as a real process, as a user does (``python -m app.cli``: this checkout's code)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import REPO_ROOT

__all__ = ["qoss"]


def qoss(*args: str, db: Path | None = None, stdin: str | None = None, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``qoss ARGS``; ``db``: the SQLite file ``QOSS_DATABASE_URL`` names (none: the caller's environment's)."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=REPO_ROOT, input=stdin, capture_output=True, text=True,
        timeout=timeout, check=False,
        env={**os.environ, **({"QOSS_DATABASE_URL": f"sqlite:///{db}"} if db is not None else {}), **(env or {})},
    )
