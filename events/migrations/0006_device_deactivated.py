from django.db import migrations, models


class Migration(migrations.Migration):
    """`device.deactivated`: a choice only, no schema change."""

    dependencies = [
        ('events', '0005_disable_urls_with_whitespace'),
    ]

    operations = [
        migrations.AlterField(
            model_name='event',
            name='type',
            field=models.CharField(choices=[('notification.delivered', 'Delivered'), ('notification.failed', 'Failed'), ('notification.dead_lettered', 'Dead Lettered'), ('notification.bounced', 'Bounced'), ('notification.complained', 'Complained'), ('recipient.suppressed', 'Suppressed'), ('device.deactivated', 'Device Deactivated')], max_length=40),
        ),
    ]
