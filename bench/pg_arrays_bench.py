"""The record statement's 17 arrays for a batch of N, dumped by psycopg's Transformer: encoded by
core.pg_arrays against psycopg's own binary list dumpers (CPU µs per delivery, median of 3).

    PYTHONPATH=. .venv/bin/python bench/pg_arrays_bench.py [N]   # a PostgreSQL at 127.0.0.1, user postgres
"""
import statistics
import sys
import timeit
import uuid
from datetime import UTC, datetime

import psycopg
from psycopg.adapt import PyFormat, Transformer

from core import pg_arrays as arrays

N = int(sys.argv[1]) if len(sys.argv) > 1 else 500
conn = psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres")
arrays.register(conn.adapters)
token = uuid.uuid4()
now = datetime.now(UTC)
ids = list(range(1000, 1000 + N))
cols = dict(i8=ids, u=[token]*N, t=["delivered"]*N, f=[0.0]*N, i4=[1]*N, ts=[now]*N, msg=[""]*N, st=[200]*N)
def lists():
    return [cols["i8"], cols["u"], cols["t"], cols["f"], cols["t"], cols["i4"], cols["msg"], cols["i8"], cols["i4"],
            cols["ts"], cols["ts"], cols["t"], cols["msg"], cols["msg"], cols["msg"], cols["st"], cols["i4"]]
def ours():
    return [arrays.int8s(cols["i8"]), arrays.uuids(cols["u"]), arrays.texts(cols["t"]), arrays.float8s(cols["f"]),
            arrays.texts(cols["t"]), arrays.int4s(cols["i4"]), arrays.texts(cols["msg"]), arrays.int8s(cols["i8"]),
            arrays.int4s(cols["i4"]), arrays.timestamptzs(cols["ts"]), arrays.timestamptzs(cols["ts"]),
            arrays.texts(cols["t"]), arrays.texts(cols["msg"]), arrays.texts(cols["msg"]), arrays.texts(cols["msg"]),
            arrays.int4s(cols["st"]), arrays.int4s(cols["i4"])]
fmts = [PyFormat.BINARY] * 17
def dump(build):
    tx = Transformer(conn)
    return lambda: tx.dump_sequence(build(), fmts)
for name, fn in [("core.pg_arrays", dump(ours)), ("psycopg dumpers", dump(lists))]:
    runs = [min(timeit.repeat(fn, number=50, repeat=5)) / 50 / N * 1e6 for _ in range(3)]
    print(f"{name:16s} {statistics.median(runs):.2f} µs per delivery (batch {N}); runs {[f'{r:.2f}' for r in runs]}")
