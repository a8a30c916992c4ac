from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("core", "0002_audit_append_only_trigger")]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="config_version",
            field=models.PositiveBigIntegerField(default=0, editable=False),
        ),
    ]
