from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from core.process_name import set_process_name
from providers import verp
from receipts.bounce_listener import DEFAULT_BIND, DEFAULT_MAX_MESSAGE_BYTES, BounceListener, ListenerConfig, parse_bind


class Command(BaseCommand):
    help = (
        "Receive bounces (RFC 3464) and complaint reports (RFC 5965) mailed to VERP return paths of "
        "OMNIPOST_BOUNCE_DOMAIN, over SMTP, until SIGTERM/SIGINT (see README)."
    )

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("--bind", default=DEFAULT_BIND, help=f"HOST:PORT to listen on (default {DEFAULT_BIND})")
        parser.add_argument(
            "--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
            help="larger messages are refused with 552 while they stream in",
        )  # fmt: skip
        parser.add_argument("--grace-seconds", type=float, default=5.0, help="time to finish reports being applied")

    def handle(self, *args, **options) -> None:
        try:
            host, port = parse_bind(options["bind"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["max_message_bytes"] < 1024:
            raise CommandError("--max-message-bytes must be at least 1024")
        if options["grace_seconds"] < 0:
            raise CommandError("--grace-seconds must be zero or more")
        if not verp.bounce_domain():
            raise CommandError("OMNIPOST_BOUNCE_DOMAIN is not set: no send has a return path this listener could read")
        set_process_name("omnipost-bounce")
        # who is who in pg_stat_activity
        db_options = connections["default"].settings_dict.setdefault("OPTIONS", {})
        db_options["application_name"] = f"omnipost-bounces-{os.getpid()}"
        config = ListenerConfig(
            host=host, port=port, max_message_bytes=options["max_message_bytes"], grace_seconds=options["grace_seconds"]
        )
        try:
            code = BounceListener(config).run()
        except OSError as exc:
            raise CommandError(f"cannot listen on {host}:{port}: {exc}") from None
        if code != 0:
            raise CommandError("the bounce listener stopped after an internal error; see the log above")
