"""Settings for the test suite: PostgreSQL, DEBUG, a fixed throwaway key, private destinations on."""

from __future__ import annotations

import os

os.environ.setdefault("DEBUG", "true")
os.environ.setdefault("DATABASE_URL", "postgres://postgres:postgres@127.0.0.1:5432/omnipost")
os.environ.setdefault("OMNIPOST_ALLOW_PRIVATE_DESTINATIONS", "true")
# A fixed test-only key so subprocess workers started by tests decrypt what the test wrote.
os.environ.setdefault("OMNIPOST_ENCRYPTION_KEYS", "x8ROxZ3gJ9D2CFFGZuxGvUQoLhPn7cVeLBcLd2R9s0c=")
os.environ.setdefault("CONN_MAX_AGE", "0")
# No LISTEN thread in the test process (its connection would outlive the test database); the
# auth cache then keeps entries 1 s. Tests of the listener start server processes with it on.
os.environ.setdefault("OMNIPOST_AUTH_LISTEN", "false")

from omnipost_site.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
