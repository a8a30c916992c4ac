"""A loopback provider and event endpoint that can be told to misbehave, for the chaos soak
(benchmarks/soak.py; a subprocess, not for production use).

    python -m benchmarks.chaos_receiver --provider-secret whsec_… --events-secret whsec_… \
        [--verify-every N] [--delay-ms D] --log FILE

Two listening ports, one per target: `provider` (the webhook provider's URL: notifications arrive
with `webhook-id` = the notification id) and `events` (the tenant's event endpoint: `webhook-id` =
the event id, the body's `data.notification_id` names the notification). A third, the control
port, answers `GET /stats` (counts per target as JSON), `GET /accepted/<target>/<index>` (the
accepted requests from that index on, for a live follower) and `POST /mode` with
`{"target": "provider" | "events", "mode": …}`:

- `ok`: 200 to every request (the provider's after --delay-ms: a provider takes time, so a kill
  finds sends in flight; the request counts as taken in when it arrives);
- `503` / `429`: that status with `Retry-After: 1`;
- `hang`: no answer; held connections are closed unanswered when the mode changes (so a held
  request never counts as accepted, and a sender's timeout is a plain failure, not a delivery
  it did not hear of);
- `down`: the port stops listening (connection refused) until the mode changes.

Prints `{"event": "listening", "provider_port", "events_port", "control_port"}` first. On SIGTERM
it writes every answered-2xx request to FILE as JSON lines `[target, id, notification_id, unix
time]` and prints a final `{"event": "stopped", …}` line with the counts. Every Nth request's
Standard Webhooks signature is verified (benchmarks.receiver.Verifier); a bad one is answered 400
and counted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson

from benchmarks.receiver import Verifier, _header, split_request
from core.process_name import set_process_name

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ("provider", "events")
MODES = ("ok", "503", "429", "hang", "down")
_ANSWERS = {
    "ok": b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nContent-Type: application/json\r\n\r\n{\"ok\":true}",
    "503": b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nbusy",
    "429": b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 4\r\nRetry-After: 1\r\n\r\nslow",
    "bad": b"HTTP/1.1 400 Bad Request\r\nContent-Length: 13\r\n\r\nbad signature",
}


class Target:
    """One listening port and the mode it answers in."""

    def __init__(self, name: str, secret: str | None, verify_every: int, delay_ms: float = 0.0) -> None:
        self.name = name
        self.delay = delay_ms / 1000
        self.mode = "ok"
        self.port = 0
        self.server: asyncio.AbstractServer | None = None
        self.verifier = Verifier(secret) if secret else None
        self.verify_every = max(1, verify_every)
        self.requests = 0
        self.by_answer: Counter[str] = Counter()
        self.accepted: list[tuple[str, str, float]] = []  # (webhook id, notification id, unix time)
        self.held: set[_Connection] = set()
        self.connections: set[_Connection] = set()

    async def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        self.server = await loop.create_server(
            lambda: _Connection(self), "127.0.0.1", self.port, backlog=1024, reuse_address=True
        )
        self.port = self.server.sockets[0].getsockname()[1]

    async def set_mode(self, mode: str) -> None:
        previous, self.mode = self.mode, mode
        if previous == "hang" and mode != "hang":
            for conn in list(self.held):
                conn.close()
            self.held.clear()
        if mode == "down" and previous != "down" and self.server is not None:
            self.server.close()
            for conn in list(self.connections):
                conn.close()
            self.server = None
        if previous == "down" and mode != "down":
            loop = asyncio.get_running_loop()
            for _ in range(50):  # the port may linger a moment after close
                try:
                    await self.listen(loop)
                    break
                except OSError:
                    await asyncio.sleep(0.1)

    def stats(self) -> dict[str, Any]:
        return {"mode": self.mode, "requests": self.requests, "accepted": len(self.accepted),
                "by_answer": dict(self.by_answer), "held": len(self.held)}  # fmt: skip


class _Connection(asyncio.Protocol):
    def __init__(self, target: Target) -> None:
        self.target = target
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.target.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.target.connections.discard(self)
        self.target.held.discard(self)
        self.transport = None

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while self.transport is not None and (request := split_request(self.buffer)) is not None:
            head, lower, body, self.buffer = request
            if not self._handle(head, lower, body):
                return  # held: nothing more is read from this connection until it is closed

    def _handle(self, head: bytes, lower: bytes, body: bytes) -> bool:
        target = self.target
        target.requests += 1
        mode = target.mode
        if mode == "hang":
            target.by_answer["held"] += 1
            target.held.add(self)
            return False
        if mode in ("503", "429"):
            target.by_answer[mode] += 1
            self.transport.write(_ANSWERS[mode])  # type: ignore[union-attr]
            return True
        now = time.time()
        webhook_id = (_header(head, lower, b"\r\nwebhook-id:") or b"").decode()
        if target.verifier is not None and target.requests % target.verify_every == 0:
            timestamp = _header(head, lower, b"\r\nwebhook-timestamp:") or b""
            signatures = _header(head, lower, b"\r\nwebhook-signature:") or b""
            if not target.verifier.verify(webhook_id, timestamp, signatures, body, now):
                target.by_answer["bad_signature"] += 1
                self.transport.write(_ANSWERS["bad"])  # type: ignore[union-attr]
                return True
        notification_id = webhook_id
        if target.name == "events":
            try:
                notification_id = str(orjson.loads(body).get("data", {}).get("notification_id") or "")
            except (orjson.JSONDecodeError, AttributeError):
                notification_id = ""
        target.by_answer["200"] += 1
        target.accepted.append((webhook_id, notification_id, now))  # taken in: sent, whether or not the answer is heard
        if target.delay:
            asyncio.get_running_loop().call_later(target.delay, self._write_ok)
        else:
            self._write_ok()
        return True

    def _write_ok(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_ANSWERS["ok"])


class _Control(asyncio.Protocol):
    targets: dict[str, Target]

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end]
        length = int(_header(head, head.lower(), b"\r\ncontent-length:") or 0)
        if len(self.buffer) < end + 4 + length:
            return
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = b""
        asyncio.get_running_loop().create_task(self._answer(head.split(b" ")[:2], body))

    async def _answer(self, request_line: list[bytes], body: bytes) -> None:
        status, out = 200, b""
        if request_line == [b"GET", b"/stats"]:
            out = json.dumps({name: t.stats() for name, t in self.targets.items()}).encode()
        elif request_line[:1] == [b"GET"] and request_line[1].startswith(b"/accepted/"):
            # GET /accepted/<target>/<since>: accepted requests from that index on (a live follower)
            _, _, name, since = request_line[1].decode().split("/")
            target = self.targets.get(name)
            if target is None or not since.isdigit():
                status, out = 404, b'{"error": "GET /accepted/<provider|events>/<index>"}'
            else:
                out = json.dumps(target.accepted[int(since) :]).encode()
        elif request_line == [b"POST", b"/mode"]:
            try:
                wanted = json.loads(body)
                target, mode = self.targets[wanted["target"]], wanted["mode"]
                if mode not in MODES:
                    raise ValueError(mode)
            except (ValueError, KeyError, TypeError):
                status, out = 400, b'{"error": "want target: provider|events, mode: ok|503|429|hang|down"}'
            else:
                await target.set_mode(mode)
                out = json.dumps(target.stats()).encode()
        else:
            status, out = 404, b'{"error": "GET /stats or POST /mode"}'
        if self.transport is not None:
            self.transport.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (status, len(out), out))  # fmt: skip


async def serve(args: argparse.Namespace) -> None:
    set_process_name("chaos-receiver")
    gc.disable()  # tuples of strings and floats only: no collector pauses in arrival times
    loop = asyncio.get_running_loop()
    targets = {
        "provider": Target("provider", args.provider_secret, args.verify_every, args.delay_ms),
        "events": Target("events", args.events_secret, args.verify_every),
    }
    for target in targets.values():
        await target.listen(loop)
    _Control.targets = targets
    control = await loop.create_server(_Control, "127.0.0.1", 0)
    print(json.dumps({"event": "listening", "provider_port": targets["provider"].port,
                      "events_port": targets["events"].port,
                      "control_port": control.sockets[0].getsockname()[1]}), flush=True)  # fmt: skip
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await asyncio.wait_for(stop.wait(), timeout=args.max_seconds)
    except TimeoutError:
        pass
    with open(args.log, "w") as fh:
        for name, target in targets.items():
            for webhook_id, notification_id, at in target.accepted:
                fh.write(json.dumps([name, webhook_id, notification_id, round(at, 6)]) + "\n")
    print(json.dumps({"event": "stopped", **{name: t.stats() for name, t in targets.items()}}), flush=True)


class ChaosReceiver:
    """The receiver in a subprocess: its URLs, `mode(target, mode)`, `stats()`, and on `stop()`
    every accepted request as (target, webhook id, notification id, unix time)."""

    def __init__(self, log: Path, *, provider_secret: str, events_secret: str, verify_every: int = 10,
                 delay_ms: float = 0.0) -> None:  # fmt: skip
        self.log = log
        command = [sys.executable, "-m", "benchmarks.chaos_receiver", "--provider-secret", provider_secret,
                   "--events-secret", events_secret, "--verify-every", str(verify_every), "--delay-ms", str(delay_ms),
                   "--log", str(log)]  # fmt: skip
        self.proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)  # noqa: S603
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        try:
            ports = json.loads(line)
            self.provider_port, self.events_port = ports["provider_port"], ports["events_port"]
            self.control = f"http://127.0.0.1:{ports['control_port']}"
        except (ValueError, KeyError):
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the chaos receiver did not start: {line.strip() or 'no output'}") from None
        self._client = httpx.Client(timeout=10)

    @property
    def provider_url(self) -> str:
        return f"http://127.0.0.1:{self.provider_port}/send"

    @property
    def events_url(self) -> str:
        return f"http://127.0.0.1:{self.events_port}/events"

    def mode(self, target: str, mode: str) -> dict[str, Any]:
        response = self._client.post(f"{self.control}/mode", json={"target": target, "mode": mode})
        response.raise_for_status()
        return response.json()

    def stats(self) -> dict[str, Any]:
        return self._client.get(f"{self.control}/stats").json()

    def accepted_since(self, target: str, since: int) -> list[tuple[str, str, float]]:
        """Requests `target` answered 2xx, from the `since`-th on: (webhook id, notification id, unix time)."""
        response = self._client.get(f"{self.control}/accepted/{target}/{since}")
        response.raise_for_status()
        return [tuple(row) for row in response.json()]  # type: ignore[misc]

    def stop(self) -> tuple[dict[str, Any], list[tuple[str, str, str, float]]]:
        self._client.close()
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=60)
        final = json.loads(out.strip().splitlines()[-1])
        accepted = [tuple(json.loads(line)) for line in self.log.read_text().splitlines()]
        return final, accepted  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos_receiver")
    parser.add_argument("--provider-secret")
    parser.add_argument("--events-secret")
    parser.add_argument("--verify-every", type=int, default=10)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="the provider's time to answer a 2xx")
    parser.add_argument("--max-seconds", type=float, default=6 * 3600.0)
    parser.add_argument("--log", required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main(sys.argv[1:])
