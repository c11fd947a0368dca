"""The qoss test suite; its layout mirrors app/."""

from pathlib import Path

#: The checkout the tests run from.
REPO_ROOT = Path(__file__).resolve().parent.parent
