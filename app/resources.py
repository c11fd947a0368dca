"""Files that travel inside the package: the shipped rating tables and policies, and the
database migrations. Found with :mod:`importlib.resources`, so an installed wheel finds them
wherever it is installed and whatever the working directory."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["MIGRATIONS_DIR", "SHIPPED_POLICIES_DIR", "SHIPPED_RATINGS_DIR"]


def _package_dir(*parts: str) -> Path:
    # A wheel is installed unpacked, so its resources are plain directories on disk
    # (Alembic and the YAML loader both want a real path).
    return Path(str(files("app").joinpath(*parts)))


#: The rating tables qoss ships (``esaf-2006``, ``standards-2026``).
SHIPPED_RATINGS_DIR = _package_dir("shipped", "ratings")
#: The policies qoss ships.
SHIPPED_POLICIES_DIR = _package_dir("shipped", "policies")
#: The Alembic migrations: the only way the schema is made.
MIGRATIONS_DIR = _package_dir("migrations")
