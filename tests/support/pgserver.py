"""The private PostgreSQL server of the tests that stop, restart or abuse one: benchmarks/pgserver.py,
which bench/per_delivery.py shares."""

from benchmarks.pgserver import PrivatePostgres, _bindir, free_port

__all__ = ["PrivatePostgres", "_bindir", "free_port"]
