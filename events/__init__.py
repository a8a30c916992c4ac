"""Event webhooks to tenants: endpoints, the events they subscribe to, and their delivery."""
