#!/usr/bin/env bash
# `make pgbouncer`: a PgBouncer in transaction pooling mode in front of DATABASE_URL's server, for
# local use (the tests start their own, tests/support/pgbouncer.py). Its configuration, log and
# socket live in var/pgbouncer/; it runs in the foreground until Ctrl-C. Listens on
# 127.0.0.1:${PGBOUNCER_PORT:-6432}; every database name goes through to the server.
set -euo pipefail

url="${DATABASE_URL:?DATABASE_URL must be set to the PostgreSQL server PgBouncer sits in front of}"
port="${PGBOUNCER_PORT:-6432}"
dir="$(pwd)/var/pgbouncer"
bin="$(command -v pgbouncer || echo /usr/sbin/pgbouncer)"
[ -x "$bin" ] || { echo "pgbouncer is not installed (Debian: apt-get install pgbouncer)" >&2; exit 1; }
mkdir -p "$dir"

.venv/bin/python - "$url" "$port" "$dir" <<'PY'
import sys
from urllib.parse import urlsplit, unquote
url, port, root = sys.argv[1:]
parts = urlsplit(url)
if parts.scheme not in ("postgres", "postgresql") or "," in (parts.netloc or ""):
    sys.exit("DATABASE_URL must be a single-host postgres:// URL")
user, password = unquote(parts.username or "postgres"), unquote(parts.password or "")
open(f"{root}/userlist.txt", "w").write(f'"{user}" "{password}"\n')
open(f"{root}/pgbouncer.ini", "w").write(f"""[databases]
* = host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir = {root}
auth_type = trust
auth_file = {root}/userlist.txt
admin_users = {user}
pool_mode = transaction
default_pool_size = 20
max_client_conn = 1000
ignore_startup_parameters = extra_float_digits
logfile = {root}/pgbouncer.log
pidfile = {root}/pgbouncer.pid
""")
pooled = parts._replace(netloc=f"{parts.netloc.rpartition('@')[0]}@127.0.0.1:{port}" if "@" in parts.netloc
                        else f"127.0.0.1:{port}").geturl()
print("pgbouncer: transaction pooling on 127.0.0.1:%s; run OmniPost with\n"
      "  DATABASE_URL=%s OMNIPOST_DATABASE_POOLER=pgbouncer OMNIPOST_LISTEN_DATABASE_URL=%s" % (port, pooled, url))
PY

if [ "$(id -u)" = 0 ]; then
  chown -R postgres "$dir"  # pgbouncer refuses to run as root
  exec runuser -u postgres -- "$bin" "$dir/pgbouncer.ini"
fi
exec "$bin" "$dir/pgbouncer.ini"
