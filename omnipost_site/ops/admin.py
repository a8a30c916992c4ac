"""Adds the operations dashboard (omnipost_site.ops.dashboard) to the admin site's URLs."""

from __future__ import annotations

from omnipost_site.ops.dashboard import install

install()
