from core.models.api_keys import ApiKey
from core.models.audit import AuditEvent, AuditLogIsAppendOnly
from core.models.tenancy import (
    ModeOwnedQuerySet,
    Tenant,
    TenantMembership,
    TenantOwned,
    TenantQuerySet,
    in_mode,
    mode_of,
)

__all__ = [
    "ApiKey",
    "AuditEvent",
    "AuditLogIsAppendOnly",
    "ModeOwnedQuerySet",
    "Tenant",
    "TenantMembership",
    "TenantOwned",
    "TenantQuerySet",
    "in_mode",
    "mode_of",
]
