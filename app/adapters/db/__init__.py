"""The database adapter: SQLAlchemy 2.0 models, engine, repositories, Alembic migrations."""
