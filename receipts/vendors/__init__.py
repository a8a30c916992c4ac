"""One module per provider kind; importing it registers its adapter (`receipts.inbound.adapter`)."""

from receipts.vendors import sendgrid, twilio  # noqa: F401  (registration)
