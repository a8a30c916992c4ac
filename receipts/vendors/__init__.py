"""One module per provider kind; importing it registers its adapter (`receipts.inbound.adapter`)."""

from receipts.vendors import ses  # noqa: F401
