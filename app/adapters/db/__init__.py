"""The database adapter: SQLAlchemy 2.0 models, engine, repositories, Alembic migrations.

Import from the modules: ``engine`` (make_engine, make_session_factory), ``repositories``,
``migrate`` (upgrade, current), ``models``, ``agent_rows`` (the tunnel agent's tables). Importing
the package registers every table on ``models.Base.metadata``.
"""

from app.adapters.db import agent_rows as _agent_rows  # noqa: F401 - registers the agent tables

__all__: list[str] = []
