# Category, Subscriber and Suppression now belong to recipients (recipients/0001 holds their state and
# content types): they are forgotten here, in Django's state only; their tables stay as they are.
# Nothing has a foreign key to them.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0021_provider_in_providers'),
        ('recipients', '0001_initial'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='Category',
                ),
                migrations.DeleteModel(
                    name='Subscriber',
                ),
                migrations.DeleteModel(
                    name='Suppression',
                ),
            ],
        ),
    ]
