"""FCM provider: Firebase Cloud Messaging's HTTP v1 API with a service account.

`POST {base_url}/v1/projects/{project_id}/messages:send` with `Authorization: Bearer <access token>`.
The access token comes from an OAuth 2.0 JWT-bearer grant (RFC 7523) at `token_url`: an assertion
signed RS256 with the service account's key (`iss` = its client_email, `scope` =
firebase.messaging, `aud` = token_url, one hour). It is kept per provider instance (so per provider
and dispatcher process) until 5 minutes before it expires, and every send of the process uses it;
when it must be renewed, one request renews it and the sends that need it meanwhile wait for that
one. A 401 drops it, and the send is made once more with a new one.

Answers: 200 delivered; UNREGISTERED (404), and INVALID_ARGUMENT (400) about the registration token,
deactivate the device; UNAVAILABLE, INTERNAL, QUOTA_EXCEEDED (and 429, 5xx) are transient
(Retry-After honoured); other errors permanent.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from core.http import HttpClient, HttpConnectError, Response, build_head, split_url
from providers import jws
from providers.kinds import push
from providers.kinds.base import (
    BaseProvider,
    Cancellable,
    DeliveryError,
    DeliveryResult,
    OutboundMessage,
    as_dict,
    check_destination_host,
    clean_message,
    config_error,
    parse_retry_after,
    reject_unknown_keys,
)
from providers.transport import new_client

DEFAULT_BASE_URL = "https://fcm.googleapis.com"
DEFAULT_TOKEN_URL = "https://oauth2.googleapis.com/token"  # noqa: S105 - a URL, not a secret
SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TIMEOUT_SECONDS = 15.0
ASSERTION_SECONDS = 3600
RENEW_BEFORE_SECONDS = 300  # the access token is renewed 5 minutes before it expires
PROJECT_ID = re.compile(r"[a-z][a-z0-9-]{4,61}[a-z0-9]")
TRANSIENT_ERRORS = frozenset({"UNAVAILABLE", "INTERNAL", "QUOTA_EXCEEDED"})
_FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
_BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"


def _service_account(text: Any, *, checked: bool = False) -> tuple[dict[str, Any], Any]:  # noqa: ANN401
    """The key file's fields and its RSA key; ValueError naming what is wrong. `checked`: the text was
    accepted by `validate` when it was saved, so the key's numbers are not checked again."""
    if not isinstance(text, str):
        raise ValueError("required: the service account key file's JSON, as a string")
    try:
        account = json.loads(text)
    except ValueError:
        raise ValueError("is not JSON: paste the whole key file") from None
    if not isinstance(account, dict):
        raise ValueError("must be the key file's JSON object")
    email = account.get("client_email")
    if not isinstance(email, str) or "@" not in email:
        raise ValueError("has no client_email")
    key = account.get("private_key")
    if not isinstance(key, str):
        raise ValueError("has no private_key")
    try:
        return account, jws.load_rsa_private_key(key, checked=checked)
    except ValueError as exc:
        raise ValueError(f"private_key: {exc}") from None


