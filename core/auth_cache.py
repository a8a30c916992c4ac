"""Verified API keys cached in each web process, so authentication costs no query per request.

A key is looked up (one query) the first time a process sees it and then kept for `TTL` seconds.
Revocation reaches every process within a second: `ApiKey.revoke()` (which
`core.services.revoke_api_key` calls) and every save or delete of a key or tenant drop the entry
here and, after commit, `NOTIFY omnipost_auth` with the key's prefix or the tenant's id; each web
process LISTENs on a dedicated autocommit connection (one daemon thread, started on first use in
each process, so after gunicorn's fork) and drops what the notification names. While that listener
is not connected (starting, reconnecting after an error, behind a pooler without a direct URL, or
OMNIPOST_AUTH_LISTEN off), entries live `FALLBACK_TTL` (1 s) only, so a missed notification still
cannot outlive a second; on every (re)connect the whole cache is dropped, since notifications sent
meanwhile were missed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import connections, transaction

from core import pooling

if TYPE_CHECKING:
    from core.models import ApiKey

logger = logging.getLogger("omnipost.auth_cache")

CHANNEL = "omnipost_auth"
TTL = 30.0  # seconds an entry lives while the listener is connected
FALLBACK_TTL = 1.0  # … and while it is not
MAX_ENTRIES = 100_000

clock = time.monotonic


class _Cache:
    def __init__(self) -> None:
        self._entries: dict[str, tuple[ApiKey, float]] = {}  # sha256 of the raw key → (key, expires)
        self._lock = threading.Lock()
        # Bumped by every drop: a lookup that raced a revocation (read the row, then the drop ran)
        # does not store what it read.
        self.generation = 0

    def get(self, digest: str) -> ApiKey | None:
        entry = self._entries.get(digest)
        if entry is None:
            return None
        key, expires = entry
        if clock() >= expires:
            with self._lock:
                self._entries.pop(digest, None)
            return None
        return key

    def put(self, digest: str, key: ApiKey, ttl: float, generation: int) -> None:
        with self._lock:
            if generation != self.generation:
                return
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[digest] = (key, clock() + ttl)

    def drop(self, payload: str) -> None:
        """Drop what a notification names: `key:<prefix>`, `tenant:<id>` or `*` (everything)."""
        kind, _, value = payload.partition(":")
        with self._lock:
            self.generation += 1
            if kind == "*" or kind not in ("key", "tenant"):
                self._entries.clear()
                return
            for digest, (key, _) in list(self._entries.items()):
                if (kind == "key" and key.prefix == value) or (kind == "tenant" and str(key.tenant_id) == value):
                    del self._entries[digest]

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries.clear()


cache = _Cache()


class Listener:
    """LISTEN omnipost_auth on a dedicated autocommit psycopg connection (not Django's)."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.pid = os.getpid()
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Listener:
        self._thread = threading.Thread(target=self._run, name="auth-cache-listener", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)

    def _params(self) -> dict[str, Any]:
        params = pooling.listen_params(self.using, f"omnipost-auth-listen-{socket.gethostname()}-{os.getpid()}")
        assert params is not None  # noqa: S101 - listener() starts none where LISTEN cannot work
        return params

    def _run(self) -> None:
        import psycopg

        backoff = 0.1
        while not self._stop.is_set():
            try:
                with psycopg.connect(**self._params(), connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    cache.clear()  # whatever was sent before this LISTEN was missed
                    self.connected.set()
                    backoff = 0.1
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            cache.drop(note.payload)
            except Exception as exc:  # noqa: BLE001 - reconnect after any connection failure
                self.connected.clear()
                cache.clear()
                logger.warning("auth cache LISTEN failed (%s); retrying in %.1fs", type(exc).__name__, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self.connected.clear()


_listener: Listener | None = None
_listener_lock = threading.Lock()


def listener() -> Listener | None:
    """This process's listener, started on first use (None where it cannot run)."""
    global _listener
    if not getattr(settings, "OMNIPOST_AUTH_LISTEN", True) or not pooling.can_listen("default"):
        return None  # no LISTEN here (behind a pooler without a direct URL): entries live 1 s
    current = _listener
    if current is not None and current.pid == os.getpid():
        return current
    with _listener_lock:
        if _listener is None or _listener.pid != os.getpid():  # none yet, or inherited through a fork
            _listener = Listener().start()
        return _listener


def ttl() -> float:
    current = listener()
    return TTL if current is not None and current.connected.is_set() else FALLBACK_TTL


def announce(payload: str, using: str = "default") -> None:
    """Drop `payload`'s entries here now and, after commit, in every process (NOTIFY)."""
    cache.drop(payload)

    def ring() -> None:
        cache.drop(payload)  # a request in between may have cached the old row again
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])

    transaction.on_commit(ring, using=using)


def _key_changed(sender: type, instance: ApiKey, **kwargs: Any) -> None:
    if not kwargs.get("raw") and instance.prefix:
        announce(f"key:{instance.prefix}", kwargs.get("using") or "default")


def _tenant_changed(sender: type, instance: Any, **kwargs: Any) -> None:
    if not kwargs.get("raw"):
        announce(f"tenant:{instance.pk}", kwargs.get("using") or "default")


def connect_signals() -> None:
    """Any save or delete of a key or tenant (admin, ORM, commands) drops what was cached of it."""
    from django.db.models.signals import post_delete, post_save

    from core.models import ApiKey, Tenant

    for signal in (post_save, post_delete):
        signal.connect(_key_changed, sender=ApiKey, dispatch_uid=f"auth_cache.key.{signal is post_save}")
        signal.connect(_tenant_changed, sender=Tenant, dispatch_uid=f"auth_cache.tenant.{signal is post_save}")
