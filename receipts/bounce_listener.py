"""The SMTP server that receives bounces and complaints mailed to VERP return paths.

`manage.py run_bounce_listener` runs one `BounceListener`: an aiosmtpd server (the MX of
`OMNIPOST_BOUNCE_DOMAIN`, or behind a relay that forwards that domain to it) that

- accepts `RCPT TO` only for authenticated VERP addresses of the bounce domain
  (`providers.verp`); any other recipient, or a forged or altered token, is `550 5.1.1`;
- reads the message (`receipts.bounces.parse_report`) off the event loop; a message that is no
  delivery status notification or feedback report is `554 5.6.0`; one larger than
  `max_message_bytes` is `552` (aiosmtpd refuses it while it streams in);
- applies the receipt to the notification the address names, through the provider the address
  names (`receipts.services.apply_receipts`), on one database thread (one connection); the
  answer is `250` once it is applied. A database that cannot be reached is `451 4.3.0`: the
  reporting MTA keeps the report and tries again later, so nothing is lost, and the report's
  Message-ID makes the retry one event.

- also accepts `unsubscribe@` the bounce domain: the `mailto:` of the `List-Unsubscribe` header
  (recipients.unsubscribe; RFC 8058's one-click POST stays the preferred way, RFC 2369 the mailto).
  The mail's subject carries the signed token (`unsubscribe <token>`, as the header's `?subject=`
  puts it); a valid one opts the address out of the category on email, as the POST does, and is
  `250`; a forged, altered or missing token is `550 5.7.1`, and changes nothing. One message is
  either an unsubscribe or a report: mixing the two kinds of recipient is `452` for the second.

SIGTERM or SIGINT: stop accepting connections, let reports being applied finish within the grace
period, close the remaining sessions, exit 0. A second signal exits at once.
Logs name notifications and providers by id; addresses never appear in them.
"""

from __future__ import annotations

import asyncio
import contextlib
import email
import email.policy
import logging
import os
import re
import signal
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiosmtpd.smtp import SMTP
from django.db import connections

from core.db_faults import is_connection_lost, reset_connection
from providers import verp
from providers.models import Provider
from receipts.bounces import NotAReport, Report, parse_report
from receipts.inbound import ProviderView, Receipt
from receipts.services import apply_receipts
from recipients import unsubscribe as unsubscribing

logger = logging.getLogger("omnipost.bounces")

DEFAULT_BIND = "127.0.0.1:2525"
DEFAULT_MAX_MESSAGE_BYTES = 10 * 1024 * 1024  # a DSN quoting a whole large message still fits
MAX_RECIPIENTS = 20  # per transaction: a report goes to one return path

Resolve = Callable[[set[int]], dict[int, ProviderView]]
Apply = Callable[[ProviderView, list[Receipt]], Any]
Unsubscribe = Callable[[str], Any]  # a token -> opted out (recipients.unsubscribe.unsubscribe); BadToken otherwise

UNSUBSCRIBE_LOCAL = "unsubscribe"  # unsubscribe@<bounce domain>, the List-Unsubscribe mailto (recipients.unsubscribe)
# The token after "unsubscribe" in the subject (a reply may prefix "Re: "); Fernet tokens are urlsafe base64.
_UNSUBSCRIBE_SUBJECT = re.compile(r"\bunsubscribe\s+([A-Za-z0-9_-]{40,4096})", re.IGNORECASE)
MAX_UNSUBSCRIBE_HEAD_BYTES = 64 * 1024  # the subject is in the head; a body is not read


def is_unsubscribe_address(address: str) -> bool:
    """unsubscribe@ our bounce domain (case-insensitive)."""
    domain = verp.bounce_domain()
    local, at, host = address.strip().strip("<>").rpartition("@")
    return bool(domain) and bool(at) and host.lower().rstrip(".") == domain and local.lower() == UNSUBSCRIBE_LOCAL


def unsubscribe_token(raw: bytes) -> str | None:
    """The token in an unsubscribe mail's Subject, or None."""
    head = raw[:MAX_UNSUBSCRIBE_HEAD_BYTES].split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    message = email.message_from_bytes(head + b"\r\n\r\n", policy=email.policy.default)
    try:
        subject = str(message.get("Subject") or "")
    except (ValueError, TypeError, IndexError):  # a malformed encoded word
        return None
    match = _UNSUBSCRIBE_SUBJECT.search(subject)
    return match[1] if match else None


