"""The private PgBouncer of the tests that run behind one: benchmarks/pgbouncer.py, which the chaos
soak (`bench/soak.py --pooled`) shares."""

from benchmarks.pgbouncer import PrivatePgBouncer, binary

__all__ = ["PrivatePgBouncer", "binary"]
