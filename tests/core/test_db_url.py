"""core.db_url: DATABASE_URL with one host or several (libpq's multi-host form) → DATABASES;
PostgreSQL only, so a SQLite URL stops start-up in one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from core.db_url import database_url, parse_database_url, turn_jit_off
from tests.core.conftest import REPO, clean_env


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("postgres://u@h1:5432,h2:5433/db", "h1,h2", "5432,5433"),
        ("postgres://u@h1,h2/db", "h1,h2", ""),  # libpq's default port for both
        ("postgres://u@h1:5433,h2/db", "h1,h2", "5433,"),  # h2 on the default port, not on 5433
        ("postgres://u@[::1]:5432,10.0.0.2:5432/db", "::1,10.0.0.2", "5432,5432"),  # no brackets for libpq
        ("postgresql://u@a.example:6432,b.example:6432,c.example:6432/db", "a.example,b.example,c.example",
         "6432,6432,6432"),
    ],
)
def test_several_hosts_become_libpq_comma_lists(url, host, port):
    config = parse_database_url(url)
    assert (config["HOST"], config["PORT"]) == (host, port)
    assert config["ENGINE"] == "django.db.backends.postgresql"
    assert (config["NAME"], config["USER"]) == ("db", "u")


def test_user_password_name_and_options_are_read_as_for_one_host():
    config = parse_database_url(
        "postgres://app:p%40ss%2Fword@h1:5432,h2:5432/omni%2Dpost?target_session_attrs=read-write&connect_timeout=3"
    )
    assert config["USER"] == "app" and config["PASSWORD"] == "p@ss/word"
    assert config["NAME"] == "omni-post"
    assert config["OPTIONS"] == {"target_session_attrs": "read-write", "connect_timeout": 3}


def test_one_host_is_django_environs_reading_unchanged():
    url = "postgres://u:p@db.example:5432/omnipost?sslmode=require"
    import environ

    assert parse_database_url(url) == environ.Env.db_url_config(url)


@pytest.mark.parametrize(
    "url", ["sqlite:////tmp/x.sqlite3", "sqlite:///:memory:", "SQLITE:///x", "mysql://u:secret@db/x", "db.example/x"]
)
def test_only_postgresql_urls_are_accepted(url):
    with pytest.raises(ImproperlyConfigured) as raised:
        parse_database_url(url)
    shown = url.replace(":secret@", ":***@")
    assert str(raised.value) == (f"DATABASE_URL: PostgreSQL is the only database, and {shown} is not a postgres:// "
                                 "URL (unset, the embedded server is used)")  # fmt: skip


@pytest.mark.parametrize("command", ["check", "migrate"])
def test_a_sqlite_url_stops_manage_py_with_exactly_one_line(tmp_path, command):
    url = f"sqlite:///{tmp_path / 'omnipost.sqlite3'}"
    env = clean_env(DEBUG="true", DJANGO_SETTINGS_MODULE="omnipost_site.settings", DATABASE_URL=url,
                    OMNIPOST_VAR_DIR=str(tmp_path / "var"))  # fmt: skip
    result = subprocess.run([sys.executable, str(REPO / "manage.py"), command], cwd=tmp_path, env=env,  # noqa: S603
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"OmniPost configuration error: DATABASE_URL: PostgreSQL is the only database, and {url} is not a "
        "postgres:// URL (unset, the embedded server is used)"
    ]
    assert list(tmp_path.iterdir()) == []  # neither a database file nor an embedded server was made


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgres://u:secret@h1,,h2/db", "empty or malformed host ''"),
        ("postgres://u:secret@h1:5432,h2:54x2/db", "port '54x2'"),
        ("postgres://u:secret@h1:5432,h2:70000/db", "port '70000'"),
        ("mysql://u:secret@h1,h2/db", "PostgreSQL is the only database"),
    ],
)
def test_bad_multi_host_urls_say_what_is_wrong_without_the_password(url, message):
    with pytest.raises(ImproperlyConfigured) as raised:
        parse_database_url(url)
    assert message in str(raised.value)
    assert "secret" not in str(raised.value)
    assert str(raised.value).startswith("DATABASE_URL: ")


@pytest.mark.parametrize(
    "url",
    [
        "postgres://u:p%40x@h1:5432,h2:5433/db?target_session_attrs=read-write",
        "postgres://u@[::1]:5432,h2:5432/db",
        "postgres://u@h1:5432/db",
    ],
)
def test_an_entry_written_back_as_a_url_reads_the_same(url):
    config = parse_database_url(url)
    assert parse_database_url(database_url(config)) == config


def test_a_unix_socket_directory_is_written_as_libpqs_host_parameter():
    """The embedded server's entry (HOST a socket directory) as a URL a worker process reads back."""
    embedded = {"ENGINE": "django.db.backends.postgresql", "NAME": "omnipost", "USER": "postgres", "PASSWORD": "",
                "HOST": "/srv/omni post/var/postgres", "PORT": "5432"}  # fmt: skip
    url = database_url(embedded)
    assert url == "postgres://postgres@/omnipost?host=%2Fsrv%2Fomni+post%2Fvar%2Fpostgres&port=5432"
    config = parse_database_url(url)
    assert config["OPTIONS"] == {"host": "/srv/omni post/var/postgres", "port": 5432}
    assert (config["HOST"], config["NAME"], config["USER"]) == ("", "omnipost", "postgres")
    assert database_url(config) == url


def test_the_written_url_leaves_out_the_processes_own_application_name():
    config = parse_database_url("postgres://u@h1,h2/db?target_session_attrs=read-write")
    config["OPTIONS"]["application_name"] = "omnipost-web"
    assert "application_name" not in database_url(config)


def test_jit_goes_off_once_and_stays_out_of_the_written_url():
    """Each process turns JIT off on its direct connections itself: a URL handed to another process
    (which may go through a pooler, which refuses startup options) carries only the URL's own."""
    config = parse_database_url("postgres://u@h/db?options=-c%20search_path%3Dapp")
    turn_jit_off(config["OPTIONS"])
    turn_jit_off(config["OPTIONS"])
    assert config["OPTIONS"]["options"] == "-c search_path=app -c jit=off"
    assert parse_database_url(database_url(config))["OPTIONS"] == {"options": "-c search_path=app"}
    bare = parse_database_url("postgres://u@h/db")
    turn_jit_off(bare.setdefault("OPTIONS", {}))
    assert bare["OPTIONS"] == {"options": "-c jit=off"} and "options" not in database_url(bare)
