"""OmniPost settings, read from the environment (django-environ; `.env` is read if present).

Every variable is listed in README.md. Dev-only defaults apply only when DEBUG is on.
"""

from __future__ import annotations

from pathlib import Path

import environ

from core.db_url import parse_database_url, turn_jit_off
from core.embedded_db import EmbeddedPostgres
from omnipost_site.config import checked, choice, fail, number
from omnipost_site.keys import load_encryption_keys

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# This checkout's local state: the embedded database, the dev encryption key, demo credentials.
VAR_DIR = Path(env.str("OMNIPOST_VAR_DIR", default="") or BASE_DIR / "var").resolve()

DEBUG = env.bool("DEBUG", default=False)

SECRET_KEY = env.str("SECRET_KEY", default="")
if not SECRET_KEY:
    if not DEBUG:
        fail("SECRET_KEY is required when DEBUG is off")
    SECRET_KEY = "dev-only-insecure-secret-key-do-not-use-in-production"  # noqa: S105

ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]", "testserver"] if DEBUG else [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "core",
    "templating",
    "providers",
    "recipients",
    "routing",
    "notifications",
    "queueing",
    "dlq",
    "events",
    "inbox",
    "receipts",
    "workflows",
    "bulk",
    "operations",
    "dispatch",
    "omnipost_site.ops",
    "benchmarks",  # optional: `omnipost_bench` only
]