class TryLater(Exception):
    """The report could not be applied now (the database is away): answered 451."""


def load_providers(provider_ids: set[int]) -> dict[int, ProviderView]:
    """The SMTP providers these ids name, in one statement. No secrets (the VERP token is the
    authentication) and no `updated_at` (so no staleness gate: nothing here was verified with a
    secret an edit could have rotated out)."""
    rows = Provider.objects.filter(pk__in=provider_ids, kind="smtp").values_list("pk", "tenant_id", "name", "config")
    return {
        pk: ProviderView(id=pk, tenant_id=str(tenant_id), kind="smtp", config=config or {}, secrets={}, name=name)
        for pk, tenant_id, name, config in rows
    }


@dataclass
class ListenerConfig:
    host: str = "127.0.0.1"
    port: int = 2525
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    grace_seconds: float = 5.0
    session_timeout: float = 60.0  # an idle session is closed after this long
    max_sessions: int = 100  # more connections at once are answered 421 and closed


def parse_bind(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--bind takes HOST:PORT, e.g. {DEFAULT_BIND}")
    return host.strip("[]") or "127.0.0.1", int(port)


class _TrackedSMTP(SMTP):
    """aiosmtpd's SMTP session, in the listener's set while its connection is open (so a stop can
    close the idle ones)."""

    sessions: set
    max_sessions: int
    refused = False

    def connection_made(self, transport) -> None:  # noqa: ANN001
        if len(self.sessions) >= self.max_sessions:
            # A flood of connections cannot exhaust the process; a real MTA retries a 421 later.
            self.refused = True
            transport.write(b"421 4.7.0 Too many connections, try again later\r\n")
            transport.close()
            return
        self.sessions.add(self)
        super().connection_made(transport)

    def connection_lost(self, exc) -> None:  # noqa: ANN001
        if self.refused:
            return
        self.sessions.discard(self)
        super().connection_lost(exc)


class _Handler:
    """aiosmtpd hooks."""

    def __init__(self, listener: BounceListener) -> None:
        self.listener = listener

    async def handle_RCPT(self, server, session, envelope, address: str, rcpt_options) -> str:  # noqa: ANN001
        if len(envelope.rcpt_tos) >= MAX_RECIPIENTS:
            return "452 4.5.3 Too many recipients"
        unsubscribing_ = is_unsubscribe_address(address)
        if envelope.rcpt_tos and unsubscribing_ != is_unsubscribe_address(envelope.rcpt_tos[0]):
            return "452 4.5.3 One message is either an unsubscribe or a report; send the other separately"
        if unsubscribing_:
            envelope.rcpt_tos.append(address)
            return "250 OK"
        if verp.read_address(address) is None:
            self.listener.counts["refused_rcpt"] += 1
            logger.info("refused RCPT from %s: not a return path of this bounce domain", _peer(session))
            return "550 5.1.1 No such recipient here"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: ANN001
        raw = envelope.original_content or envelope.content or b""
        if isinstance(raw, str):
            raw = raw.encode("utf-8", "surrogateescape")
        if envelope.rcpt_tos and is_unsubscribe_address(envelope.rcpt_tos[0]):
            return await self.listener.unsubscribe(raw, _peer(session))
        targets = {t for t in (verp.read_address(a) for a in envelope.rcpt_tos) if t is not None}
        return await self.listener.receive(raw, targets, _peer(session))


def _summary(result: Any) -> str:  # noqa: ANN401 - receipts.services.ApplyResult
    names = [name for name in ("applied", "duplicate", "ignored") if hasattr(result, name)]
    counts = [f"{name} {getattr(result, name)}" for name in names]
    return ", ".join(counts) or str(result)


def _peer(session: Any) -> str:  # noqa: ANN401
    peer = getattr(session, "peer", None)
    return str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"


class BounceListener:
    def __init__(
        self,
        config: ListenerConfig | None = None,
        *,
        resolve: Resolve = load_providers,
        apply: Apply = apply_receipts,
        unsubscribe: Unsubscribe = unsubscribing.unsubscribe,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or ListenerConfig()
        self.resolve = resolve
        self.apply = apply
        self.opt_out = unsubscribe
        self.clock = clock
        self.port = self.config.port
        self.counts = {"applied": 0, "not_a_report": 0, "refused_rcpt": 0, "try_later": 0, "unknown_provider": 0,
                       "unsubscribed": 0, "bad_unsubscribe": 0}  # fmt: skip
        self._server: asyncio.AbstractServer | None = None
        self._sessions: set[Any] = set()
        self._busy = 0
        self._idle: asyncio.Event | None = None
        # One thread, one connection for every statement; parsing runs beside it, off the event loop.
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="omnipost-db")
        self._parser = ThreadPoolExecutor(max_workers=2, thread_name_prefix="omnipost-parse")
        self._signals = 0
        self._stop: asyncio.Event | None = None

    # -- serving ---------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        handler = _Handler(self)
        logging.getLogger("mail.log").setLevel(logging.WARNING)  # aiosmtpd logs every command (addresses) at INFO
        hostname = verp.bounce_domain() or "omnipost-bounces"

        def factory() -> SMTP:
            smtp = _TrackedSMTP(
                handler,
                hostname=hostname,
                data_size_limit=self.config.max_message_bytes,
                enable_SMTPUTF8=True,  # RFC 6533 DSNs for internationalised addresses
                timeout=self.config.session_timeout,
                loop=loop,
            )
            smtp.sessions = self._sessions
            smtp.max_sessions = self.config.max_sessions
            return smtp

        self._server = await loop.create_server(factory, self.config.host, self.config.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def receive(self, raw: bytes, targets: set[verp.VerpTarget], peer: str) -> str:
        """One report for these VERP targets: the SMTP answer to its DATA."""
        loop = asyncio.get_running_loop()
        self._enter()
        try:
            try:
                report = await loop.run_in_executor(self._parser, parse_report, raw)
            except NotAReport as exc:
                self.counts["not_a_report"] += 1
                logger.info("refused a message from %s: %s", peer, exc)
                return "554 5.6.0 Not a delivery status notification (RFC 3464) or feedback report (RFC 5965)"
            except Exception:  # noqa: BLE001 - hostile input must not take the listener down
                self.counts["not_a_report"] += 1
                logger.warning("refused an unreadable message from %s", peer, exc_info=True)
                return "554 5.6.0 Unreadable message"
            try:
                await loop.run_in_executor(self._db, self._deliver, targets, report, raw)
            except TryLater as exc:
                self.counts["try_later"] += 1
                logger.warning("report from %s not applied, asked to retry: %s", peer, exc)
                return "451 4.3.0 Temporary failure, please try again later"
            return "250 OK: report received"
        finally:
            self._leave()

    async def unsubscribe(self, raw: bytes, peer: str) -> str:
        """One mail to unsubscribe@: the SMTP answer to its DATA (the module docstring's rules)."""
        loop = asyncio.get_running_loop()
        self._enter()
        try:
            token = await loop.run_in_executor(self._parser, unsubscribe_token, raw)
            if token is None:
                self.counts["bad_unsubscribe"] += 1
                logger.info("refused an unsubscribe mail from %s: no token in its subject", peer)
                return "550 5.7.1 No unsubscribe token in the subject; use the List-Unsubscribe address as given"
            try:
                await loop.run_in_executor(self._db, self._opt_out, token)
            except unsubscribing.BadToken:
                self.counts["bad_unsubscribe"] += 1
                logger.info("refused an unsubscribe mail from %s: the token does not verify", peer)
                return "550 5.7.1 This unsubscribe token is not valid"
            except TryLater as exc:
                self.counts["try_later"] += 1
                logger.warning("unsubscribe mail from %s not applied, asked to retry: %s", peer, exc)
                return "451 4.3.0 Temporary failure, please try again later"
            self.counts["unsubscribed"] += 1
            logger.info("unsubscribed by mail from %s", peer)
            return "250 OK: unsubscribed"
        finally:
            self._leave()

    def _opt_out(self, token: str) -> None:
        """On the database thread: the opt-out, tried once more on a new session if the idle one was
        lost (it is idempotent); BadToken passes through, any other failure is TryLater."""
        for attempt in (1, 2):
            try:
                self.opt_out(token)
                return
            except unsubscribing.BadToken:
                raise
            except Exception as exc:
                if not is_connection_lost(exc):
                    logger.exception("applying an unsubscribe failed")
                    raise TryLater(f"{type(exc).__name__} while unsubscribing") from exc
                reset_connection()
                if attempt == 2:
                    raise TryLater("the database connection was lost") from exc

    def _deliver(self, targets: Iterable[verp.VerpTarget], report: Report, raw: bytes) -> None:
        """On the database thread: resolve the providers, apply each one's receipts. A session lost
        while idle is replaced and the report tried once more at once (applying is idempotent: the
        report's event id de-duplicates); a second loss is TryLater."""
        by_provider: dict[int, list[str]] = {}
        for target in targets:
            by_provider.setdefault(target.provider_id, []).append(target.notification_id)
        for attempt in (1, 2):
            try:
                self._apply_all(by_provider, report, raw)
                return
            except Exception as exc:
                if not is_connection_lost(exc):
                    logger.exception("applying a report failed")
                    raise TryLater(f"{type(exc).__name__} while applying the report") from exc
                reset_connection()
                if attempt == 2:
                    raise TryLater("the database connection was lost") from exc
                logger.warning("the database connection was lost; trying the report again on a new one")

    def _apply_all(self, by_provider: dict[int, list[str]], report: Report, raw: bytes) -> None:
        providers = self.resolve(set(by_provider))
        for provider_id, notification_ids in sorted(by_provider.items()):
            provider = providers.get(provider_id)
            if provider is None:
                self.counts["unknown_provider"] += 1
                logger.info("report for provider %s, which is gone or no SMTP provider: ignored", provider_id)
                continue
            receipts = [report.receipt_for(nid, raw) for nid in notification_ids]
            result = self.apply(provider, receipts)
            self.counts["applied"] += len(receipts)
            logger.info(
                "%s report for notification(s) %s of provider %s (%s%s): %s",
                report.details.get("source", "report"), ", ".join(notification_ids), provider_id,
                report.receipt or report.type, f"/{report.bounce_type}" if report.bounce_type else "",
                _summary(result),
            )  # fmt: skip

    def _enter(self) -> None:
        self._busy += 1
        if self._idle is not None:
            self._idle.clear()

    def _leave(self) -> None:
        self._busy -= 1
        if self._busy == 0 and self._idle is not None:
            self._idle.set()

    # -- stopping --------------------------------------------------------------------------------
    async def stop(self, grace_seconds: float | None = None) -> None:
        """Stop accepting, let reports being applied finish (within the grace), close the sessions."""
        grace = self.config.grace_seconds if grace_seconds is None else grace_seconds
        if self._server is not None:
            self._server.close()
        if self._idle is not None and not self._idle.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        for smtp in list(self._sessions):
            transport = getattr(smtp, "transport", None)
            if transport is not None:
                transport.close()
        await asyncio.sleep(0)  # let the closed sessions run their connection_lost
        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            await loop.run_in_executor(self._db, connections.close_all)
        self._db.shutdown(wait=False, cancel_futures=True)
        self._parser.shutdown(wait=False, cancel_futures=True)

    def run(self) -> int:
        """The process's main: serve until SIGTERM/SIGINT. Returns the exit code."""
        return asyncio.run(self._main())

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        await self.start()
        logger.info(
            "bounce listener started on %s:%s for %s (max %s bytes a message)",
            self.config.host, self.port, verp.bounce_domain() or "no bounce domain (every RCPT is refused)",
            self.config.max_message_bytes,
        )  # fmt: skip
        await self._stop.wait()
        await self.stop()
        logger.info("bounce listener stopped: %s", self.counts)
        return 0

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1:
            logger.warning("%s again: exiting now", sig.name)
            logging.shutdown()
            os._exit(1)
        logger.info("%s: stopping (grace %ss)", sig.name, self.config.grace_seconds)
        if self._stop is not None:
            self._stop.set()
