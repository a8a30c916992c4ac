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
