from core.models.api_keys import ApiKey
from core.models.audit import AuditEvent, AuditLogIsAppendOnly
from core.models.tenancy import Tenant, TenantMembership, TenantOwned, TenantQuerySet

__all__ = [
    "ApiKey",
    "AuditEvent",
    "AuditLogIsAppendOnly",
    "Tenant",
    "TenantMembership",
    "TenantOwned",
    "TenantQuerySet",
]
