"""Files that travel with qoss: the shipped rating tables (``ratings/``) and policies
(``policies/``), and the database migrations (``migrations/``).

In a checkout they stand at the top of the repository. The wheel carries them inside the
package, under ``app/_shipped/`` (the build maps them there, see ``pyproject.toml``), where
:mod:`importlib.resources` finds them wherever the wheel is installed and whatever the working
directory. Either way there is one copy of each.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["MIGRATIONS_DIR", "SHIPPED_POLICIES_DIR", "SHIPPED_RATINGS_DIR"]

_CHECKOUT = Path(__file__).resolve().parent.parent


def _shipped(name: str) -> Path:
    # A wheel is installed unpacked, so its resources are plain directories on disk
    # (Alembic and the YAML loader both want a real path).
    packaged = Path(str(files("app").joinpath("_shipped", name)))
    return packaged if packaged.is_dir() else _CHECKOUT / name


#: The rating tables qoss ships (``esaf-2006``, ``standards-2026``).
SHIPPED_RATINGS_DIR = _shipped("ratings")
#: The policies qoss ships.
SHIPPED_POLICIES_DIR = _shipped("policies")
#: The Alembic migrations: the only way the schema is made.
MIGRATIONS_DIR = _shipped("migrations")
