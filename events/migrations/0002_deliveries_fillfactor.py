from django.db import migrations

# Room on each page for the claim's new row version (lock_token, locked_until, attempts: no indexed
# column), so a claim is a HOT update that adds no index entry.
FILLFACTOR = {"event_deliveries": 80}


def set_fillfactor(apps, schema_editor):
    for table, percent in FILLFACTOR.items():
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(percent)})")


def reset_fillfactor(apps, schema_editor):
    for table in FILLFACTOR:
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [("events", "0001_initial")]

    operations = [migrations.RunPython(set_fillfactor, reset_fillfactor)]
