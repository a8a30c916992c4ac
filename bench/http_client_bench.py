"""Compare core.http.HttpClient with httpx.AsyncClient on loopback.

    .venv/bin/python bench/http_client_bench.py [--concurrency 200] [--seconds 4] [--server minimal|receiver]

Each client sends signed Standard Webhooks POSTs (same JSON + HMAC work per request) from
`concurrency` tasks for `seconds` against a server in a separate process; reported are requests
per second and latency percentiles. `--server receiver` uses tests.support.receivers (verifies
every signature, so it is slower); the default is a minimal keep-alive responder so that the
server is not what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings_test")

SECRET = "whsec_" + base64.b64encode(bytes(range(1, 33))).decode()
RESPONSE = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{"ok":true}'


# -- minimal server (own process) ------------------------------------------------------------
class _Minimal(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            i = buf.find(b"ontent-Length: ", 0, end)  # both clients send this capitalisation
            if i < 0:
                i = buf.find(b"ontent-length: ", 0, end)
            length = int(buf[i + 15 : buf.find(b"\r\n", i)]) if i >= 0 else 0
            if len(buf) < end + 4 + length:
                return
            del buf[: end + 4 + length]
            self.transport.write(RESPONSE)


def _serve_minimal(port_queue: multiprocessing.Queue, seconds: float) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Minimal, "127.0.0.1", 0, backlog=1024)
        port_queue.put(server.sockets[0].getsockname()[1])
        await asyncio.sleep(seconds)
        server.close()

    asyncio.run(main())


# -- request construction shared by both clients ---------------------------------------------
KEY = base64.b64decode(SECRET[len("whsec_") :])
HMAC = hmac.new(KEY, digestmod=hashlib.sha256)


def signed(msg_id: str) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(
        {
            "id": msg_id,
            "channel": "webhook",
            "recipient": "tok_1234567890",
            "subject": "Hello",
            "body": "Your order has shipped.",
            "metadata": {"order": 42},
            "created_at": datetime.now(UTC).isoformat(),
        },
        separators=(",", ":"),
    ).encode()
    ts = str(int(time.time()))
    mac = HMAC.copy()
    mac.update(f"{msg_id}.{ts}.".encode())
    mac.update(body)
    sig = base64.b64encode(mac.digest()).decode()
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": ts,
        "webhook-signature": f"v1,{sig}",
        "idempotency-key": msg_id,
    }
    return body, headers


async def _drive(send, concurrency: int, seconds: float) -> dict:  # noqa: ANN001
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                ok = await send()
            except Exception:  # noqa: BLE001
                ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    begin = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - begin
    latencies.sort()
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 100 else [0.0] * 99
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": round(len(latencies) / elapsed),
        "p50_ms": round(q[49] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
    }


async def bench_provider(url: str, concurrency: int, seconds: float) -> dict:
    from providers.kinds.base import OutboundMessage
    from providers.kinds.webhook import WebhookProvider
    from providers.transport import new_client

    client = new_client(allow_private=True, max_connections_per_host=concurrency)
    provider = WebhookProvider({"url": url}, {"signing_secret": SECRET}, http_client=client)
    created = datetime.now(UTC)

    async def send() -> bool:
        message = OutboundMessage(
            str(uuid.uuid4()),
            "tenant",
            "webhook",
            "tok_1234567890",
            "Hello",
            "Your order has shipped.",
            {"order": 42},
            created,
            1,
        )
        return (await provider.send(message)).delivered

    result = await _drive(send, concurrency, seconds)
    result["connections"] = client.connection_count()
    await client.aclose()
    return result


async def bench_omnipost_raw(url: str, concurrency: int, seconds: float) -> dict:
    from providers.transport import new_client

    client = new_client(allow_private=True, max_connections_per_host=concurrency)

    async def send() -> bool:
        body, headers = signed(str(uuid.uuid4()))
        response = await client.request("POST", url, headers=headers, body=body, timeout=10)
        return response.status == 200

    result = await _drive(send, concurrency, seconds)
    await client.aclose()
    return result


async def bench_httpx(url: str, concurrency: int, seconds: float) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=10, follow_redirects=False) as client:

        async def send() -> bool:
            body, headers = signed(str(uuid.uuid4()))
            response = await client.post(url, content=body, headers=headers)
            return response.status_code == 200

        return await _drive(send, concurrency, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--server", choices=("minimal", "receiver"), default="minimal")
    parser.add_argument("--only", choices=("provider", "raw", "httpx"), action="append")
    args = parser.parse_args()

    import django

    django.setup()
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # its per-request INFO line would skew the result
    runs = args.only or ["provider", "raw", "httpx"]
    total = args.seconds * len(runs) + 30
    receiver = None
    if args.server == "minimal":
        queue: multiprocessing.Queue = multiprocessing.Queue()
        server = multiprocessing.Process(target=_serve_minimal, args=(queue, total), daemon=True)
        server.start()
        url = f"http://127.0.0.1:{queue.get(timeout=10)}/hook"
    else:
        from tests.support.receivers import spawn_receiver

        receiver = spawn_receiver("--secret", SECRET, "--max-seconds", str(total))
        url = receiver.url

    benches = {"provider": bench_provider, "raw": bench_omnipost_raw, "httpx": bench_httpx}
    names = {
        "provider": "omnipost WebhookProvider.send (JSON+HMAC+HTTP)",
        "raw": "omnipost HttpClient.request (same signing)",
        "httpx": "httpx.AsyncClient.post (same signing)",
    }
    print(
        f"python {sys.version.split()[0]}, cpus {os.cpu_count()}, concurrency {args.concurrency}, "
        f"{args.seconds:g}s each, server={args.server}"
    )
    for name in runs:
        result = asyncio.run(benches[name](url, args.concurrency, args.seconds))
        print(f"{names[name]:<52} {json.dumps(result)}")
    if receiver is not None:
        print("receiver:", json.dumps(receiver.stop()))
    elif server.is_alive():
        server.terminate()


if __name__ == "__main__":
    main()
