"""One module per provider kind; importing it registers its adapter (`receipts.inbound.adapter`)."""
