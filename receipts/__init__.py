"""Delivery receipts: what providers report after they accepted a message.

`receipts.inbound` is the contract between the vendor adapters (`receipts.vendors.*`, one module
per provider kind) and the rest: an adapter authenticates one inbound request by the vendor's own
signature scheme and turns it into `Receipt`s; `receipts.services` applies them to notifications.
"""
