"""A lean loopback webhook receiver for `omnipost_bench` (a subprocess; not for production use).

    python -m benchmarks.receiver --port 0 [--delay-ms D] [--error-rate E] [--verify-every N]
        [--secret whsec_…] [--max-seconds S] --arrivals FILE

Prints `{"event": "listening", "port": …}` first. On SIGTERM (or --max-seconds) it writes every
webhook id's first arrival time (unix seconds) to FILE as JSON lines and prints a final
`{"event": "stopped", …}` with request, unique, duplicate and error counts. Every Nth request's
Standard Webhooks signature is verified (all of them with N = 1); a bad one is answered 400.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import hmac
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from core.process_name import set_process_name

ROOT = Path(__file__).resolve().parents[1]

_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
_ERR = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nbusy"
_BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 13\r\n\r\nbad signature"


class Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.errors_sent = 0
        self.bad_signatures = 0
        self.verified = 0
        self.arrivals: dict[str, float] = {}
        self.duplicates = 0


class Receiver(asyncio.Protocol):
    stats: Stats
    args: argparse.Namespace
    verifier: object | None

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # Lean on purpose (it shares the machine with what it measures): headers are looked up in
        # the lower-cased head, not split into a dict.
        self.buffer += data
        while (request := split_request(self.buffer)) is not None:
            head, lower, body, self.buffer = request
            self._handle(head, lower, body)

    def _handle(self, head: bytes, lower: bytes, body: bytes) -> None:
        stats = self.stats
        stats.requests += 1
        now = time.time()
        webhook_id = (_header(head, lower, b"\r\nwebhook-id:") or b"").decode()
        if self.verifier is not None and stats.requests % self.args.verify_every == 0:
            timestamp = _header(head, lower, b"\r\nwebhook-timestamp:") or b""
            signatures = _header(head, lower, b"\r\nwebhook-signature:") or b""
            if self.verifier.verify(webhook_id, timestamp, signatures, body, now):  # type: ignore[attr-defined]
                stats.verified += 1
            else:
                stats.bad_signatures += 1
                self._answer(_BAD)
                return
        if self.args.error_rate and random.random() < self.args.error_rate:  # noqa: S311
            stats.errors_sent += 1
            self._answer(_ERR)
            return
        if webhook_id in stats.arrivals:
            stats.duplicates += 1
        else:
            stats.arrivals[webhook_id] = now
        self._answer(_OK)

    def _answer(self, response: bytes) -> None:
        if self.args.delay_ms:
            asyncio.get_running_loop().call_later(self.args.delay_ms / 1000, self._write, response)
        else:
            self._write(response)

    def _write(self, response: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(response)


def first_to_last_rate(arrival_times: Iterable[float]) -> float | None:
    """Arrivals per second from the first arrival to the last (the benches' headline rate)."""
    times = list(arrival_times)
    span = max(times) - min(times) if times else 0
    return len(times) / span if span > 0 else None


def steady_rate(arrival_times: Iterable[float], middle: float = 0.8) -> float | None:
    """Arrivals per second between the 10th and the 90th percentile of arrival times: the rate once
    a system has ramped up and before its tail, which the first-to-last rate includes (a cold
    worker's first second weighs more in a short run than in a long one)."""
    times = sorted(arrival_times)
    if len(times) < 10:
        return None
    lo = round(len(times) * (1 - middle) / 2)
    hi = len(times) - 1 - lo
    span = times[hi] - times[lo]
    return (hi - lo) / span if span > 0 else None


def _header(head: bytes, lower: bytes, name: bytes) -> bytes | None:
    """The value of header `name` (given as b"\\r\\nname:", lower case) in a request head."""
    start = lower.find(name)
    if start < 0:
        return None
    start += len(name)
    stop = head.find(b"\r\n", start)
    return head[start : stop if stop >= 0 else len(head)].strip()


def split_request(buffer: bytes) -> tuple[bytes, bytes, bytes, bytes] | None:
    """The first whole HTTP/1.1 request in `buffer`: (head, head lower-cased, body, what follows it);
    None until all of it has arrived."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffer[:end]
    lower = head.lower()
    length = int(_header(head, lower, b"\r\ncontent-length:") or 0)
    if len(buffer) < end + 4 + length:
        return None
    return head, lower, buffer[end + 4 : end + 4 + length], buffer[end + 4 + length :]


class Verifier:
    """Standard Webhooks verification (v1 HMAC-SHA256 over `id.timestamp.body`, timestamp within
    five minutes), as the `standardwebhooks` package checks it, with one `hmac.digest` call."""

    TOLERANCE = 300

    def __init__(self, secret: str) -> None:
        from providers.kinds.webhook import decode_signing_secret  # Django-free import

        self.key = decode_signing_secret(secret)

    def verify(self, webhook_id: str, timestamp: bytes, signatures: bytes, body: bytes, now: float) -> bool:
        try:
            sent_at = int(timestamp)
        except ValueError:
            return False
        if not webhook_id or abs(now - sent_at) > self.TOLERANCE:
            return False
        signed = b"%s.%s.%s" % (webhook_id.encode(), timestamp, body)
        expected = b"v1," + base64.b64encode(hmac.digest(self.key, signed, "sha256"))
        return any(hmac.compare_digest(expected, candidate) for candidate in signatures.split())


async def serve(args: argparse.Namespace) -> None:
    set_process_name("bench-receiver")  # `perf` and `top` tell it from the dispatchers
    gc.disable()  # it keeps strings and floats only (no cycles): no collector pauses in arrival times
    stats = Stats()
    Receiver.stats = stats
    Receiver.args = args
    Receiver.verifier = None
    if args.secret:
        Receiver.verifier = Verifier(args.secret)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Receiver, args.host, args.port, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    print(json.dumps({"event": "listening", "port": port}), flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), timeout=args.max_seconds)
    except TimeoutError:
        pass
    server.close()
    if args.arrivals:
        with open(args.arrivals, "w") as fh:
            for webhook_id, at in stats.arrivals.items():
                fh.write(f"{webhook_id} {at:.6f}\n")
    print(
        json.dumps(
            {
                "event": "stopped",
                "requests": stats.requests,
                "unique": len(stats.arrivals),
                "duplicates": stats.duplicates,
                "errors_sent": stats.errors_sent,
                "verified": stats.verified,
                "bad_signatures": stats.bad_signatures,
            }
        ),
        flush=True,
    )


class ReceiverProcess:
    """This receiver in a subprocess, for a bench run: its URL while it runs, and on `stop()` its
    final counts with every webhook id's first arrival time. `secret=None` checks no signature."""

    def __init__(
        self, *, delay_ms: float = 0.0, error_rate: float = 0.0, verify_every: int = 1, secret: str | None = None,
        host: str = "127.0.0.1", max_seconds: float = 600.0,
    ) -> None:
        fd, name = tempfile.mkstemp(prefix="omnipost-bench-", suffix=".arrivals")
        os.close(fd)
        self.arrivals_file = Path(name)
        self.host = host
        command = [
            sys.executable, "-m", "benchmarks.receiver", "--host", host, "--port", "0", "--delay-ms", f"{delay_ms:g}",
            "--error-rate", str(error_rate), "--verify-every", str(verify_every), "--arrivals", name,
            "--max-seconds", f"{max_seconds:g}",
        ]  # fmt: skip
        if secret:
            command += ["--secret", secret]
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # noqa: S603
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        try:
            self.port = json.loads(line)["port"]
        except (ValueError, KeyError):
            self.proc.kill()
            self.proc.wait()
            self.arrivals_file.unlink(missing_ok=True)
            raise RuntimeError(f"the bench receiver did not start: {line.strip() or 'no output'}") from None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    def stop(self) -> tuple[dict[str, Any], dict[str, float]]:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=60)
        final = json.loads(out.strip().splitlines()[-1])
        arrivals = {}
        for line in self.arrivals_file.read_text().splitlines():
            webhook_id, at = line.split()
            arrivals[webhook_id] = float(at)
        self.arrivals_file.unlink(missing_ok=True)
        return final, arrivals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.receiver")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (a namespace host's gateway)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--error-rate", type=float, default=0.0)
    parser.add_argument("--secret")
    parser.add_argument("--verify-every", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    parser.add_argument("--arrivals")
    args = parser.parse_args(argv)
    try:
        import uvloop

        uvloop.run(serve(args))
    except ImportError:
        asyncio.run(serve(args))


if __name__ == "__main__":
    main(sys.argv[1:])
