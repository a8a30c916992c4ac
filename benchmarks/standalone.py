"""What a script under bench/ needs to run OmniPost's code outside `manage.py`: its own database,
created and migrated when missing, Django set up on it, and plain SQL on Django's connection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = "omnipost_site.settings_test"


def setup_django(url: str) -> None:
    """Django on the database at `url` (the test settings; log level WARNING unless set)."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    os.environ.setdefault("OMNIPOST_LOG_LEVEL", "WARNING")
    import django

    django.setup()


def create_database(url: str) -> None:
    """The database at `url`, created if missing, then migrated (`manage.py migrate`)."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": SETTINGS}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)  # noqa: S603


def sql(statement: str, params: object = None) -> list[tuple]:
    """Runs one statement on Django's connection; its rows (none for a statement that returns none)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []
