# Receipt events stored before vendors' date-times were held to core.validation's range
# (1970-01-01 to 9999-12-30 UTC) may lie where psycopg cannot read them back (before year 1 in UTC,
# from "0001-01-01T00:00:00+14:00"): such a row made its notification's detail answer 500 for ever,
# and the admin's event list with it. They are moved to the range's nearest end. Day partitions have
# bounded ranges, so the WHERE prunes to the default partition (the rows older than the day partitions).

from django.db import migrations

CLAMP = """
UPDATE notification_events
SET occurred_at = least(greatest(occurred_at, '1970-01-01T00:00:00Z'::timestamptz),
                        '9999-12-30T23:59:59.999999Z'::timestamptz)
WHERE occurred_at < '1970-01-01T00:00:00Z'::timestamptz OR occurred_at >= '9999-12-31T00:00:00Z'::timestamptz
"""


class Migration(migrations.Migration):

    dependencies = [
        ('receipts', '0003_provider_in_providers'),
    ]

    operations = [
        migrations.RunSQL(CLAMP, reverse_sql=migrations.RunSQL.noop, elidable=True),
    ]
