"""The database adapter: SQLAlchemy 2.0 models, engine, repositories, Alembic migrations.

Import from the modules: ``engine`` (make_engine, make_session_factory), ``repositories``,
``migrate`` (upgrade, current), ``models``.
"""

__all__: list[str] = []
