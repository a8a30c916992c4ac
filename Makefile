# The two commands a newcomer needs: `make run` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TEST_DATABASE_URL ?= postgres://postgres:postgres@127.0.0.1:5432/omnipost

.PHONY: run test lint check install install-dev clean pgbouncer

$(VENV)/.installed: requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

## make run: venv, install, migrate (the embedded PostgreSQL under var/ unless DATABASE_URL is set),
## demo tenant + admin login, serve on :8000 with a scheduler and a dispatcher until Ctrl-C
run: $(VENV)/.installed
	DEBUG=$${DEBUG:-true} $(PY) manage.py run_all

## make pgbouncer: a PgBouncer (transaction pooling) on 127.0.0.1:PGBOUNCER_PORT (6432) in front of DATABASE_URL, in var/pgbouncer
pgbouncer: $(VENV)/.installed
	scripts/pgbouncer.sh

## make test: install, make sure PostgreSQL is reachable, lint, checks, the whole suite on two
## workers (TEST_WORKERS), each test file on one, each worker with its own test database
TEST_WORKERS ?= 2
test: $(VENV)/.installed-dev
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} scripts/ensure_test_services.sh
	scripts/ensure_browser.sh
	$(MAKE) --no-print-directory lint check
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

check: $(VENV)/.installed-dev
	DJANGO_SETTINGS_MODULE=omnipost_site.settings_test DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) manage.py check
	DJANGO_SETTINGS_MODULE=omnipost_site.settings_test DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(PY) manage.py makemigrations --check --dry-run

clean:
	rm -rf $(VENV) var .pytest_cache .ruff_cache
