"""The channels a notification goes out on. Every room names them (a provider serves channels, a
template and a suppression belong to one, a subscriber has an address for some), so they live here."""

from __future__ import annotations

from django.db import models


class Channel(models.TextChoices):
    EMAIL = "email"
    SMS = "sms"
    PUSH = "push"
    WEBHOOK = "webhook"
    IN_APP = "in_app", "In-app"


CHANNELS = tuple(Channel.values)
