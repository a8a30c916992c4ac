"""SMTP receipts end to end, every part real: a dispatcher process sends to an SMTP server on
loopback with its VERP return path; remote MTAs' reports are mailed (smtplib) to that return path at
a `run_bounce_listener` process; the notifications' receipts and events show them, the bounced and
the complaining addresses are suppressed, and the tenant's event endpoint (verified with
`standardwebhooks`) gets each outcome, receipt and suppression from dispatcher processes."""

from __future__ import annotations

import signal
import smtplib

import pytest
from django.db import connection

from notifications.models import DeliveryAttempt, Notification
from providers import verp
from receipts.models import NotificationEvent, ReceiptCounter
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit
from tests.receipts.event_support import add_endpoint, deliver_events, suppressions
from tests.receipts.test_bounce_listener_process import DOMAIN, mail, start_listener
from tests.receipts.test_bounce_parsing import sample
from tests.support.receivers import SmtpSink

FROM = "alerts@omnipost.example"
BOUNCER, COMPLAINER, BYSTANDER = "jane.doe@example.com", "john.roe@example.com", "ann.poe@example.com"


@pytest.mark.django_db(transaction=True)
def test_a_real_send_its_bounce_and_a_complaint_reach_the_notifications(  # noqa: PLR0913, PLR0915
    tenant_a, tenant_b, subprocess_env, tmp_path, settings, api_a, event_receiver
):
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN
    env = {**subprocess_env, "OMNIPOST_BOUNCE_DOMAIN": DOMAIN}
    with SmtpSink(max_seconds=60) as sink:
        config = {"host": "127.0.0.1", "port": sink.port, "from_email": FROM}
        prov = factories.provider(tenant_a, "mail", channel="email", kind="smtp", config=config, secrets={})
        endpoint = add_endpoint(api_a, event_receiver)  # the tenant's own system, subscribed to every type
        sent = [factories.queued(tenant_a, prov, 1, recipient=a)[0] for a in (BOUNCER, COMPLAINER, BYSTANDER)]
        (dispatcher,) = start_dispatchers(1, env, "--once", log_dir=tmp_path)
        assert wait_exit([dispatcher], 60) == [0], (tmp_path / "dispatcher0.log").read_text()
        assert sink.wait_for(3, timeout=5)
    return_paths = {mail.message["X-OmniPost-Notification-Id"]: mail.mail_from for mail in sink.messages}
    assert {m.message["From"] for m in sink.messages} == {FROM}
    bounced, complained, untouched = (str(n.pk) for n in sent)
    for nid, path in return_paths.items():
        assert path.endswith("@" + DOMAIN) and verp.read_address(path) == verp.VerpTarget(prov.pk, nid)

    other_prov = factories.provider(tenant_b, "mail", channel="email", kind="smtp", config=config, secrets={})
    listener, port = start_listener(env, tmp_path / "listener.log")
    try:
        hard = sample("postfix_user_unknown.eml", return_paths[bounced])
        assert mail(port, [return_paths[bounced]], hard) == {}
        assert mail(port, [return_paths[bounced]], hard) == {}  # the MTA's retry: one event
        # A later "delivered" report never hides the bounce.
        mail(port, [return_paths[bounced]], sample("postfix_success.eml", return_paths[bounced]))
        # The listener's database session is terminated (a restart, a failover): the next report
        # still gets its 250, on a new session.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s AND datname = current_database()",
                [f"omnipost-bounces-{listener.pid}"],
            )
            assert cursor.fetchone()[0] == 1
        assert mail(port, [return_paths[complained]], sample("arf_yahoo_style.eml", return_paths[complained])) == {}
        # A valid token of another tenant's provider naming this tenant's notification: accepted, ignored.
        foreign = verp.return_path(other_prov.pk, untouched)
        assert mail(port, [foreign], sample("gmail_no_such_user.eml", foreign)) == {}
        # A forged token never gets past RCPT.
        token = return_paths[untouched].split("@")[0]
        forged = f"{token[:-3]}{'aaa' if token[-3:] != 'aaa' else 'bbb'}@{DOMAIN}"
        with pytest.raises(smtplib.SMTPRecipientsRefused):
            mail(port, [forged], sample("gmail_no_such_user.eml", forged))
        listener.send_signal(signal.SIGTERM)
        assert listener.wait(timeout=15) == 0
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()

    rows = {str(n.pk): n for n in Notification.objects.filter(pk__in=[n.pk for n in sent])}
    assert (rows[bounced].status, rows[bounced].receipt, rows[bounced].bounce_type) == ("delivered", "bounced", "hard")
    assert (rows[complained].receipt, rows[complained].bounce_type) == ("complained", None)
    assert (rows[untouched].receipt, rows[untouched].bounce_type) == (None, None)

    events = list(NotificationEvent.objects.filter(notification_id=bounced).order_by("occurred_at"))
    assert [(e.type, e.receipt, e.bounce_type) for e in events] == [
        ("bounced", "bounced", "hard"), ("delivered", "delivered", None)
    ]  # fmt: skip
    assert events[0].provider_id == prov.pk and events[0].details["status"] == "5.1.1"
    assert "jane.doe" not in str(events[0].details)
    assert NotificationEvent.objects.filter(notification_id=complained, receipt="complained").count() == 1
    assert not NotificationEvent.objects.filter(notification_id=untouched).exists()
    foreign_count = ReceiptCounter.objects.filter(provider_id=other_prov.pk, reason="foreign").values_list("count")
    assert sum(c for (c,) in foreign_count) == 1  # omnipost_receipts_ignored_total
    log = (tmp_path / "listener.log").read_text()
    assert "Traceback" not in log and "jane.doe" not in log

    # The API shows the same: `receipt`, `bounce_type` and `events`, oldest first.
    shown = api_a.get(f"/api/v1/notifications/{bounced}").json()
    assert (shown["receipt"], shown["bounce_type"]) == ("bounced", "hard")
    assert [(e["type"], e["provider"]) for e in shown["events"]] == [("bounced", "mail"), ("delivered", "mail")]
    assert api_a.get(f"/api/v1/notifications/{complained}").json()["receipt"] == "complained"

    # The hard bounce and the complaint suppress their addresses; the untouched one is not.
    [bounce_entry] = suppressions(api_a, BOUNCER)
    [complaint_entry] = suppressions(api_a, COMPLAINER)
    assert (bounce_entry["reason"], bounce_entry["channel"], bounce_entry["source_notification_id"]) == (
        "hard_bounce", "email", bounced)  # fmt: skip
    assert (complaint_entry["reason"], complaint_entry["source_notification_id"]) == ("complaint", complained)
    assert suppressions(api_a, BYSTANDER) == []
    # The next email to a suppressed address is stored `suppressed` and never sent.
    blocked = api_a.post("/api/v1/notifications", {"channel": "email", "provider": "mail", "recipient": BOUNCER,
                                                   "subject": "Again", "body": "b"}, format="json")  # fmt: skip
    assert blocked.status_code == 201 and blocked.json()["status"] == "suppressed", blocked.content

    # One more dispatcher process delivers the receipts' events to the tenant's endpoint.
    deliver_events(env, tmp_path)
    assert Notification.objects.get(pk=blocked.json()["id"]).status == "suppressed"
    assert not DeliveryAttempt.objects.filter(notification_id=blocked.json()["id"]).exists()
    delivered = endpoint.of_type("notification.delivered")  # from the first dispatcher, before it exited
    assert sorted(e["data"]["notification_id"] for e in delivered) == sorted([bounced, complained, untouched])
    [hard] = endpoint.of_type("notification.bounced")  # the MTA's retry and the later success: no more
    assert {k: hard["data"][k] for k in ("notification_id", "receipt", "bounce_type", "channel", "provider")} == {
        "notification_id": bounced, "receipt": "bounced", "bounce_type": "hard", "channel": "email",
        "provider": "mail"}  # fmt: skip
    assert hard["data"]["recipient_masked"] == rows[bounced].recipient_masked
    [complaint] = endpoint.of_type("notification.complained")
    assert (complaint["data"]["notification_id"], complaint["data"]["receipt"]) == (complained, "complained")
    suppressed = {e["data"]["reason"]: e["data"] for e in endpoint.of_type("recipient.suppressed")}
    assert suppressed == {
        "hard_bounce": {"suppression_id": bounce_entry["id"], "recipient_masked": bounce_entry["recipient_masked"],
                        "channel": "email", "reason": "hard_bounce", "category": None,
                        "source_notification_id": bounced},
        "complaint": {"suppression_id": complaint_entry["id"], "recipient_masked": complaint_entry["recipient_masked"],
                      "channel": "email", "reason": "complaint", "category": None,
                      "source_notification_id": complained},
    }  # fmt: skip
    assert len(endpoint.events()) == 3 + 1 + 1 + 2
    assert all(address not in endpoint.bodies() for address in (BOUNCER, COMPLAINER, BYSTANDER))
