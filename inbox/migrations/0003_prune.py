from django.db import migrations, models

# Rows leave inbox_items only by DELETE statements that do not know the feeds' counts (`manage.py
# prune`, core.retention; a tenant's deletion), so one trigger per statement takes what they deleted
# off its subscribers' counts rows: one UPDATE per statement, never one per item. Its UPDATE fires
# inbox_counts' notify trigger, so open streams get the new counts. The counts rows are locked in
# (tenant, subscriber) order first, as the record statement's upsert takes them, so two such
# statements cannot deadlock each other on them. Deleting only archived items changes no count.
TRIGGER = """
CREATE FUNCTION inbox_items_uncount() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM inbox_counts c
    WHERE (c.tenant_id, c.subscriber) IN (SELECT tenant_id, subscriber FROM gone_rows WHERE archived_at IS NULL)
    ORDER BY c.tenant_id, c.subscriber FOR UPDATE;
    UPDATE inbox_counts c
    SET unseen = c.unseen - d.unseen, unread = c.unread - d.unread, total = c.total - d.total
    FROM (SELECT tenant_id, subscriber, count(*) FILTER (WHERE seen_at IS NULL) AS unseen,
                 count(*) FILTER (WHERE read_at IS NULL) AS unread, count(*) AS total
          FROM gone_rows WHERE archived_at IS NULL GROUP BY 1, 2) d
    WHERE c.tenant_id = d.tenant_id AND c.subscriber = d.subscriber;
    RETURN NULL;
END $$;
CREATE TRIGGER inbox_items_uncount AFTER DELETE ON inbox_items
    REFERENCING OLD TABLE AS gone_rows FOR EACH STATEMENT EXECUTE FUNCTION inbox_items_uncount();
"""
UNTRIGGER = """
DROP TRIGGER inbox_items_uncount ON inbox_items;
DROP FUNCTION inbox_items_uncount();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("inbox", "0002_stream"),
    ]

    operations = [
        migrations.AddField(
            model_name="inboxitem",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunSQL(TRIGGER, UNTRIGGER),
    ]
