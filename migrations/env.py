from __future__ import annotations

from alembic import context

from detlab.backend.db import make_engine
from detlab.backend.models import Base
from detlab.core.settings import get_settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url()


def run() -> None:
    engine = make_engine(url)
    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # A batch migration copies a table and drops the original: with foreign keys on, dropping `jobs`
            # would cascade to every run, tag and key of every job. Off for the migration (outside any
            # transaction, where SQLite honours the pragma); the engine is disposed of afterwards.
            connection.connection.dbapi_connection.execute("PRAGMA foreign_keys=OFF")  # type: ignore[union-attr]
        context.configure(connection=connection, target_metadata=Base.metadata,
                          render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


run()
