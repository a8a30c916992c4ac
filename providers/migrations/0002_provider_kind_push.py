from django.db import migrations, models


class Migration(migrations.Migration):
    """The native push kinds: choices only, no schema change."""

    dependencies = [
        ('providers', '0001_initial'),
    ]

    operations = [
        migrations.AlterField(
            model_name='provider',
            name='kind',
            field=models.CharField(choices=[('webhook', 'Webhook'), ('smtp', 'Smtp'), ('twilio', 'Twilio'), ('sendgrid', 'SendGrid'), ('console', 'Console'), ('ses', 'Ses'), ('fcm', 'FCM'), ('apns', 'APNs'), ('webpush', 'Web Push')], max_length=10),
        ),
    ]
