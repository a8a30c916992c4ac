"""What a migration needs when models move from one app to another, table and all: the state moves
(`SeparateDatabaseAndState`, written in each migration), and the content types move with them, so
the permissions that groups and users hold on the models (by content type) stay theirs, and the
admin's history keeps pointing at them.

Only for migrations: imports nothing of the apps, and reads the historical models it is handed."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import migrations

DEPENDENCIES = [("contenttypes", "0002_remove_content_type_name"), ("auth", "0012_alter_user_first_name_max_length")]


def _move(apps, schema_editor, old_label: str, new_label: str, models: Iterable[str]) -> None:  # noqa: ANN001
    content_types = apps.get_model("contenttypes", "ContentType").objects.using(schema_editor.connection.alias)
    permissions = apps.get_model("auth", "Permission").objects.using(schema_editor.connection.alias)
    for model in models:
        old = content_types.filter(app_label=old_label, model=model).first()
        if old is None:  # a database that never had it (a fresh one: content types come after migrate)
            continue
        new = content_types.filter(app_label=new_label, model=model).first()
        if new is None:
            content_types.filter(pk=old.pk).update(app_label=new_label)
            continue
        # Both exist (the new label's was made by a post_migrate in between): the holders of the old
        # permissions get the new ones, then the old content type goes with its permissions.
        for permission in permissions.filter(content_type=old):
            twin = permissions.filter(content_type=new, codename=permission.codename).first()
            if twin is None:
                permissions.filter(pk=permission.pk).update(content_type=new)
                continue
            twin.group_set.add(*permission.group_set.all())
            twin.user_set.add(*permission.user_set.all())
            permission.delete()
        old.delete()
    content_types.model.objects.clear_cache()


def move_content_types(old_label: str, new_label: str, models: Iterable[str]) -> migrations.RunPython:
    """The operation that renames the content types of `models` (lowercase model names) from
    `old_label` to `new_label`, and back when unapplied."""
    models = tuple(models)
    return migrations.RunPython(
        lambda apps, schema_editor: _move(apps, schema_editor, old_label, new_label, models),
        lambda apps, schema_editor: _move(apps, schema_editor, new_label, old_label, models),
    )