class FcmProvider(BaseProvider):
    kind = "fcm"
    options = ("http_client",)

    def __init__(self, config: dict, secrets: dict, *, http_client: HttpClient | None = None) -> None:
        super().__init__(config, secrets)
        # built from a saved row, whose secrets `validate` accepted: the key is parsed once, unchecked
        account, self._key = _service_account(self.secrets.get("service_account_json"), checked=True)
        self._email = account["client_email"]
        self._key_id = account.get("private_key_id") or ""
        base_url = (self.config.get("base_url") or DEFAULT_BASE_URL).rstrip("/")
        self._origin, target = split_url(f"{base_url}/v1/projects/{quote(self.config['project_id'])}/messages:send")
        self._head_prefix = build_head("POST", self._origin, target, {"Content-Type": "application/json"}, final=False)
        self._token_url = self.config.get("token_url") or DEFAULT_TOKEN_URL
        self._owns_client = http_client is None
        self._client = http_client or new_client()
        self._built = push.Built(push.fcm_body_parts)  # a notification's body but the token, once
        self._access_token = ""
        self._renew_at = 0.0  # loop time
        self._renewing: asyncio.Future | None = None
        self._grant_task: asyncio.Task | None = None
        self.tokens_fetched = 0

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        config, secrets = as_dict(config, "config"), as_dict(secrets, "secrets")
        reject_unknown_keys(config, ("project_id", "base_url", "token_url"), section="config")
        reject_unknown_keys(secrets, ("service_account_json",), section="secrets")
        project = config.get("project_id")
        if not isinstance(project, str) or not PROJECT_ID.fullmatch(project):
            raise config_error("project_id", "required: the Firebase project id, e.g. my-app-1234")
        clean: dict[str, Any] = {"project_id": project}
        for name, default in (("base_url", DEFAULT_BASE_URL), ("token_url", DEFAULT_TOKEN_URL)):
            url = config.get(name) or default
            if not isinstance(url, str):
                raise config_error(name, f"must be an https URL such as {default}")
            url = url.rstrip("/") if name == "base_url" else url
            try:
                origin, target = split_url(url)
            except ValueError as exc:
                raise config_error(name, str(exc)) from None
            if "?" in target:
                raise config_error(name, "must not have a query string")
            if check_destination:
                check_destination_host(origin.host, origin.port, name)
            clean[name] = url
        try:
            _service_account(secrets.get("service_account_json"))
        except ValueError as exc:
            raise config_error("service_account_json", str(exc), section="secrets") from None
        return clean

    # --- the access token ------------------------------------------------------------------------

    async def access_token(self, *, renew: bool = False) -> str:
        """The cached access token, or a new one: one grant request at a time, shared by every send
        that needs it meanwhile."""
        loop = asyncio.get_running_loop()
        if self._access_token and not renew and loop.time() < self._renew_at:
            return self._access_token
        if self._renewing is None or self._renewing.done():
            self._renewing = loop.create_future()
            self._grant_task = loop.create_task(self._grant())  # kept: a task only weakly referenced may vanish
        return await asyncio.shield(self._renewing)

    async def _grant(self) -> None:
        future = self._renewing
        loop = asyncio.get_running_loop()
        try:
            now = int(time.time())
            claims = {"iss": self._email, "scope": SCOPE, "aud": self._token_url, "iat": now,
                      "exp": now + ASSERTION_SECONDS}  # fmt: skip
            header = {"kid": self._key_id} if self._key_id else {}
            assertion = jws.rs256(self._key, claims, **header)
            form = urlencode({"grant_type": GRANT_TYPE, "assertion": assertion}).encode()
            response = await self._client.request(
                "POST", self._token_url, headers={"Content-Type": "application/x-www-form-urlencoded",
                                                  "Accept": "application/json"},
                body=form, timeout=TIMEOUT_SECONDS,
            )  # fmt: skip
            if response.status != 200:
                raise DeliveryError(
                    f"the token endpoint answered HTTP {response.status}", code=f"oauth_http_{response.status}",
                    http_status=response.status, retry_after=parse_retry_after(response.headers.get("retry-after")),
                    permanent=response.status in (400, 401, 403),
                )  # fmt: skip
            granted = orjson.loads(response.body)
            token, expires_in = granted.get("access_token"), granted.get("expires_in", 3600)
            if not isinstance(token, str) or not token or not push.finite_number(expires_in):
                raise DeliveryError("the token endpoint gave no access token", code="oauth_error")
            self._access_token = token
            self._renew_at = loop.time() + max(0.0, float(expires_in) - RENEW_BEFORE_SECONDS)
            self.tokens_fetched += 1
            if future is not None and not future.done():
                future.set_result(token)
        except BaseException as exc:
            if future is not None and not future.done():
                future.set_exception(exc if isinstance(exc, Exception) else DeliveryError("cancelled"))
                future.exception()  # retrieved: a send that gave up waiting must not leave it unretrieved
            if not isinstance(exc, Exception):
                raise

    # --- sending ---------------------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        return await self._send(message, (False, True))

    async def _send(self, message: OutboundMessage, renewals: tuple[bool, ...]) -> DeliveryResult:
        try:
            body = self._body(message)
            if isinstance(body, DeliveryResult):
                return body
            for renew in renewals:
                access = await self.access_token(renew=renew)
                response = await self._client.send(self._origin, self._head(access, body), body, TIMEOUT_SECONDS)
                if response.status != 401:
                    break
                self._refused(access)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            return self._failure(exc)
        return self._result(response)

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> Cancellable | None:
        """`send` without a task, coroutine or future while the access token is cached (the
        dispatcher's hot path): the request starts now and its answer calls back; after a 401 (the token
        refused) the send goes on in a task that renews the token. None without a usable token (the
        first send, or one due for renewal): `send` fetches it."""
        loop = asyncio.get_running_loop()
        access = self._access_token
        if not access or loop.time() >= self._renew_at:
            return None
        try:
            body = self._body(message)
        except Exception as exc:  # noqa: BLE001 - converted to a result, never raised to the dispatcher
            body = self._failure(exc)
        if isinstance(body, DeliveryResult):
            return loop.call_soon(on_result, body)
        handle = _Started()
        answered = self._answered(on_result)

        def done(response: Response | None, error: BaseException | None) -> None:
            if error is None and response.status == 401:  # type: ignore[union-attr]
                self._refused(access)
                handle.current = loop.create_task(self._renewed(message, on_result))
                return
            answered(response, error)

        try:
            handle.current = self._client.start(self._origin, self._head(access, body), body, TIMEOUT_SECONDS, done)
        except HttpConnectError as exc:  # a closed client, before the request is registered anywhere
            return loop.call_soon(on_result, self._failure(exc))
        return handle

    async def _renewed(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> None:
        on_result(await self._send(message, (True,)))

    def _body(self, message: OutboundMessage) -> bytes | DeliveryResult:
        token = message.recipient.strip()
        if not token or len(token) > 4096 or not token.isprintable() or " " in token:
            return DeliveryResult(delivered=False, error_code="invalid_recipient", permanent=True,
                                  message="not an FCM registration token")  # fmt: skip
        return push.fcm_body(self._built.of(message.subject, message.body, message.push), token)

    def _head(self, access: str, body: bytes) -> bytes:
        return self._head_prefix + b"Authorization: Bearer %s\r\nContent-Length: %d\r\n\r\n" % (
            access.encode(), len(body))  # fmt: skip

    def _refused(self, access: str) -> None:
        if self._access_token == access:  # refused: whoever comes next gets a new one
            self._access_token = ""

    def _result(self, response: Response) -> DeliveryResult:
        status = response.status
        if status == 200:
            message_id = ""
            try:
                message_id = str(orjson.loads(response.body).get("name", ""))[:200]
            except (orjson.JSONDecodeError, AttributeError):
                pass
            return DeliveryResult(delivered=True, http_status=200, provider_message_id=message_id)
        code, about_token, text = _error(response.body)
        error_code = f"fcm_{code}" if code else f"http_{status}"
        message = clean_message(f"HTTP {status} {code}: {text}".strip(), self._secret_values())
        if code == "UNREGISTERED" or (code == "INVALID_ARGUMENT" and about_token):
            return DeliveryResult(delivered=False, http_status=status, error_code=error_code, message=message,
                                  permanent=True, deactivate=code)  # fmt: skip
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        transient = code in TRANSIENT_ERRORS or status in (429, 500, 502, 503, 504)
        return DeliveryResult(delivered=False, http_status=status, error_code=error_code, message=message,
                              retry_after=retry_after, permanent=None if transient else True)  # fmt: skip

    def _secret_values(self) -> list[str]:
        return [self._access_token] if self._access_token else []

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()


def _error(body: bytes) -> tuple[str, bool, str]:
    """(FCM error code, whether it is about the registration token, the message) of an error body."""
    try:
        error = orjson.loads(body).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        return "", False, ""
    if not isinstance(error, dict):
        return "", False, ""
    code = error.get("status") if isinstance(error.get("status"), str) else ""
    text = error.get("message") if isinstance(error.get("message"), str) else ""
    about_token = "registration token" in text.lower()
    for detail in error.get("details") or []:
        if not isinstance(detail, dict):
            continue
        if detail.get("@type") == _FCM_ERROR and isinstance(detail.get("errorCode"), str):
            code = detail["errorCode"]
        elif detail.get("@type") == _BAD_REQUEST:
            for violation in detail.get("fieldViolations") or []:
                if isinstance(violation, dict) and violation.get("field") == "message.token":
                    about_token = True
    code = code if code.replace("_", "").isalnum() and len(code) <= 64 else ""
    return code, about_token, text[:200]


class _Started:
    """A send started by `start_send`: its request, then the task that sends again after a 401."""

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: Cancellable | None = None

    def cancel(self) -> None:
        if self.current is not None:
            self.current.cancel()
