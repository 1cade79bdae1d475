"""Alembic migrations, packaged so an installed detlab can upgrade its own database."""

from __future__ import annotations

from pathlib import Path

from alembic.config import Config


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config pointing at these migrations; the URL defaults to the settings' database."""
    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.set_main_option("file_template", "%%(year)d_%%(month).2d_%%(day).2d_%%(rev)s_%%(slug)s")
    if url:
        config.set_main_option("sqlalchemy.url", url)
    return config
