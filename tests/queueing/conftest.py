"""Fixtures of the queue's fault tests."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.support.pgserver import _bindir

# Rows `migrate` writes (everything else it makes is schema).
MIGRATED_ROWS = ("django_migrations", "django_content_type", "auth_permission")
# Column options the shared server's build sets on every column (`ALTER COLUMN … SET (pg_attver=…)`)
# and a stock PostgreSQL, such as the private servers', refuses: not part of what migrate made.
FOREIGN_OPTION = re.compile(r"ALTER COLUMN .* SET \(pg_attver=")


@pytest.fixture(scope="session")
def migrated_schema(django_db_setup) -> str:  # noqa: ANN001
    """The test database's schema and the rows `migrate` writes, as SQL, dumped once a session: a
    private server's database restored from it (`restore_schema`) is ready in a fraction of a
    second, where `manage.py migrate` takes several."""
    from django.db import connection

    db = connection.settings_dict
    command = [str(_bindir() / "pg_dump"), "--no-owner", "--no-privileges", "-h", db["HOST"] or "127.0.0.1",
               "-p", str(db["PORT"] or 5432), "-U", db["USER"], db["NAME"]]
    env = {**os.environ, "PGPASSWORD": db["PASSWORD"] or ""}

    def dump(*args: str) -> str:
        return subprocess.run([*command, *args], env=env, check=True, capture_output=True, text=True,  # noqa: S603
                              timeout=60).stdout

    lines = dump("--schema-only").splitlines(keepends=True)
    schema = "".join(line for line in lines if not FOREIGN_OPTION.search(line))
    return schema + dump("--data-only", *(f"--table={t}" for t in MIGRATED_ROWS))


def restore_schema(sql: str, dsn: str) -> None:
    """Load `migrated_schema` into the (empty) database `dsn`."""
    loaded = subprocess.run(  # noqa: S603
        [str(_bindir() / "psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn],
        input=sql, capture_output=True, text=True, timeout=60, check=False,
    )
    if loaded.returncode != 0:
        raise RuntimeError(f"restoring the schema into {dsn} failed: {loaded.stderr.strip()[-2000:]}")
