# Event endpoint URLs are now refused when they hold whitespace or control characters
# (core.http.split_url); before, urlsplit dropped TAB, CR and LF ahead of the check, so a URL such as
# ".../c2\r\nX-Injected:1" could be stored. Such an endpoint can no longer be sent to (each try would
# fail until the endpoint is disabled after OMNIPOST_EVENT_ENDPOINT_DISABLE_AFTER_HOURS): it is
# disabled now, with the reason, and its events are kept for `recover` once the tenant PATCHes a url.

from django.db import migrations

DISABLE = r"""
UPDATE event_endpoints
SET enabled = false,
    disabled_reason = 'url holds whitespace or control characters: PATCH a new url, then {"enabled": true}',
    updated_at = now()
WHERE enabled AND url ~ '[[:space:][:cntrl:]]'
"""


class Migration(migrations.Migration):

    dependencies = [
        ('events', '0004_outcome_batches'),
    ]

    operations = [
        migrations.RunSQL(DISABLE, reverse_sql=migrations.RunSQL.noop, elidable=True),
    ]
