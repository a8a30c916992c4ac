"""The operations tests use the foundation tests' tenant rows."""

from tests.core.conftest import rows_a, rows_b, secrets_everywhere  # noqa: F401 - fixtures
