# A claim now writes only lock_token, locked_until and attempts (no indexed column), so it is a HOT
# update whenever its new row version fits on the row's page; every one that does not fit writes an
# entry into each of queue_state's indexes whose predicate the row meets (nine for a ready item). The
# new version is about 16–24 bytes longer than a fresh row's (the lease's columns were NULL): at a
# fillfactor of 50 a page of 145-byte rows (an item with a small payload) had room for the claim of
# only about 22 of its 25 rows (88 % HOT, per_delivery.py); at 45 it holds 23 and room for all 23.
# New pages only: pages already written keep their rows where they are.

from django.db import migrations

FILLFACTOR = 45
PREVIOUS = 50


class Migration(migrations.Migration):

    dependencies = [
        ("queueing", "0009_plain_ids"),
    ]

    operations = [
        migrations.RunSQL(
            f"ALTER TABLE queue_state SET (fillfactor = {FILLFACTOR})",
            f"ALTER TABLE queue_state SET (fillfactor = {PREVIOUS})",
        ),
    ]
