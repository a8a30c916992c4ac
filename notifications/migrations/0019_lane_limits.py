# Each provider with a rate limit gets its lane's row in queueing's lane_limits, from which the queue
# decides whether a new item is rate-limited (providers.lanes keeps it in sync from now on).

from django.db import migrations


def fill_lane_limits(apps, schema_editor):
    Provider = apps.get_model("notifications", "Provider")
    LaneLimit = apps.get_model("queueing", "LaneLimit")
    limited = Provider.objects.using(schema_editor.connection.alias).filter(rate_per_second__isnull=False)
    LaneLimit.objects.using(schema_editor.connection.alias).bulk_create(
        [
            LaneLimit(lane_id=p.pk, tenant_id=p.tenant_id, rate_per_second=p.rate_per_second, burst=p.burst)
            for p in limited.only("pk", "tenant_id", "rate_per_second", "burst").iterator()
        ],
        batch_size=1000,
        ignore_conflicts=True,
    )


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0018_fallback'),
        ('queueing', '0008_lane_limits'),
    ]

    operations = [
        migrations.RunPython(fill_lane_limits, migrations.RunPython.noop),
    ]