MIDDLEWARE = [
    "core.middleware.RequestSizeLimitMiddleware",
    # CORS for /inbox/v1/ only: the tenant's inbox_allowed_origins (inbox.cors)
    "inbox.cors.InboxCorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Single creates and detail reads, answered here when plain and valid (else handed on).
    "notifications.api.hot.HotPathMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "omnipost_site.urls"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "omnipost_site.wsgi.application"

# --- database -----------------------------------------------------------------------------------
# PostgreSQL only. DATABASE_URL unset: the embedded server under var/ (core.embedded_db), started here
# on first need and shared by every process of this checkout. Several hosts
# (`postgres://u@h1:5432,h2:5432/db?target_session_attrs=read-write`): core.db_url.
_database_url = env.str("DATABASE_URL", default="").strip()
# The embedded server this checkout's processes share (None with DATABASE_URL set); run_all stops it.
OMNIPOST_EMBEDDED_DATABASE = None if _database_url else EmbeddedPostgres(VAR_DIR)
DATABASES = {
    "default": checked(
        lambda: OMNIPOST_EMBEDDED_DATABASE.start() if OMNIPOST_EMBEDDED_DATABASE else parse_database_url(_database_url)
    )
}
_db = DATABASES["default"]
_db.setdefault("CONN_MAX_AGE", number(env, "CONN_MAX_AGE", 60, integer=True))
_db["CONN_HEALTH_CHECKS"] = True
_db.setdefault("OPTIONS", {}).setdefault("application_name", env.str("OMNIPOST_APP_NAME", default="omnipost-web"))
# Behind PgBouncer in transaction pooling mode (core.pooling): nothing prepared
# server-side, no session state, no server-side cursors (Django's are WITH HOLD outside a
# transaction); LISTEN only on the direct OMNIPOST_LISTEN_DATABASE_URL, else polling.
OMNIPOST_DATABASE_POOLER = choice(env, "OMNIPOST_DATABASE_POOLER", "none", ["none", "pgbouncer"])
OMNIPOST_LISTEN_DATABASE_URL = env.str("OMNIPOST_LISTEN_DATABASE_URL", default="").strip()
if OMNIPOST_LISTEN_DATABASE_URL and not OMNIPOST_LISTEN_DATABASE_URL.startswith(("postgres://", "postgresql://")):
    fail("OMNIPOST_LISTEN_DATABASE_URL must be a postgres:// URL (a direct connection, not through the pooler)")
if OMNIPOST_DATABASE_POOLER == "pgbouncer":
    _db["OPTIONS"]["prepare_threshold"] = None
    _db["DISABLE_SERVER_SIDE_CURSORS"] = True
elif env.bool("OMNIPOST_DATABASE_JIT_OFF", default=True):  # false: a proxy in between refuses startup options
    turn_jit_off(_db["OPTIONS"])  # short statements only: no LLVM compile at each execution (core.db_url)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- encryption at rest ---------------------------------------------------------------------------
OMNIPOST_ENCRYPTION_KEYS = checked(
    lambda: load_encryption_keys(
        env.str("OMNIPOST_ENCRYPTION_KEYS", default=""), debug=DEBUG, dev_key_file=VAR_DIR / "encryption.key"
    )
)

# --- queue, retries, limits -----------------------------------------------------------------------
OMNIPOST_LEASE_SECONDS = number(env, "OMNIPOST_LEASE_SECONDS", 30.0, minimum=0.001)
OMNIPOST_STARVATION_SECONDS = number(env, "OMNIPOST_STARVATION_SECONDS", 300.0)
# A topic fan-out: members per chunk (one transaction each), and how long a scheduler turn fans out.
OMNIPOST_FANOUT_CHUNK = number(env, "OMNIPOST_FANOUT_CHUNK", 10000, integer=True, minimum=1)
OMNIPOST_FANOUT_BUDGET_SECONDS = number(env, "OMNIPOST_FANOUT_BUDGET_SECONDS", 0.5, minimum=0.001)
# A deleted topic's memberships: deleted per chunk (one transaction each), and how long a scheduler turn deletes.
OMNIPOST_TOPIC_DELETE_CHUNK = number(env, "OMNIPOST_TOPIC_DELETE_CHUNK", 10000, integer=True, minimum=1)
OMNIPOST_TOPIC_DELETE_BUDGET_SECONDS = number(env, "OMNIPOST_TOPIC_DELETE_BUDGET_SECONDS", 0.5, minimum=0.001)
OMNIPOST_RETRY_BASE_SECONDS = number(env, "OMNIPOST_RETRY_BASE_SECONDS", 2.0)
OMNIPOST_RETRY_MAX_SECONDS = number(env, "OMNIPOST_RETRY_MAX_SECONDS", 3600.0)
OMNIPOST_MAX_ATTEMPTS = number(env, "OMNIPOST_MAX_ATTEMPTS", 8, minimum=1, integer=True)
# Requests a minute per tenant; 0 turns the API rate limit off.
OMNIPOST_RATE_LIMIT_API = number(env, "OMNIPOST_RATE_LIMIT_API", 6000, integer=True)
# Receipt requests a second one provider's inbound URL accepts (all web processes together; 0: no limit).
OMNIPOST_RATE_LIMIT_RECEIPTS = number(env, "OMNIPOST_RATE_LIMIT_RECEIPTS", 5000.0)
# Threads a worker gives receipts under an ASGI server (receipts.asgi: 2 measured best on 2 cores).
OMNIPOST_RECEIPTS_THREADS = int(number(env, "OMNIPOST_RECEIPTS_THREADS", 2, minimum=1, integer=True))
# Threads a web process answers the API in under the ASGI server (a2wsgi, omnipost_site.asgi), as the
# WSGI server's --blocking-threads.
OMNIPOST_WEB_THREADS = int(number(env, "OMNIPOST_WEB_THREADS", 4, minimum=1, integer=True))
# Web processes cache verified API keys and LISTEN for revocations (core.auth_cache); off, entries live 1 s.
OMNIPOST_AUTH_LISTEN = env.bool("OMNIPOST_AUTH_LISTEN", default=True)
# CONN_HEALTH_CHECKS' `SELECT 1` only for a connection idle this long (core.conn_checks); 0: before every request.
OMNIPOST_CONN_CHECK_IDLE_SECONDS = number(env, "OMNIPOST_CONN_CHECK_IDLE_SECONDS", 1.0)
OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = env.bool("OMNIPOST_ALLOW_PRIVATE_DESTINATIONS", default=False)
OMNIPOST_MAX_REQUEST_BYTES = number(env, "OMNIPOST_MAX_REQUEST_BYTES", 16 * 1024 * 1024, minimum=1, integer=True)
OMNIPOST_WORKER_STALE_SECONDS = number(env, "OMNIPOST_WORKER_STALE_SECONDS", 60.0, minimum=0.001)
# /readyz answers 503 when a due scheduled job has waited longer than this (0 turns the check off).
OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS = number(env, "OMNIPOST_READY_MAX_SCHEDULER_LAG_SECONDS", 60.0, minimum=0)

# Tenant input (issue 19): a template render's deadline, the compiled-template cache of each
# process in estimated bytes, and how many distinct queues one tenant's notifications may name.
OMNIPOST_TEMPLATE_RENDER_SECONDS = number(env, "OMNIPOST_TEMPLATE_RENDER_SECONDS", 0.5, minimum=0.001)
OMNIPOST_TEMPLATE_CACHE_BYTES = number(env, "OMNIPOST_TEMPLATE_CACHE_BYTES", 32 * 1024 * 1024, integer=True)
OMNIPOST_MAX_QUEUES_PER_TENANT = number(env, "OMNIPOST_MAX_QUEUES_PER_TENANT", 50, minimum=1, integer=True)
# /metrics: when set, scrapes need `Authorization: Bearer <token>`; label values past the caps fold into "other".
OMNIPOST_METRICS_TOKEN = env.str("OMNIPOST_METRICS_TOKEN", default="")
OMNIPOST_METRICS_MAX_QUEUES = number(env, "OMNIPOST_METRICS_MAX_QUEUES", 20, minimum=1, integer=True)
OMNIPOST_METRICS_MAX_PROVIDERS = number(env, "OMNIPOST_METRICS_MAX_PROVIDERS", 200, minimum=1, integer=True)
# --- sends under running work ----------------------------------------------------------------------
# SMTP sends run on a pool of their own; one provider holds at most OMNIPOST_SMTP_THREADS_PER_PROVIDER.
OMNIPOST_SMTP_THREADS = number(env, "OMNIPOST_SMTP_THREADS", 32, minimum=1, integer=True)
OMNIPOST_SMTP_THREADS_PER_PROVIDER = number(env, "OMNIPOST_SMTP_THREADS_PER_PROVIDER", 8, minimum=1, integer=True)
# Provider instances (each with its connection pool) one dispatcher keeps: past it, the least recently
# claimed with no send in flight are closed (dispatch.providers).
OMNIPOST_DISPATCHER_PROVIDER_CACHE = number(env, "OMNIPOST_DISPATCHER_PROVIDER_CACHE", 256, minimum=1, integer=True)
# After a webhook signing secret is rotated, sends carry the old signature beside the new one this long.
OMNIPOST_SECRET_ROTATION_GRACE_SECONDS = number(env, "OMNIPOST_SECRET_ROTATION_GRACE_SECONDS", 86400.0)

# The public base of every URL OmniPost hands out (events_url, Twilio
# StatusCallback, List-Unsubscribe); `make run` sets http://127.0.0.1:8000.
OMNIPOST_PUBLIC_URL = env.str("OMNIPOST_PUBLIC_URL", default="").rstrip("/")
# Where the Procfile's `stream` process is reachable by browsers (e.g. https://stream.omnipost.example.com):
# the WSGI `web` process answers GET /inbox/v1/stream with a redirect there (inbox.api.views.StreamRedirectView);
# unset, it answers 404 (the stream is served by the ASGI application only).
OMNIPOST_STREAM_URL = env.str("OMNIPOST_STREAM_URL", default="").rstrip("/")
OMNIPOST_BOUNCE_DOMAIN = env.str("OMNIPOST_BOUNCE_DOMAIN", default="")  # VERP return paths for SMTP bounces
OMNIPOST_SNS_CERT_URL_PATTERN = env.str(
    "OMNIPOST_SNS_CERT_URL_PATTERN", default=r"^https://sns\.[a-z0-9-]+\.amazonaws\.com/[^?#]*\.pem$"
)
OMNIPOST_EVENT_ENDPOINT_DISABLE_AFTER_HOURS = number(env, "OMNIPOST_EVENT_ENDPOINT_DISABLE_AFTER_HOURS", 120.0)

DATA_UPLOAD_MAX_MEMORY_SIZE = OMNIPOST_MAX_REQUEST_BYTES
# Paths that take larger bodies than OMNIPOST_MAX_REQUEST_BYTES: a bulk send's CSV file is up to 20 MiB,
# and more as JSON text (its quotes escaped) or with a form's parts; the view checks the file's own size.
OMNIPOST_LARGE_BODY_PATHS = {"/api/v1/bulk-sends": max(OMNIPOST_MAX_REQUEST_BYTES, 48 * 1024 * 1024)}
DATA_UPLOAD_MAX_NUMBER_FIELDS = 10_000

# --- HTTPS hardening ------------------------------------------------------------------------------
OMNIPOST_HTTPS = env.bool("OMNIPOST_HTTPS", default=False)
if OMNIPOST_HTTPS:
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = 31_536_000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# --- API ------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["core.api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["core.api.permissions.IsTenantAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["core.api.throttling.TenantRateThrottle"],
    "DEFAULT_PAGINATION_CLASS": "core.api.pagination.CreatedCursorPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_RENDERER_CLASSES": ["core.api.renderers.JSONRenderer"],  # DRF's, by orjson where alike
    "DEFAULT_PARSER_CLASSES": ["core.api.parsers.StrictJSONParser"],
    "EXCEPTION_HANDLER": "core.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "OmniPost API",
    "DESCRIPTION": "Multi-tenant notification dispatch. Authenticate with "
    "`Authorization: Bearer op_<prefix>_<secret>`.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
}

# --- logging --------------------------------------------------------------------------------------
OMNIPOST_LOG_FORMAT = choice(env, "OMNIPOST_LOG_FORMAT", "text", ["text", "json"])
OMNIPOST_LOG_LEVEL = choice(
    env, "OMNIPOST_LOG_LEVEL", "INFO", ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], upper=True
)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"mask_pii": {"()": "core.logging.MaskingFilter"}},
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "core.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if OMNIPOST_LOG_FORMAT == "json" else "text",
            "filters": ["mask_pii"],
        }
    },
    "root": {"handlers": ["console"], "level": OMNIPOST_LOG_LEVEL},
    # Django's own loggers (request errors, runserver access lines, warnings) lose the unmasked
    # handlers Django installs by default and propagate to the masking handler above instead.
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        "django.db.backends": {"level": "INFO"},
        "py.warnings": {"handlers": [], "propagate": True},
    },
}
