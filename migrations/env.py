"""Alembic environment for qoss.

The database URL comes from the caller (``app.adapters.db.migrate`` puts it in
``config.attributes["url"]``), else from ``QOSS_DATABASE_URL``, else the embedded
default ``sqlite:///./var/qoss.db``. It is never read from ``alembic.ini``.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool

config = context.config
#: The models' metadata, for ``alembic revision --autogenerate`` only: the migrations themselves
#: never import the application (each revision is a fixed step, whatever the code becomes).
target_metadata = None
if getattr(config.cmd_opts, "autogenerate", False):
    from app.adapters.db.models import Base

    target_metadata = Base.metadata

if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)  # the `alembic` command line only


def _url() -> str:
    url = config.attributes.get("url") or os.environ.get("QOSS_DATABASE_URL") or "sqlite:///./var/qoss.db"
    return str(url)


def run_migrations_offline() -> None:
    """Emit the SQL instead of running it (``alembic upgrade --sql``)."""
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on a connection of their own."""
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context.configure(
                connection=connection,
                target_metadata=target_metadata,
                render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
            )
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
