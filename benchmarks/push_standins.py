"""Loopback stand-ins for the push vendors that check what the vendors check, with their algorithms:

- `ApnsStandIn`: HTTP/2 over TLS (hypercorn, a self-signed CA: benchmarks.tls.make_tls_material),
  verifying each request's ES256 provider token with the team's public key (`kid`, `iss`, `iat`
  within the hour), the headers APNs requires, the payload's size and JSON;
  answers per device token (200, 410 Unregistered, 400 BadDeviceToken, 429, 503, …) and 403
  ExpiredProviderToken to a provider token the test marks stale.
- `FcmStandIn`: an OAuth 2.0 token endpoint verifying the RS256 JWT-bearer assertion with the
  service account's public key (iss, scope, aud, exp), and the FCM v1 send endpoint checking the
  bearer token it issued; answers per registration token.
- `WebPushStandIn`: a push service verifying the VAPID JWT (ES256 with the `k` key, `aud` its own
  origin, `exp` within 24 h, `sub`) and DECRYPTING each body with `http_ece` and the subscription's
  private key; answers per subscription.

Each runs hypercorn on its own event loop in a daemon thread (`AsgiServer`); `answers` maps a token
to a list of answers used in turn (then 200), `received` lists what was accepted (with `at`, the
unix time it was).

The push tests (tests.push) and the chaos soak (benchmarks.soak) use them: they live here, where
the soak may import them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from benchmarks.tls import TlsMaterial, make_tls_material


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class JwtRefused(Exception):
    pass


def verify_jwt(token: str, public_key: Any, alg: str) -> tuple[dict, dict]:  # noqa: ANN401
    """(header, claims) of a compact JWS verified with `public_key` (ES256 or RS256); JwtRefused if not."""
    try:
        head_b64, claims_b64, sig_b64 = token.split(".")
        header, claims = json.loads(b64url_decode(head_b64)), json.loads(b64url_decode(claims_b64))
        signature = b64url_decode(sig_b64)
    except ValueError as exc:
        raise JwtRefused(f"malformed JWT: {exc}") from None
    if header.get("alg") != alg:
        raise JwtRefused(f"alg {header.get('alg')!r}, expected {alg}")
    signed = f"{head_b64}.{claims_b64}".encode()
    try:
        if alg == "ES256":
            if len(signature) != 64:
                raise JwtRefused("an ES256 signature is 64 bytes (r‖s)")
            der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
            public_key.verify(der, signed, ec.ECDSA(hashes.SHA256()))
        else:
            public_key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        raise JwtRefused("bad signature") from None
    return header, claims


# --- hypercorn in a thread ----------------------------------------------------------------------


class AsgiServer:
    def __init__(self, app: Callable, *, tls: TlsMaterial | None = None, max_requests: int = 1000) -> None:
        self.app = app
        self.tls = tls
        self.max_requests = max_requests  # per connection, then GOAWAY (hypercorn's keep_alive_max_requests)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="push-standin", daemon=True)
        self.port = 0
        self._stop: asyncio.Event | None = None
        self._serving: Any = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> AsgiServer:
        from hypercorn.asyncio.run import worker_serve
        from hypercorn.config import Config
        from hypercorn.utils import wrap_app

        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        config.errorlog = None
        config.graceful_timeout = 0.5
        config.keep_alive_timeout = 60
        config.keep_alive_max_requests = self.max_requests
        if self.tls is not None:
            config.certfile = self.tls.cafile
            config.keyfile = str(Path(self.tls.cafile).with_name("key.pem"))
        sockets = config.create_sockets()
        bound = sockets.secure_sockets if self.tls is not None else sockets.insecure_sockets
        self.port = bound[0].getsockname()[1]
        for sock in bound:  # accepting into the backlog from now on, before the server's loop runs
            sock.listen(128)
        self.thread.start()

        async def serve() -> None:
            self._stop = asyncio.Event()
            app = wrap_app(self.app, config.wsgi_max_body_size, "asgi")
            await worker_serve(app, config, sockets=sockets, shutdown_trigger=self._stop.wait)

        self._serving = asyncio.run_coroutine_threadsafe(serve(), self.loop)
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            try:
                self._serving.result(10)
            except Exception:  # noqa: BLE001, S110 - shutting down: nothing to report
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def origin(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"


async def read_body(receive: Callable) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


async def respond(send: Callable, status: int, body: Any = b"", headers: dict[str, str] | None = None) -> None:  # noqa: ANN401
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    if body:
        raw.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def lifespan(receive: Callable, send: Callable) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class HookStandIn:
    """A webhook receiver on the stand-ins' server (hypercorn, plain HTTP): answers 200 `{"ok": true}` to
    every request, checking nothing. The benches send the webhook kind to it beside the vendors'
    stand-ins, so that what the server costs the client (hypercorn answers in more writes and headers
    than tests.support.receivers.HttpReceiver) is told apart from what the kind costs."""

    def __init__(self) -> None:
        self.server: AsgiServer | None = None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        await read_body(receive)
        await respond(send, 200, {"ok": True})

    def start(self) -> HookStandIn:
        self.server = AsgiServer(self, max_requests=10**9).start()
        return self

    @property
    def url(self) -> str:
        return self.server.origin + "/hook"  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


@dataclass
class Answer:
    status: int = 200
    reason: str = ""  # APNs `reason`, FCM `errorCode`
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    about_token: bool = True  # FCM INVALID_ARGUMENT: the violation names message.token


class _StandIn:
    def __init__(self) -> None:
        self.answers: dict[str, list[Answer]] = {}
        self.received: list[dict[str, Any]] = []  # accepted requests
        self.seen: Counter[str] = Counter()  # requests per token, whatever the answer
        self.refused: list[str] = []  # why requests were refused as malformed (must stay empty)
        self.lock = threading.Lock()
        self.server: AsgiServer | None = None
        self.in_flight = 0
        self.most_in_flight = 0

    def answer(self, token: str, *answers: Answer) -> None:
        with self.lock:
            self.answers[token] = list(answers)

    def _next(self, token: str) -> Answer:
        with self.lock:
            self.seen[token] += 1
            queue = self.answers.get(token)
            return queue.pop(0) if queue else Answer()

    def accepted(self, token: str) -> list[dict[str, Any]]:
        return [r for r in self.received if r["token"] == token]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.02)
        return predicate()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


# --- APNs -----------------------------------------------------------------------------------------


class ApnsStandIn(_StandIn):
    TEAM_ID = "TEAM123456"
    KEY_ID = "KEY1234567"
    TOPIC = "com.example.omnipost"

    def __init__(self, directory: str | Path | None = None, *, max_requests: int = 1000) -> None:
        super().__init__()
        self.max_requests = max_requests  # a connection's requests, then GOAWAY
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.private_pem = self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode()
        self.tls = make_tls_material(directory, hostname="localhost")
        self.stale_tokens: set[str] = set()  # provider tokens answered 403 ExpiredProviderToken
        self.expire_next = False  # the next provider token seen becomes stale
        self.provider_tokens: Counter[str] = Counter()
        self.verified: dict[str, tuple[dict, dict]] = {}  # provider token → its (header, claims), signature good

    def start(self) -> ApnsStandIn:
        self.server = AsgiServer(self, tls=self.tls, max_requests=self.max_requests).start()
        return self

    @property
    def base_url(self) -> str:
        return f"https://localhost:{self.server.port}"  # type: ignore[union-attr]

    def provider_config(self) -> tuple[dict, dict]:
        return ({"team_id": self.TEAM_ID, "key_id": self.KEY_ID, "topic": self.TOPIC, "base_url": self.base_url,
                 "ca_file": self.tls.cafile}, {"private_key": self.private_pem})  # fmt: skip

    def _check(self, scope: dict, headers: dict[str, str], body: bytes) -> tuple[int, str] | None:
        if scope.get("http_version") != "2" or scope["method"] != "POST":
            return 405, "MethodNotAllowed"
        auth = headers.get("authorization", "")
        if not auth.startswith("bearer "):
            return 403, "MissingProviderToken"
        jwt = auth[7:]
        verified = self.verified.get(jwt)
        if verified is None:  # each provider token's signature checked once, its claims at every request
            try:
                verified = verify_jwt(jwt, self.key.public_key(), "ES256")
            except JwtRefused:
                return 403, "InvalidProviderToken"
            with self.lock:
                self.verified[jwt] = verified
        header, claims = verified
        if header.get("kid") != self.KEY_ID or claims.get("iss") != self.TEAM_ID:
            return 403, "InvalidProviderToken"
        iat = claims.get("iat")
        if not isinstance(iat, int) or not time.time() - 3600 <= iat <= time.time() + 60:
            return 403, "ExpiredProviderToken"
        with self.lock:
            if self.expire_next:  # the token in use now becomes stale
                self.stale_tokens.add(jwt)
                self.expire_next = False
            self.provider_tokens[jwt] += 1
            if jwt in self.stale_tokens:
                return 403, "ExpiredProviderToken"
        if headers.get("apns-topic") != self.TOPIC:
            return 400, "BadTopic" if "apns-topic" in headers else "MissingTopic"
        if headers.get("apns-push-type") != "alert":
            return 400, "InvalidPushType"
        try:
            uuid.UUID(headers.get("apns-id", ""))
        except ValueError:
            return 400, "BadMessageId"
        if headers.get("apns-priority") not in ("5", "10"):
            return 400, "BadPriority"
        if not headers.get("apns-expiration", "").isdigit():
            return 400, "BadExpirationDate"
        if "apns-collapse-id" in headers and len(headers["apns-collapse-id"].encode()) > 64:
            return 400, "BadCollapseId"
        if len(body) > 4096:
            return 413, "PayloadTooLarge"
        try:
            payload = json.loads(body)
            assert isinstance(payload.get("aps"), dict)
        except (ValueError, AssertionError):
            return 400, "PayloadEmpty"
        return None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = scope["path"]
        if not path.startswith("/3/device/"):
            await respond(send, 404, {"reason": "BadPath"})
            return
        token = path[len("/3/device/") :]
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            problem = self._check(scope, headers, body)
            if problem is not None:
                if problem[1] != "ExpiredProviderToken":
                    self.refused.append(problem[1])
                await respond(send, problem[0], {"reason": problem[1]}, {"apns-id": headers.get("apns-id", "")})
                return
            answer = self._next(token)
            if answer.delay:
                await asyncio.sleep(answer.delay)
            if answer.status == 200:
                with self.lock:
                    self.received.append({"token": token, "headers": headers, "payload": json.loads(body),
                                          "at": time.time()})  # fmt: skip
                await respond(send, 200, b"", {"apns-id": headers["apns-id"]})
                return
            reason = answer.reason or {410: "Unregistered", 429: "TooManyRequests", 503: "ServiceUnavailable",
                                       500: "InternalServerError"}.get(answer.status, "BadRequest")  # fmt: skip
            content: dict[str, Any] = {"reason": reason}
            if answer.status == 410:
                content["timestamp"] = int(time.time() * 1000)
            await respond(send, answer.status, content, {"apns-id": headers["apns-id"], **answer.headers})
        finally:
            self.in_flight -= 1


class GoawayApnsStandIn(ApnsStandIn):
    """The APNs stand-in on a raw `h2` server over TLS (the same checks and answers: its requests go
    through ApnsStandIn's ASGI application) that sends a graceful GOAWAY mid-flight: once the
    `goaway_after`-th request of its first connection has arrived, a GOAWAY (NO_ERROR) whose
    last-stream-id is that request's stream; the streams at or below it are still answered (after
    `answer_delay` seconds, so the answers come after the GOAWAY), those above it are never processed
    (`ignored` counts them), and the connection closes once the last answer is sent. Later
    connections serve everything. `die_after` instead aborts the first connection (no GOAWAY)
    when its `die_after`-th request has arrived, with the requests before it answered and the rest
    in flight."""

    def __init__(self, directory: str | Path | None = None, *, goaway_after: int = 10, die_after: int = 0,
                 answer_delay: float = 0.2) -> None:  # fmt: skip
        super().__init__(directory)
        self.goaway_after = goaway_after
        self.die_after = die_after
        self.answer_delay = answer_delay
        self.connections = 0
        self.last_stream_ids: list[int] = []  # of each GOAWAY sent
        self.ignored = 0  # streams above a GOAWAY's last-stream-id
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="apns-goaway", daemon=True)
        self._server: Any = None
        self.port = 0

    def start(self) -> GoawayApnsStandIn:
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.tls.cafile, str(Path(self.tls.cafile).with_name("key.pem")))
        context.set_alpn_protocols(["h2"])
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context), self._loop
        ).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def base_url(self) -> str:
        return f"https://localhost:{self.port}"

    def stop(self) -> None:
        async def close() -> None:
            self._server.close()
            for task in [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
                task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h2.config
        import h2.connection
        import h2.events
        import h2.exceptions

        self.connections += 1
        first = self.connections == 1
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        requests: dict[int, tuple[list, bytearray]] = {}
        arrived = 0
        last = 0  # the GOAWAY's last-stream-id once sent
        answering: set[asyncio.Task] = set()

        async def answer(stream_id: int, headers: list, body: bytes) -> None:
            await asyncio.sleep(self.answer_delay)
            pseudo = {k: v for k, v in headers if k.startswith(b":")}
            scope = {"type": "http", "http_version": "2", "method": pseudo[b":method"].decode(),
                     "path": pseudo[b":path"].decode(),
                     "headers": [(k, v) for k, v in headers if k[:1] != b":"]}  # fmt: skip
            sent: list[dict] = []

            async def receive() -> dict:
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: dict) -> None:
                sent.append(message)

            await self(scope, receive, send)
            start, content = sent[0], sent[1].get("body", b"")
            answering.discard(asyncio.current_task())  # type: ignore[arg-type]
            try:
                conn.send_headers(stream_id, [(b":status", str(start["status"]).encode()), *start["headers"]],
                                  end_stream=not content)  # fmt: skip
                if content:
                    conn.send_data(stream_id, content, end_stream=True)
            except h2.exceptions.ProtocolError:
                pass  # the client reset the stream meanwhile (it gave up on it)
            writer.write(conn.data_to_send())
            if last and not answering:  # the last stream the GOAWAY covered is answered
                await writer.drain()
                writer.close()

        try:
            while not reader.at_eof():
                data = await reader.read(65536)
                if not data:
                    break
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        if last and event.stream_id > last:
                            self.ignored += 1  # never processed
                            continue
                        requests[event.stream_id] = (event.headers, bytearray())
                    elif isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                        if event.stream_id in requests:
                            requests[event.stream_id][1].extend(event.data)
                    elif isinstance(event, h2.events.StreamEnded) and event.stream_id in requests:
                        headers, body = requests.pop(event.stream_id)
                        arrived += 1
                        if first and self.die_after and arrived == self.die_after:
                            writer.transport.abort()  # dies: no GOAWAY, the requests in flight unanswered
                            return
                        task = asyncio.get_running_loop().create_task(answer(event.stream_id, headers, bytes(body)))
                        answering.add(task)
                        if first and not last and self.goaway_after and arrived == self.goaway_after:
                            last = event.stream_id
                            self.last_stream_ids.append(last)
                            conn.close_connection(last_stream_id=last)
                            # h2 refuses every frame after its own GOAWAY: the answers still go out
                            conn.state_machine.state = h2.connection.ConnectionState.SERVER_OPEN
                writer.write(conn.data_to_send())
        except (ConnectionError, h2.exceptions.ProtocolError):
            pass


# --- FCM ------------------------------------------------------------------------------------------


class FcmStandIn(_StandIn):
    PROJECT = "omnipost-test-1"
    EMAIL = "sender@omnipost-test-1.iam.gserviceaccount.com"
    SCOPE = "https://www.googleapis.com/auth/firebase.messaging"

    def __init__(self, expires_in: int = 3600) -> None:
        super().__init__()
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.expires_in = expires_in
        self.issued: dict[str, float] = {}  # access token → expiry (epoch)
        self.grants = 0
        self.grant_delay = 0.0

    def start(self) -> FcmStandIn:
        self.server = AsgiServer(self).start()
        return self

    @property
    def token_url(self) -> str:
        return f"{self.server.origin}/token"  # type: ignore[union-attr]

    def service_account_json(self) -> str:
        pem = self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()).decode()  # fmt: skip
        return json.dumps({"type": "service_account", "project_id": self.PROJECT, "private_key_id": "k1",
                           "private_key": pem, "client_email": self.EMAIL, "token_uri": self.token_url})  # fmt: skip

    def provider_config(self) -> tuple[dict, dict]:
        return ({"project_id": self.PROJECT, "base_url": self.server.origin, "token_url": self.token_url},  # type: ignore[union-attr]
                {"service_account_json": self.service_account_json()})  # fmt: skip

    async def _grant(self, body: bytes, send: Callable) -> None:
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            self.refused.append("grant_type")
            await respond(send, 400, {"error": "unsupported_grant_type"})
            return
        try:
            _, claims = verify_jwt(form.get("assertion", ""), self.key.public_key(), "RS256")
        except JwtRefused as exc:
            self.refused.append(f"assertion: {exc}")
            await respond(send, 400, {"error": "invalid_grant"})
            return
        now = time.time()
        if (
            claims.get("iss") != self.EMAIL
            or claims.get("scope") != self.SCOPE
            or claims.get("aud") != self.token_url
            or not claims.get("iat", 0) - 60 <= now <= claims.get("exp", 0)
            or claims["exp"] - claims["iat"] > 3600
        ):
            self.refused.append(f"claims: {claims}")
            await respond(send, 400, {"error": "invalid_grant"})
            return
        if self.grant_delay:
            await asyncio.sleep(self.grant_delay)
        token = "ya29." + secrets.token_urlsafe(24)
        with self.lock:
            self.grants += 1
            self.issued[token] = now + self.expires_in
        await respond(send, 200, {"access_token": token, "expires_in": self.expires_in, "token_type": "Bearer"})

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        if scope["path"] == "/token":
            await self._grant(body, send)
            return
        if scope["path"] != f"/v1/projects/{self.PROJECT}/messages:send" or scope["method"] != "POST":
            await respond(send, 404, {"error": {"code": 404, "status": "NOT_FOUND", "message": "no such path"}})
            return
        bearer = headers.get("authorization", "")[7:]
        if self.issued.get(bearer, 0) < time.time():
            await respond(
                send,
                401,
                {
                    "error": {
                        "code": 401,
                        "status": "UNAUTHENTICATED",
                        "message": "Request had invalid authentication credentials.",
                    }
                },
            )
            return
        try:
            message = json.loads(body)["message"]
            token = message["token"]
        except (ValueError, KeyError, TypeError):
            self.refused.append("body")
            await respond(send, 400, {"error": {"code": 400, "status": "INVALID_ARGUMENT", "message": "bad body"}})
            return
        data = message.get("data") or {}
        if not all(isinstance(v, str) for v in data.values()) or len(json.dumps(data).encode()) > 4096:
            self.refused.append("data")
        answer = self._next(token)
        if answer.delay:
            await asyncio.sleep(answer.delay)
        if answer.status == 200:
            with self.lock:
                self.received.append({"token": token, "message": message, "at": time.time()})
            await respond(send, 200, {"name": f"projects/{self.PROJECT}/messages/{uuid.uuid4().hex}"})
            return
        code = answer.reason or {404: "UNREGISTERED", 503: "UNAVAILABLE", 500: "INTERNAL", 429: "QUOTA_EXCEEDED",
                                 400: "INVALID_ARGUMENT"}.get(answer.status, "UNSPECIFIED_ERROR")  # fmt: skip
        status = {404: "NOT_FOUND", 400: "INVALID_ARGUMENT", 503: "UNAVAILABLE", 500: "INTERNAL",
                  429: "RESOURCE_EXHAUSTED"}.get(answer.status, "UNKNOWN")  # fmt: skip
        details: list[dict] = [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError", "errorCode": code}]
        text = "Requested entity was not found." if code == "UNREGISTERED" else "error"
        if code == "INVALID_ARGUMENT" and answer.about_token:
            text = "The registration token is not a valid FCM registration token"
            details.append(
                {
                    "@type": "type.googleapis.com/google.rpc.BadRequest",
                    "fieldViolations": [{"field": "message.token", "description": "Invalid registration token"}],
                }
            )
        await respond(send, answer.status, {"error": {"code": answer.status, "message": text, "status": status,
                                                      "details": details}}, answer.headers)  # fmt: skip


# --- Web Push -------------------------------------------------------------------------------------


@dataclass
class Subscription:
    name: str
    key: ec.EllipticCurvePrivateKey
    auth: bytes
    endpoint: str

    def as_json(self) -> dict[str, Any]:
        point = self.key.public_key().public_bytes(serialization.Encoding.X962,
                                                   serialization.PublicFormat.UncompressedPoint)  # fmt: skip
        return {"endpoint": self.endpoint, "keys": {"p256dh": b64url(point), "auth": b64url(self.auth)}}


class WebPushStandIn(_StandIn):
    SUBJECT = "mailto:ops@example.com"

    def __init__(self) -> None:
        super().__init__()
        self.vapid_key = ec.generate_private_key(ec.SECP256R1())
        self.subscriptions: dict[str, Subscription] = {}
        self.vapid_tokens: Counter[str] = Counter()

    def start(self) -> WebPushStandIn:
        self.server = AsgiServer(self).start()
        return self

    def provider_config(self) -> tuple[dict, dict]:
        public = self.vapid_key.public_key().public_bytes(serialization.Encoding.X962,
                                                          serialization.PublicFormat.UncompressedPoint)  # fmt: skip
        raw = self.vapid_key.private_numbers().private_value.to_bytes(32, "big")
        return {"subject": self.SUBJECT, "vapid_public_key": b64url(public)}, {"vapid_private_key": b64url(raw)}

    def subscribe(self, name: str) -> Subscription:
        sub = Subscription(name, ec.generate_private_key(ec.SECP256R1()), secrets.token_bytes(16),
                           f"{self.server.origin}/push/{name}")  # type: ignore[union-attr]  # fmt: skip
        self.subscriptions[name] = sub
        return sub

    def _vapid(self, headers: dict[str, str]) -> str | None:
        auth = headers.get("authorization", "")
        if not auth.startswith("vapid "):
            return "no vapid authorization"
        parts = dict(p.strip().split("=", 1) for p in auth[6:].split(","))
        public = self.vapid_key.public_key().public_bytes(serialization.Encoding.X962,
                                                          serialization.PublicFormat.UncompressedPoint)  # fmt: skip
        if b64url_decode(parts.get("k", "")) != public:
            return "k is not the application server key"
        try:
            _, claims = verify_jwt(parts.get("t", ""), self.vapid_key.public_key(), "ES256")
        except JwtRefused as exc:
            return str(exc)
        now = time.time()
        if claims.get("aud") != self.server.origin:  # type: ignore[union-attr]
            return f"aud {claims.get('aud')!r}"
        if not now < claims.get("exp", 0) <= now + 24 * 3600:
            return "exp"
        if claims.get("sub") != self.SUBJECT:
            return "sub"
        self.vapid_tokens[parts["t"]] += 1
        return None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        import http_ece

        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        name = scope["path"].rsplit("/", 1)[-1]
        sub = self.subscriptions.get(name)
        if sub is None or scope["method"] != "POST":
            await respond(send, 404, b"")
            return
        problem = self._vapid(headers)
        if problem is None and headers.get("content-encoding") != "aes128gcm":
            problem = "content-encoding"
        if problem is None and not headers.get("ttl", "").isdigit():
            problem = "ttl"
        if problem is None and len(body) > 4096:
            problem = "record over 4096 bytes"
        plaintext = b""
        if problem is None:
            try:
                plaintext = http_ece.decrypt(body, private_key=sub.key, auth_secret=sub.auth, version="aes128gcm")
            except Exception as exc:  # noqa: BLE001 - any failure to decrypt is the sender's fault here
                problem = f"cannot decrypt: {exc!r}"
        if problem is not None:
            self.refused.append(problem)
            await respond(send, 400 if "vapid" not in problem else 403, b"")
            return
        answer = self._next(name)
        if answer.delay:
            await asyncio.sleep(answer.delay)
        if 200 <= answer.status < 300:
            with self.lock:
                self.received.append({"token": name, "headers": headers, "payload": json.loads(plaintext),
                                      "at": time.time()})  # fmt: skip
            await respond(send, 201, b"", {"location": f"{self.server.origin}/m/{uuid.uuid4().hex}"})  # type: ignore[union-attr]
            return
        await respond(send, answer.status, b"", answer.headers)
