"""SMTP receipts end to end, every part real: a dispatcher process sends to an SMTP server on
loopback with its VERP return path; remote MTAs' reports are mailed (smtplib) to that return path at
a `run_bounce_listener` process; the notifications' receipts and events show them."""

from __future__ import annotations

import signal
import smtplib

import pytest
from django.db import connection

from notifications import verp
from notifications.models import Notification
from receipts.models import NotificationEvent, ReceiptCounter
from tests import factories
from tests.queueing.dispatch_support import start_dispatchers, wait_exit
from tests.receipts.test_bounce_listener_process import DOMAIN, mail, start_listener
from tests.receipts.test_bounce_parsing import sample
from tests.support.receivers import SmtpSink

FROM = "alerts@omnipost.example"


@pytest.mark.django_db(transaction=True)
def test_a_real_send_its_bounce_and_a_complaint_reach_the_notifications(
    tenant_a, tenant_b, subprocess_env, tmp_path, settings
):
    settings.OMNIPOST_BOUNCE_DOMAIN = DOMAIN
    env = {**subprocess_env, "OMNIPOST_BOUNCE_DOMAIN": DOMAIN}
    with SmtpSink(max_seconds=60) as sink:
        config = {"host": "127.0.0.1", "port": sink.port, "from_email": FROM}
        prov = factories.provider(tenant_a, "mail", channel="email", kind="smtp", config=config, secrets={})
        sent = factories.queued(tenant_a, prov, 3, recipient="jane.doe@example.com")
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

