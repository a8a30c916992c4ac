"""`DATABASE_URL` → Django's DATABASES entry, including libpq's multi-host form.

A URL may name several hosts in its address part, as libpq's own URIs do
(`postgres://user@h1:5432,h2:5432/db?target_session_attrs=read-write`): libpq tries them in order
and, with `target_session_attrs=read-write`, settles on the one that accepts writes, so every
process follows a failover to the promoted standby on its next connection. Django and psycopg pass
comma lists through (`HOST="h1,h2"`, `PORT="5432,5432"`). django-environ handles one host; given
several it keeps IPv6 brackets and loses ports (`h1:5433,h2` → `PORT=5433` for both), so those
URLs are taken apart here and the rest (user, password, name, query options) is still read by
django-environ, from the same URL with one placeholder host.

`database_url(settings_dict)` writes an entry back as a URL (for processes started with an
environment of their own: the benchmarks' dispatchers, the tests' workers), a unix-socket directory
(the embedded server's) as libpq's `?host=/dir` query parameter.

PostgreSQL is the only database: a URL of any other scheme stops start-up, in one line.

`turn_jit_off(options)`: direct connections start with `-c jit=off` (see there).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlencode

import environ
from django.core.exceptions import ImproperlyConfigured

_POSTGRES_SCHEMES = frozenset({"postgres", "postgresql", "pgsql", "postgis"})
_URL = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*)://(?P<netloc>[^/?#]*)(?P<tail>.*)", re.IGNORECASE | re.DOTALL)
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.%a-zA-Z]+)\]|(?P<name>[^:\[\]]+))(?::(?P<port>[^:]*))?")
_PLACEHOLDER = "omnipost-multi-host"


def _masked(url: str) -> str:
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def parse_database_url(url: str, *, name: str = "DATABASE_URL") -> dict[str, Any]:
    """The DATABASES entry a URL describes; ImproperlyConfigured (naming `name`, password masked)
    for a URL that is not PostgreSQL, or a multi-host one with an empty host or a bad port."""
    match = _URL.fullmatch(url.strip())
    if match is None or match["scheme"].lower() not in _POSTGRES_SCHEMES:
        raise ImproperlyConfigured(f"{name}: PostgreSQL is the only database, and {_masked(url)} is not a "
                                   "postgres:// URL (unset, the embedded server is used)")  # fmt: skip
    if "," not in match["netloc"]:
        return environ.Env.db_url_config(url)
    netloc, tail = match["netloc"], match["tail"]
    userinfo, at, hostlist = netloc.rpartition("@")
    hosts, ports = [], []
    for part in hostlist.split(","):
        host = _HOST.fullmatch(part)
        if host is None:
            raise ImproperlyConfigured(f"{name}: empty or malformed host {part!r} in {_masked(url)}")
        port = host["port"] or ""
        if port and not (port.isdigit() and 0 < int(port) < 65536):
            raise ImproperlyConfigured(f"{name}: port {port!r} of host {part!r} is not a port number")
        hosts.append(host["v6"] or host["name"])
        ports.append(port)
    config = environ.Env.db_url_config(f"{match['scheme']}://{userinfo}{at}{_PLACEHOLDER}{tail}")
    config["HOST"] = ",".join(hosts)
    # libpq: one port for all hosts, or one per host where an empty entry means the default.
    config["PORT"] = ",".join(ports) if any(ports) else ""
    return config


def database_url(db: dict[str, Any]) -> str:
    """A postgres URL for a PostgreSQL DATABASES entry (several hosts included), with its string
    and number OPTIONS (libpq parameters such as target_session_attrs) as query parameters."""
    options = {  # each process names itself (OMNIPOST_APP_NAME), so application_name stays out
        k: v for k, v in (db.get("OPTIONS") or {}).items()
        if k != "application_name" and isinstance(v, str | int) and not isinstance(v, bool)
    }
    # and turns JIT off itself where its connections are direct (a URL may be a pooler's)
    if (startup := str(options.pop("options", "")).replace(JIT_OFF, "").strip()):
        options["options"] = startup
    if str(db.get("HOST") or "").startswith("/"):  # a unix-socket directory: libpq's host= parameter
        options = {"host": db["HOST"], **({"port": db["PORT"]} if db.get("PORT") else {}), **options}
        db = {**db, "HOST": "", "PORT": ""}
    hosts = str(db.get("HOST") or "").split(",")
    ports = str(db.get("PORT") or "").split(",")
    ports = ports * len(hosts) if len(ports) == 1 else ports
    netloc = ",".join(
        (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
        for host, port in zip(hosts, ports, strict=False)
    )
    user = quote(str(db.get("USER") or ""), safe="")
    password = quote(str(db.get("PASSWORD") or ""), safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    query = f"?{urlencode(options)}" if options else ""
    return f"postgres://{auth}{netloc}/{quote(str(db.get('NAME') or ''), safe='')}{query}"


# PostgreSQL compiles a statement with LLVM whenever its estimated cost passes jit_above_cost
# (100,000), at every execution: a prepared statement keeps its plan, not the compiled code. Our
# statements are short ones, whose estimates pass that line only when the statistics they are planned
# on are off (a queue analyzed while every item is leased); a dispatcher's claim then compiles 102
# functions at each call, 50–140 ms instead of 1–3 (auto_explain during bench/fanout_bench.py). JIT
# pays off for long analytical queries, which OmniPost does not run.
JIT_OFF = "-c jit=off"


def turn_jit_off(options: dict[str, Any]) -> None:
    """Add `-c jit=off` to libpq's startup `options` in a connection's OPTIONS (once). Not through
    PgBouncer, which refuses startup options (there: `ALTER DATABASE … SET jit = off`)."""
    current = str(options.get("options", ""))
    if "jit=" not in current:
        options["options"] = f"{current} {JIT_OFF}".strip()
