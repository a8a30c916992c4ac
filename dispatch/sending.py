"""Sends in flight: start each claimed item on its provider, take its result back, judge it
(dispatch.policy) and hand the outcome to the recorder. One outcome per claimed item, whatever
calls back late: an item given back (shutdown, grace over) is never judged again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from core import crypto, tracing
from dispatch import policy
from dispatch.delivery import Attempt, DeviceOutcome, Outcome, Prepared, Target
from dispatch.providers import ProviderCache
from dispatch.recording import Recorder
from dlq.classifier import Classification, classify
from dlq.retry import RetryPolicy
from providers.kinds import BaseProvider, DeliveryResult, OutboundMessage
from providers.kinds.base import Cancellable
from providers.scrub import scrub
from providers.simulator import SIMULATOR, SimulatedReceipt, receipt_for
from recipients import devices, unsubscribe
from routing.failover import Router

logger = logging.getLogger("omnipost.dispatcher")


class Sender:
    def __init__(
        self, providers: ProviderCache, recorder: Recorder, retry: RetryPolicy, router: Router | None = None
    ) -> None:
        self.providers = providers
        self.recorder = recorder
        self.retry = retry
        self.router = router or Router()
        # item id -> (a task, or a send that calls back; the item): the provider cache's, which
        # reads it to know what a replaced instance still carries
        self.inflight: dict[int, tuple[Cancellable, Prepared]] = providers.inflight
        self.capacity = asyncio.Event()  # set whenever a slot frees up
        # Where traces are exported (core.tracing): the claim that the items being started came from
        # (its start and end, epoch ns), and each send's span until its outcome.
        self.claim_window = (0, 0)
        self.spans: dict[int, Any] = {}

    def start(self, item: Prepared) -> None:
        """Start one delivery. A provider that can (`start_send`: the webhook provider) sends at once
        and calls back with the result, which costs no task, coroutine or future per delivery; any
        other is awaited in a task of its own."""
        started = datetime.now(UTC)
        t0 = time.perf_counter()
        if item.targets is not None:
            self._fan_out(item, started, t0)
            return
        try:
            # a test notification goes to the simulator, never to its provider
            instance = SIMULATOR if item.test else self.providers.entries[item.provider_id].instance
            recipient = item.recipient()
            headers = () if item.channel != "email" or item.critical else (
                unsubscribe.headers(item.tenant_key, recipient, item.category))  # fmt: skip
            traceparent = self._trace(item, instance.kind) if tracing.ENABLED else ""
            message = OutboundMessage(
                notification_id=item.notification_key, tenant_id=item.tenant_key, channel=item.channel,
                recipient=recipient, subject=item.subject, body=item.body, metadata=item.metadata,
                created_at=item.created_at, attempt=item.attempt_number, headers=headers, traceparent=traceparent,
                push=item.push, html_body=item.html_body,
            )  # fmt: skip
            handle = instance.start_send(message, lambda result: self._sent(item, result, started, t0))
        except Exception as exc:  # noqa: BLE001 - a crash before the send is recorded, never lost
            self._judge(item, _crash(item, exc, self.scrub), started, t0)
            return
        if handle is None:
            handle = asyncio.get_running_loop().create_task(self._send(item, instance, message, started, t0))
        self.inflight[item.lease.item_id] = (handle, item)
        self.providers.started(item.provider_id)

    def _fan_out(self, item: Prepared, started: datetime, t0: float) -> None:
        """A push to a subscriber's devices: one send per pending device, each through the provider of
        its kind, judged as one outcome once every one has answered (push_outcome)."""
        if not item.targets and not item.any_delivered:  # every device was deactivated after it was queued
            self.recorder.add(Outcome(item.lease, "suppressed"))
            return
        fan = _FanOut(self, item, started, t0)
        self.inflight[item.lease.item_id] = (fan, item)
        self.providers.started(item.provider_id)
        fan.start()

    async def _send(
        self, item: Prepared, instance: BaseProvider, message: OutboundMessage, started: datetime, t0: float
    ) -> None:
        try:
            result = await instance.send(message)
        except asyncio.CancelledError:
            self.given_back(item)
            raise
        except Exception as exc:  # noqa: BLE001 - a crash in a provider is recorded, never lost
            result = _crash(item, exc, self.scrub)
        self._sent(item, result, started, t0)

    def _sent(self, item: Prepared, result: DeliveryResult, started: datetime, t0: float) -> None:
        """A send's callback, or its task's end."""
        if self.inflight.pop(item.lease.item_id, None) is None:
            return  # given back already
        try:
            self._judge(item, result, started, t0)  # reads the provider's entry: not evictable before
        finally:
            self._release(item)

    def _leave(self, item: Prepared) -> Any:  # noqa: ANN401
        entry = self.inflight.pop(item.lease.item_id, None)
        if entry is not None:
            self._release(item)
        return entry

    def _release(self, item: Prepared) -> None:
        self.providers.drained(item.lease.item_id, item.provider_id)
        self.capacity.set()

    def _judge(self, item: Prepared, result: DeliveryResult, started: datetime, t0: float) -> None:
        try:
            outcome = self.outcome(item, result, started, time.perf_counter() - t0)
        except Exception:  # noqa: BLE001 - a bug must still leave exactly one outcome for the item
            logger.exception("could not judge the result of delivering %s", item.notification_id)
            outcome = _unjudged(item, result, started, self.retry)
        if item.device_results is not None:
            outcome.devices = item.device_results
        elif result.deactivate and item.channel == "push":
            outcome.dead_token = self._dead_token(item, result.deactivate)
        if item.test and outcome.kind == "delivered":
            outcome.simulated = self._simulated_receipt(item)
        if tracing.ENABLED:
            self._traced(item, outcome)
        self.recorder.add(outcome)

    def _dead_token(self, item: Prepared, reason: str) -> tuple[str, tuple[str, ...], str] | None:
        """A push to a raw token that the vendor called dead: (kind, the token's blind indexes, reason),
        for the record statement to deactivate the tenant's device with that token, as a push to a
        subscriber's devices does (None: it cannot be told, which only leaves the device as it is)."""
        try:
            kind = self.providers.entries[item.provider_id].instance.kind
            return kind, crypto.blind_indexes(devices.identity_of(kind, item.recipient())), reason[:100]
        except Exception:  # noqa: BLE001 - never in the way of recording the outcome
            logger.exception("could not tell the device of the dead token %s was sent to", item.notification_id)
            return None

    @staticmethod
    def _simulated_receipt(item: Prepared) -> SimulatedReceipt | None:
        try:
            return receipt_for(item.notification_key, item.tenant_key, item.provider_id, item.channel, item.recipient())
        except Exception:  # noqa: BLE001 - never in the way of recording the outcome
            logger.exception("could not simulate the receipt of %s", item.notification_id)
            return None

    def given_back(self, item: Prepared) -> None:
        if self._leave(item) is not None:
            outcome = Outcome(lease=item.lease, kind="deferred")
            if tracing.ENABLED:
                self._traced(item, outcome)
            self.recorder.add(outcome)

    def _trace(self, item: Prepared, kind: str) -> str:
        """The item's claim and send spans (its notification's trace); the send's `traceparent`."""
        try:
            attributes = {"omnipost.provider_kind": kind, "omnipost.channel": item.channel,
                          "omnipost.attempt": item.attempt_number}  # fmt: skip
            key = item.lease.notification_key
            claimed_from, claimed_to = self.claim_window
            if not claimed_from:  # started outside a claim (tests): a claim of no length, now
                claimed_from = claimed_to = tracing.now()
            claim = tracing.child("notification.claim", key, claimed_from, claimed_to, attributes)
            span = tracing.child("notification.send", key, tracing.now(), None, attributes, parent=claim)
            self.spans[item.lease.item_id] = span
            return tracing.traceparent(span)
        except Exception:  # noqa: BLE001 - a tracing bug must never keep a notification from being sent
            logger.exception("could not trace the send of %s", item.notification_key)
            return ""

    def _traced(self, item: Prepared, outcome: Outcome) -> None:
        """End the item's send span with its outcome."""
        span = self.spans.pop(item.lease.item_id, None)
        if span is None:
            return
        attributes: dict[str, Any] = {"omnipost.outcome": outcome.kind}
        attempt = outcome.attempt
        if attempt is not None:
            if attempt.http_status is not None:
                attributes["http.response.status_code"] = attempt.http_status
            if attempt.error_code:
                attributes["omnipost.error_code"] = attempt.error_code
        error = "" if outcome.kind in ("delivered", "deferred") else (outcome.error_code or outcome.kind)
        try:
            tracing.finish(span, attributes, error=error)
        except Exception:  # noqa: BLE001 - never in the way of recording the outcome
            logger.exception("could not end the send span of %s", item.notification_key)

    def cancel_all(self) -> None:
        """Cancel every unfinished delivery and give it back now (whatever its task or callback
        does later finds it given back already)."""
        # Newest first: those still wait for a connection, and cancelling a send on the wire before
        # them would hand its slot to a waiter (a new connection for nothing).
        for handle, item in reversed(list(self.inflight.values())):
            handle.cancel()
            self.given_back(item)

    async def drain(self, grace_seconds: float, forced: Callable[[], bool]) -> None:
        """Let in-flight deliveries finish within the grace period, then give back the rest."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (0 if forced() else grace_seconds)
        while self.inflight and not forced() and (left := deadline - loop.time()) > 0:
            self.capacity.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.capacity.wait(), timeout=left)
        if not self.inflight:
            return
        tasks = [handle for handle, _ in self.inflight.values() if isinstance(handle, asyncio.Task)]
        logger.warning("grace period over: giving back %d unfinished deliveries", len(self.inflight))
        self.cancel_all()
        if tasks:  # let them end before their providers are closed
            await asyncio.gather(*tasks, return_exceptions=True)

    def outcome(self, item: Prepared, result: DeliveryResult, started: datetime, seconds: float) -> Outcome:
        """The outcome to record: dispatch.policy decides, this builds the attempt and logs."""
        if result.delivered:  # nearly every outcome: nothing more to decide
            verdict = policy.DELIVERED_VERDICT
            attempt = Attempt(
                item.attempt_number, started, datetime.now(UTC), verdict.outcome, result.error_class[:100],
                "", result.message[:500], result.http_status, int(seconds * 1000), result.provider_message_id or None,
            )  # fmt: skip
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("delivered %s", item.notification_id, extra=_log_extra(item, verdict))
            return Outcome(item.lease, "delivered", attempt)
        decision = policy.decide(result, item.attempts_this_run, self.providers.max_attempts(item.provider_id),
                                 self.retry)  # fmt: skip
        verdict = decision.verdict
        message = self.scrub(item, result.message) if result.message else ""  # before it is stored or logged
        attempt = Attempt(
            item.attempt_number, started, datetime.now(UTC), verdict.outcome, result.error_class[:100],
            verdict.error_code[:100], message[:500], result.http_status, int(seconds * 1000),
        )  # fmt: skip
        reason = f"{verdict.error_code}: {message}".strip(": ")
        log_extra = _log_extra(item, verdict)
        if decision.kind == policy.FAILED:
            logger.warning("permanent failure of %s: %s", item.notification_id, reason, extra=log_extra)
        elif decision.kind == policy.DEAD_LETTERED:
            logger.warning("%s dead-lettered after %d attempts: %s", item.notification_id, item.attempts_this_run,
                           reason, extra=log_extra)  # fmt: skip
        else:
            logger.info("%s will retry in %.1fs: %s", item.notification_id, decision.retry_delay, reason,
                        extra=log_extra)  # fmt: skip
        return Outcome(
            lease=item.lease, kind=decision.kind, attempt=attempt, retry_delay=decision.retry_delay,
            error_code=verdict.error_code, failure_reason=reason, failure_class=verdict.failure_class,
            status_code=result.http_status,
            # a transient failure moves the next try along the failover order (a permanent one never does)
            next_provider_id=self._next_provider(item) if decision.kind == policy.RETRY else None,
        )  # fmt: skip

    def _next_provider(self, item: Prepared) -> int | None:
        """The provider a retry goes through: the next in the item's failover order; for a push to
        devices, the provider of its first device still pending (its kind's next, push_outcome), so that
        the item's lane and breaker follow the device that failed."""
        if item.device_results:
            for device in item.device_results:
                if device.status == "pending" and device.provider_id is not None:
                    return device.provider_id if device.provider_id != item.provider_id else None
        return self.router.next_after(item)

    def waiting(self, item: Prepared) -> Outcome:
        """An item no provider of its order can take now (breakers open): back untried, after the backoff."""
        delay = self.retry.delay(max(1, item.attempts_this_run), None)
        logger.info("%s waits %.1fs: every provider of its failover order is open", item.notification_id, delay)
        return Outcome(lease=item.lease, kind="deferred", retry_delay=delay)

    @staticmethod
    def to_lane(item: Prepared) -> Outcome:
        """An item routed to a rate-limited provider (`lease.provider_id`): back at once, untried, to be
        claimed within that provider's tokens (routing.failover)."""
        return Outcome(lease=item.lease, kind="deferred", retry_delay=0.0, next_provider_id=item.lease.provider_id)

    def scrub(self, item: Prepared, text: str) -> str:
        """`text` without the item's recipient or its provider's secrets, in any form (providers.scrub)."""
        try:
            recipient = item.recipient()
        except Exception:  # noqa: BLE001 - unreadable (the crash being reported may be this): nothing to find
            recipient = None
        return scrub(text, recipient, self.providers.secrets(item.provider_id), channel=item.channel)


class _FanOut:
    """The sends of one push to its devices, cancelled together; their results become one (push_outcome)."""

    __slots__ = ("handles", "item", "results", "sender", "started", "t0")

    def __init__(self, sender: Sender, item: Prepared, started: datetime, t0: float) -> None:
        self.sender = sender
        self.item = item
        self.started = started
        self.t0 = t0
        self.handles: list[Any] = []
        self.results: list[tuple[Target, DeliveryResult]] = []

    def start(self) -> None:
        item, loop = self.item, asyncio.get_running_loop()
        if not item.targets:  # nothing left to send, and some device accepted before
            self.handles.append(loop.call_soon(self._finish))
            return
        for target in item.targets:
            if not target.active:  # deactivated since the notification was queued: never sent to
                self.handles.append(loop.call_soon(self._done, target, _GONE))
                continue
            if target.held:  # every provider of its kind is open (routing.failover): tried again later
                self.handles.append(loop.call_soon(self._done, target, _HELD))
                continue
            if target.throttled is not None:  # its provider's rate limit had no token: tried again later
                throttled = DeliveryResult(delivered=False, error_code="rate_limited", permanent=False,
                                           retry_after=target.throttled)  # fmt: skip
                self.handles.append(loop.call_soon(self._done, target, throttled))
                continue
            try:
                instance = SIMULATOR if item.test else self.sender.providers.entries[target.provider_id].instance
                message = OutboundMessage(
                    notification_id=item.notification_key, tenant_id=item.tenant_key, channel=item.channel,
                    recipient=target.token, subject=item.subject, body=item.body, metadata=item.metadata,
                    created_at=item.created_at, attempt=item.attempt_number, push=item.push,
                )  # fmt: skip
                handle = instance.start_send(message, lambda result, t=target: self._done(t, result))
                if handle is None:
                    handle = loop.create_task(self._await(instance, message, target))
            except Exception as exc:  # noqa: BLE001 - a crash before the send is recorded, never lost
                handle = loop.call_soon(self._done, target, _crash(item, exc, self.sender.scrub))
            self.handles.append(handle)

    async def _await(self, instance: BaseProvider, message: OutboundMessage, target: Target) -> None:
        try:
            result = await instance.send(message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a crash in a provider is recorded, never lost
            result = _crash(self.item, exc, self.sender.scrub)
        self._done(target, result)

    def _done(self, target: Target, result: DeliveryResult) -> None:
        self.results.append((target, result))
        if len(self.results) == len(self.item.targets or ()):
            self._finish()
        elif result.delivered and self.item.lease.item_id in self.sender.inflight:
            # never sent again, whatever comes
            self.sender.recorder.accept(self.item.lease, target.device_id, target.provider_id)

    def _finish(self) -> None:
        combined, self.item.device_results = push_outcome(self.item, self.results, self.sender.router)
        self.sender._sent(self.item, combined, self.started, self.t0)

    def cancel(self) -> None:
        for handle in self.handles:
            handle.cancel()


# A device deactivated after the notification was queued (by another notification's answer).
_GONE = DeliveryResult(delivered=False, error_code="device_deactivated", permanent=True)
# A device whose every provider of its kind has an open breaker: not sent this try, pending.
_HELD = DeliveryResult(delivered=False, error_code="circuit_open", permanent=False)
_ACCEPTED = DeliveryResult(delivered=True)


def push_outcome(
    item: Prepared, results: list[tuple[Target, DeliveryResult]], router: Router | None = None
) -> tuple[DeliveryResult, list[DeviceOutcome]]:
    """One result for a push's devices, and each device's: a device that accepted is `delivered`; one
    the vendor called dead `deactivated`; a permanent failure `failed`; a transient one stays
    `pending` and is tried again, through the next provider of its kind in the failover order
    (`router`; the same one without it or when the provider was named). The push is delivered once no
    device is pending and one accepted (now or before), failed when none did; while one is pending,
    it is that transient failure (the longest Retry-After among them)."""
    devices: list[DeviceOutcome] = []
    transient: list[DeliveryResult] = []
    permanent: list[DeliveryResult] = []
    accepted = item.any_delivered
    key = item.notification_id
    for target, result in results:
        through = target.provider_id
        if result.delivered:
            accepted = True
            device = DeviceOutcome(key, target.device_id, "delivered", provider_id=through)
            device.sent_outcome = "delivered"
        elif result is _GONE:
            permanent.append(result)
            devices.append(DeviceOutcome(key, target.device_id, "deactivated", result.error_code))
            continue  # never sent
        elif result.deactivate:
            permanent.append(result)
            device = DeviceOutcome(key, target.device_id, "deactivated", result.error_code, result.deactivate[:100],
                                   through)  # fmt: skip
            device.sent_outcome = "permanent_error"
        elif classify(result).permanent:
            permanent.append(result)
            device = DeviceOutcome(key, target.device_id, "failed", classify(result).error_code[:100],
                                   provider_id=through)  # fmt: skip
            device.sent_outcome = "permanent_error"
        else:
            transient.append(result)
            # held and throttled devices stay where they are: their provider was never asked
            held = result is _HELD or target.throttled is not None
            after = router.next_for_device(item, through) if router is not None and not held else through
            device = DeviceOutcome(key, target.device_id, "pending", classify(result).error_code[:100],
                                   provider_id=after)  # fmt: skip
            if held:
                devices.append(device)
                continue  # not sent
            device.sent_outcome = "transient_error"
        if not item.test:  # a test push's device answered the simulator: no provider's send to count
            device.sent_through, device.http_status = through, result.http_status
        devices.append(device)
    if transient:
        return max(transient, key=lambda r: r.retry_after or 0.0), devices
    if accepted:
        return _ACCEPTED, devices
    return replace(permanent[0], permanent=True) if permanent else _GONE, devices


def _crash(item: Prepared, exc: Exception, clean: Callable[[Prepared, str], str]) -> DeliveryResult:
    # The traceback is logged as scrubbed text: the exception's message may hold the recipient or a secret.
    trace = clean(item, "".join(traceback.format_exception(exc)).rstrip())
    logger.error("provider crashed delivering %s\n%s", item.notification_id, trace)
    return DeliveryResult(
        delivered=False, error_code="provider_crash", error_class=type(exc).__name__,
        message=clean(item, str(exc))[:200],
    )  # fmt: skip


def _unjudged(item: Prepared, result: DeliveryResult, started: datetime, retry: RetryPolicy) -> Outcome:
    """The outcome of a send whose result could not be judged (a bug in the policy): delivered
    stays delivered (never sent again); anything else is retried after the first backoff, as a
    transient failure, so the item is neither lost nor held until its lease runs out."""
    delivered = bool(getattr(result, "delivered", False))
    outcome = "delivered" if delivered else "transient_error"
    attempt = Attempt(item.attempt_number, started, datetime.now(UTC), outcome, "", "" if delivered else "judge_error")
    if delivered:
        return Outcome(item.lease, "delivered", attempt)
    return Outcome(item.lease, "retry", attempt, retry_delay=retry.delay(1, None), error_code="judge_error",
                   failure_reason="judge_error", failure_class="transient")


def _log_extra(item: Prepared, verdict: Classification) -> dict[str, Any]:
    return {
        "notification_id": item.notification_key,
        "tenant_id": item.tenant_key,
        "attempt": item.attempt_number,
        "outcome": verdict.outcome,
        "error_code": verdict.error_code,
    }
