"""Event webhooks to tenants (CONTRACT.md §13): endpoints, the events they subscribe to, and their delivery."""
