"""Pytest fixtures around the loopback receivers.

Use them from a test module with `from tests.support.fixtures import webhook_receiver` (and friends),
or project-wide by listing "tests.support.fixtures" in `pytest_plugins`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver, SmtpSink, TlsMaterial, make_tls_material


@pytest.fixture
def signing_secret() -> str:
    return TEST_SIGNING_SECRET


@pytest.fixture
def webhook_receiver() -> Iterator[HttpReceiver]:
    """A verifying webhook receiver on 127.0.0.1 answering 200; `configure()` changes its answers."""
    with HttpReceiver(secret=TEST_SIGNING_SECRET, max_seconds=120) as receiver:
        yield receiver


@pytest.fixture
def smtp_sink() -> Iterator[SmtpSink]:
    """An SMTP sink on 127.0.0.1 without AUTH."""
    with SmtpSink(max_seconds=120) as sink:
        yield sink


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    """A self-signed certificate for localhost / 127.0.0.1 with a server context using it."""
    return make_tls_material(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def analysed_tables(db) -> Iterator[set[str]]:  # noqa: ANN001
    """Tables a test fills and ANALYZEs in its transaction: add their names to the set. ANALYZE writes
    pg_class in place, outside the transaction, so the sizes it took would outlive the rollback and
    change the next tests' plans (a seq scan where an index scan was the right choice); emptying the
    tables and analysing them again before the rollback leaves statistics that match it."""
    from django.db import connection

    tables: set[str] = set()
    yield tables
    with connection.cursor() as cursor:
        for table in sorted(tables):
            cursor.execute(f"DELETE FROM {table}")  # noqa: S608 - names the test gave
            cursor.execute(f"ANALYZE {table}")
