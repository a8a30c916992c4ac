"""Shared fixtures: two tenants and an outsider, API clients for each, and database plumbing."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from collections.abc import Iterator

import pytest
from django.db import connection
from rest_framework.test import APIClient

from core.models import ApiKey, Tenant
from tests.support.workers import reap_stray_workers

pytest_plugins = ["tests.support.fixtures", "tests.support.setups"]


def pytest_configure(config: pytest.Config) -> None:
    from tests.support import fast_flush

    fast_flush.install()


# Creating and migrating a worker's test database has a limit of its own: the first test that needs
# it would otherwise pay for it out of its own timeout (pytest-timeout's alarm covers fixtures), and
# on a loaded machine the migrations alone can take longer than a short test's whole limit.
DATABASE_SETUP_SECONDS = 600
_suspended_alarm: list[float] = []


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):  # noqa: ANN001, ANN201
    """Runs just before the test database is created: the test's alarm gives way to the setup's."""
    if threading.current_thread() is threading.main_thread():
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        if remaining > 0:
            _suspended_alarm.append(remaining)
            signal.setitimer(signal.ITIMER_REAL, DATABASE_SETUP_SECONDS)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):  # noqa: ANN001, ANN201
    """Let Django's flush TRUNCATE the append-only audit table, on the throwaway test database only;
    then give the test that asked for the database the rest of its own time limit back."""
    if _suspended_alarm:
        signal.setitimer(signal.ITIMER_REAL, _suspended_alarm.pop())
    with django_db_blocker.unblock():
        name = connection.settings_dict["NAME"]
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" SET omnipost.allow_audit_truncate = on')
            cursor.execute("SET omnipost.allow_audit_truncate = on")
    yield
    from queueing import ringer

    ringer.close_all()  # the doorbells' connections, before the test database is dropped


@pytest.fixture
def tenant_a(db) -> Tenant:  # noqa: ANN001
    return Tenant.objects.create(name="tenant-a")


@pytest.fixture
def tenant_b(db) -> Tenant:  # noqa: ANN001
    return Tenant.objects.create(name="tenant-b")


@pytest.fixture
def key_a(tenant_a: Tenant) -> str:
    return ApiKey.issue(tenant_a, name="a")[1]


@pytest.fixture
def key_b(tenant_b: Tenant) -> str:
    return ApiKey.issue(tenant_b, name="b")[1]


def client_for(raw_key: str | None) -> APIClient:
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


@pytest.fixture
def api_a(key_a: str) -> APIClient:
    return client_for(key_a)


@pytest.fixture
def api_b(key_b: str) -> APIClient:
    return client_for(key_b)


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()


@pytest.fixture
def subprocess_env() -> Iterator[dict[str, str]]:
    """Environment for real worker processes: same settings and the test database.

    Every test that starts a dispatcher or scheduler takes this fixture, so its teardown (before the
    database's) kills any such worker the test left running, e.g. because it failed before stopping
    it: left alive, it would claim the next tests' rows. A passing test that leaves one gets a warning."""
    from django.conf import settings

    from core.db_url import database_url

    db = settings.DATABASES["default"]
    url = database_url(db)
    yield {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "omnipost_site.settings_test",
        "DATABASE_URL": url,
        "PYTHONUNBUFFERED": "1",
    }
    strays = reap_stray_workers()
    if strays:
        warnings.warn(f"killed {len(strays)} worker process(es) left running by this test: {strays}", stacklevel=1)
