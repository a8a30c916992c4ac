"""The simulator's receipts (providers.simulator), applied as a vendor's callback is: through
`apply_receipts`, with its events, suppressions (within the test data: the notification is test
data) and outbound events. One apply per provider and tenant of the batch."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from providers.simulator import KIND, SimulatedReceipt
from receipts.inbound import ProviderView, Receipt
from receipts.services import apply_receipts


def apply_simulated(receipts: Sequence[SimulatedReceipt]) -> int:
    """Apply what the simulator reported; returns the receipts stored."""
    by_provider: dict[tuple[int, str], list[Receipt]] = defaultdict(list)
    for r in receipts:
        by_provider[(r.provider_id, r.tenant_id)].append(
            Receipt(
                notification_id=r.notification_id,
                type=r.receipt,
                occurred_at=r.occurred_at,
                receipt=r.receipt,
                bounce_type=r.bounce_type,
                details={"simulator": True},
                event_id=f"simulator:{r.notification_id}",
            )
        )
    applied = 0
    for (provider_id, tenant_id), batch in by_provider.items():
        view = ProviderView(id=provider_id, tenant_id=tenant_id, kind=KIND, config={}, secrets={})
        applied += apply_receipts(view, batch).applied
    return applied
