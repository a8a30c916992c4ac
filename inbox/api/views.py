"""The subscriber's API, /inbox/v1/: its feed, counts and the states of its items, authenticated by an
inbox token (one subscriber of one tenant); another subscriber's item is 404."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.db import connection, transaction
from django.http import Http404, HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.pagination import StrictCursorPagination
from core.api.viewsets import as_uuid
from core.models import Tenant
from core.validation import NAME, FieldErrors
from inbox import engagement, statements
from inbox.api.authentication import InboxTokenAuthentication, IsInboxSubscriber, StreamTokenAuthentication
from inbox.models import InboxItem
from recipients import services as recipient_services
from recipients.models import Category, Subscriber

STATUSES = ("all", "unread", "unseen", "archived")


class ItemSerializer(serializers.ModelSerializer):
    class Meta:
        model = InboxItem
        fields = statements.ITEM_COLUMNS


@extend_schema(exclude=True)  # the subscriber's API, not the tenant's: documented in the README
class InboxView(APIView):
    authentication_classes = (InboxTokenAuthentication,)
    permission_classes = (IsInboxSubscriber,)
    throttle_classes = ()
    query_params_allowed: tuple[str, ...] = ()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        unknown = sorted(name for name in request.query_params if name not in self.query_params_allowed)
        if unknown:
            hint = ", ".join(self.query_params_allowed) or "none"
            raise ValidationError({name: [f"unknown query parameter; allowed: {hint}"] for name in unknown})

    def feed(self) -> Any:  # noqa: ANN401
        who = self.request.user
        return InboxItem.objects.for_tenant(who.tenant_id).filter(subscriber=who.external_id)


class FeedView(InboxView):
    """GET feed: newest first; `status` all (not archived) | unread | unseen | archived; `category`."""

    query_params_allowed = ("status", "category", "cursor", "limit")

    def get(self, request: Request) -> Response:
        wanted = request.query_params.get("status", "all")
        if wanted not in STATUSES:
            raise ValidationError({"status": [f"must be one of {', '.join(STATUSES)}"]})
        items = self.feed()
        if wanted == "archived":
            items = items.filter(archived_at__isnull=False)
        else:
            items = items.filter(archived_at__isnull=True)
            if wanted == "unread":
                items = items.filter(read_at__isnull=True)
            elif wanted == "unseen":
                items = items.filter(seen_at__isnull=True)
        category = request.query_params.get("category")
        if category is not None:
            if not NAME.fullmatch(category):
                raise ValidationError({"category": ["must be a category key"]})
            items = items.filter(category=category)
        paginator = StrictCursorPagination()
        page = paginator.paginate_queryset(items.only(*statements.ITEM_COLUMNS), request, view=self)
        return paginator.get_paginated_response(ItemSerializer(page, many=True).data)


class CountsView(InboxView):
    """GET counts: unseen, unread and total over the items not archived."""

    def get(self, request: Request) -> Response:
        return Response(statements.counts(request.user.tenant_id, request.user.external_id))


class ItemActionView(InboxView):
    """POST feed/{id}/seen | read | unread | archive | unarchive: 200 with the item; repeating changes nothing."""

    def post(self, request: Request, item_id: str, action: str) -> Response:
        if action not in statements.ACTIONS:
            raise NotFound()
        who = request.user
        with transaction.atomic():
            changed = statements.change(who.tenant_id, who.external_id, as_uuid(item_id), action)
            if changed is None:
                raise NotFound()
            item, first = changed
            with connection.cursor() as cursor:
                engagement.record(cursor, who.tenant_id, [(item["notification_id"], kind) for kind in first])
        return Response(ItemSerializer(item).data)


class MarkAllView(InboxView):
    """POST feed/mark-all {"state": "seen" | "read" | "archived", "category"?} → {"updated": n}."""

    def post(self, request: Request) -> Response:
        data = request.data if isinstance(request.data, dict) else {}
        errors: dict[str, list[str]] = {}
        unknown = sorted(set(data) - {"state", "category"})
        for name in unknown:
            errors[name] = ["unknown field; allowed: state, category"]
        state = data.get("state")
        if state not in statements.MARK_ALL_STATES:
            errors["state"] = [f"required: one of {', '.join(statements.MARK_ALL_STATES)}"]
        category = data.get("category")
        if category is not None and not (isinstance(category, str) and NAME.fullmatch(category)):
            errors["category"] = ["must be a category key"]
        if errors or not isinstance(request.data, dict):
            raise ValidationError(errors or {"non_field_errors": ["must be a JSON object"]})
        who = request.user
        with transaction.atomic():
            changed = statements.mark_all(who.tenant_id, who.external_id, state, category)
            with connection.cursor() as cursor:
                engagement.record(cursor, who.tenant_id, [(nid, kind) for nid, first in changed for kind in first])
        return Response({"updated": len(changed)}, status=status.HTTP_200_OK)


class PreferencesView(InboxView):
    """GET/PATCH preferences: the subscriber's own `{"<category>": {"<channel>": true|false}}`; PATCH
    merges the mapping given into them; a critical category cannot be turned off (400)."""

    def get(self, request: Request) -> Response:
        who = request.user
        found = Subscriber.objects.for_tenant(who.tenant_id).filter(external_id=who.external_id)
        preferences = found.values_list("preferences", flat=True).first()
        if preferences is None and not found.exists():
            raise NotFound()
        return Response(preferences or {})

    def patch(self, request: Request) -> Response:
        who = request.user
        tenant = Tenant.objects.get(pk=who.tenant_id)
        try:
            given = recipient_services.clean_preferences(request.data, tenant)
        except FieldErrors as exc:
            raise ValidationError(exc.errors) from None
        critical = set(Category.objects.for_tenant(tenant).filter(critical=True).values_list("key", flat=True))
        refused = sorted(c for c, channels in given.items() if c in critical and False in channels.values())
        if refused:
            raise ValidationError({"preferences": [f"{', '.join(refused)}: critical, cannot be turned off"]})
        with transaction.atomic():
            current = (
                Subscriber.objects.for_tenant(tenant).select_for_update().filter(external_id=who.external_id)
                .values_list("preferences", flat=True).first()
            )  # fmt: skip
            if (
                current is None
                and not Subscriber.objects.for_tenant(tenant).filter(external_id=who.external_id).exists()
            ):
                raise NotFound()
            merged = {k: dict(v) for k, v in (current or {}).items()}
            for category, channels in given.items():
                merged.setdefault(category, {}).update(channels)
            subscriber = recipient_services.patch_subscriber(tenant, who.external_id, {"preferences": merged})
        if subscriber is None:
            raise NotFound()
        return Response(subscriber.preferences or {})


class StreamRedirectView(InboxView):
    """GET stream on a process that does not serve it (the Procfile's WSGI `web`): `307` to the same
    path and query on OMNIPOST_STREAM_URL, the `stream` process, once the token is checked (a bad one
    is `401` here). The answer carries CORS as the rest of /inbox/v1/, which a browser needs to follow
    it. A browser sends `Origin: null` on a request redirected across origins, so the location names
    the origin this request came from (`redirected_from`; the stream grants `null` only with an origin
    the tenant allows there, inbox.live). EventSource reconnects to the stream process directly, and
    browsers drop `Authorization` across origins: give the token as `?token=`."""

    authentication_classes = (StreamTokenAuthentication,)
    query_params_allowed = ("token", "last_event_id", "redirected_from")

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:  # noqa: ANN401
        return super().perform_content_negotiation(request, force=True)  # EventSource accepts only text/event-stream

    def get(self, request: Request) -> HttpResponse:
        if not settings.OMNIPOST_STREAM_URL:
            raise Http404
        query = {k: v for k, v in request.query_params.items() if k != "redirected_from"}
        origin = request.headers.get("Origin")
        if origin and origin != "null":
            query["redirected_from"] = origin
        response = HttpResponse(status=307)
        response["Location"] = f"{settings.OMNIPOST_STREAM_URL}{request.path}?{urlencode(query)}"
        response["Cache-Control"] = "no-store"
        return response
