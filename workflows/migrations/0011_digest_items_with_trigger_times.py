# A digest window's items become [trigger time in µs, data] pairs, kept oldest trigger first. Items of a
# window open at the upgrade are given the times 1, 2, …: older than any trigger, in their order.

from django.db import migrations

FORWARD = """
UPDATE workflow_digests SET items = COALESCE(
    (SELECT jsonb_agg(jsonb_build_array(n, e) ORDER BY n) FROM jsonb_array_elements(items) WITH ORDINALITY AS x(e, n)),
    '[]'::jsonb)
"""
BACKWARD = """
UPDATE workflow_digests SET items = COALESCE(
    (SELECT jsonb_agg(e -> 1 ORDER BY n) FROM jsonb_array_elements(items) WITH ORDINALITY AS x(e, n)), '[]'::jsonb)
"""


class Migration(migrations.Migration):

    dependencies = [
        ('workflows', '0010_fanout_cancels'),
    ]

    operations = [
        migrations.RunSQL(FORWARD, BACKWARD),
    ]
