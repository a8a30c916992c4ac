"""core.http's response parser against h11's, on generated responses: both accept a response with
the same status, headers and body (and agree whether the connection can be reused), or both
reject it.

The generator (seeded, so a failure replays) writes Content-Length, chunked (with extensions and
trailers), close-delimited and bodiless responses, 1xx before the final one, keep-alive and
close, repeated and folded headers, then breaks some: malformed status lines, header lines and
chunk sizes, conflicting lengths, truncated streams. Every response is fed to both parsers in the
same random pieces (heads split across reads, byte by byte at times). Bodies over the client's cap
are compared as a prefix: the client stops reading there and says so (`truncated`).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path

import h11
import pytest

import core.http as core_http
from core.http import HttpConnectError, HttpProtocolError, Response
from core.http.client import _Connection

CASES = 3000
MAX_BODY = 2048
SEED = 20261201


@dataclass
class Verdict:
    """What one parser made of a response: None for a rejection."""

    status: int | None = None
    headers: dict[str, str] | None = None
    body: bytes = b""
    reusable: bool = False
    truncated: bool = False
    complete: bool = True  # h11 only: False when it failed or wanted more after the head (body so far kept)

    @property
    def accepted(self) -> bool:
        return self.status is not None and self.complete


# --- the two parsers ------------------------------------------------------------------------------------
class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


class _Request:
    """Stands in for core.http's request: records how the connection ended it."""

    data = b"POST / HTTP/1.1\r\nHost: x\r\n\r\n"
    deadline = float("inf")

    def __init__(self) -> None:
        self.outcome: Response | Exception | None = None

    def answered(self, response: Response) -> None:
        self.outcome = response

    def failed(self, error: Exception) -> None:
        self.outcome = error

    def closed_before_response(self) -> None:
        self.outcome = HttpConnectError("closed before any response")


def ours(pieces: list[bytes], eof: bool) -> Verdict:
    """Feed the pieces to a core.http connection, then end the stream if `eof` and nothing ended it."""
    conn = _Connection(MAX_BODY, set())
    conn.connection_made(_Transport())
    req = _Request()
    conn.request(req)  # type: ignore[arg-type]
    for piece in pieces:
        if req.outcome is not None:
            break
        conn.data_received(piece)
    if eof:  # the server closes: completes a close-delimited body, fails a cut one, ends reuse
        conn.connection_lost(None)
    outcome = req.outcome
    if outcome is None or isinstance(outcome, HttpProtocolError | HttpConnectError):
        return Verdict()
    assert isinstance(outcome, Response), outcome
    # A truncated response closes its connection; otherwise reusable only if not closed by the stream.
    return Verdict(outcome.status, outcome.headers, outcome.body, conn.reusable and not conn.closed, outcome.truncated)


def theirs(pieces: list[bytes], eof: bool) -> Verdict:
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=64 * 1024)
    conn.send(h11.Request(method="POST", target="/", headers=[("Host", "x"), ("Content-Length", "0")]))
    conn.send(h11.EndOfMessage())
    status, headers, body = None, None, bytearray()
    data = b"".join(pieces)
    try:
        conn.receive_data(data)
        if eof:
            conn.receive_data(b"")
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:  # incomplete: our client fails it too (at EOF or its deadline)
                return Verdict(status, headers, bytes(body), complete=False)
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {}
                for name, value in event.headers:
                    key, text = name.decode("latin-1"), value.decode("latin-1")
                    headers[key] = f"{headers[key]}, {text}" if key in headers else text
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            else:
                return Verdict()
    except h11.ProtocolError:
        return Verdict(status, headers, bytes(body), complete=False)
    # Bytes after the response: the client never pipelines, so it must not reuse the connection.
    leftover = conn.trailing_data[0] if conn.their_state is h11.DONE else b""
    reusable = conn.their_state is h11.DONE and conn.our_state is h11.DONE and not leftover and not eof
    return Verdict(status, headers, bytes(body), reusable)


# --- the generator --------------------------------------------------------------------------------------
TOKEN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"
REASONS = ["OK", "Created", "Not Found", "Internal Server Error", "", "Weird reason with  spaces"]
STATUSES = [200, 201, 202, 204, 301, 304, 400, 404, 408, 429, 500, 503]


def header_name(rng: random.Random) -> str:
    return "X-" + "".join(rng.choice(TOKEN) for _ in range(rng.randint(1, 12)))


def header_value(rng: random.Random) -> str:
    return "".join(rng.choice(TOKEN + " ;=,/") for _ in range(rng.randint(0, 30))).strip()


def chunked(rng: random.Random, body: bytes, *, trailers: bool) -> bytes:
    out, i = bytearray(), 0
    while i < len(body):
        n = rng.randint(1, max(1, len(body) - i))
        size = f"{n:x}" if rng.random() < 0.7 else f"{n:X}"
        ext = rng.choice(["", ";name=value", ";a", ';q="x"']) if rng.random() < 0.2 else ""
        out += f"{size}{ext}\r\n".encode() + body[i : i + n] + b"\r\n"
        i += n
    out += b"0\r\n"
    if trailers:
        out += f"{header_name(rng)}: {header_value(rng)}\r\n".encode()
    return bytes(out + b"\r\n")


def valid(rng: random.Random) -> tuple[bytes, bool]:
    """A well-formed response and whether the stream then ends (EOF) after it."""
    status = rng.choice(STATUSES)
    version = "HTTP/1.1" if rng.random() < 0.9 else "HTTP/1.0"
    lines = [f"{version} {status} {rng.choice(REASONS)}".rstrip() if rng.random() < 0.9 else f"{version} {status}"]
    for _ in range(rng.randint(0, 6)):
        lines.append(f"{header_name(rng)}:{rng.choice(['', ' ', '  ', chr(9)])}{header_value(rng)}")
    if rng.random() < 0.2:  # a repeated header
        lines += ["X-Repeated: one", "X-Repeated: two"]
    if rng.random() < 0.1:  # obs-fold: a value continued on the next line, which a client unfolds
        lines += [f"X-Folded: {header_value(rng)}", rng.choice([" ", "\t", "   "]) + header_value(rng)]
    close = rng.random() < 0.25 or version == "HTTP/1.0"
    if close:
        lines.append(rng.choice(["Connection: close", "connection: Close", "Connection: keep-alive, close"]))
    size = rng.choice([0, 1, 10, 100, 1000, MAX_BODY, MAX_BODY + 1, 5000]) if rng.random() < 0.9 else 0
    body = bytes(rng.getrandbits(8) for _ in range(size))
    framing = rng.choice(["length", "chunked", "close"]) if status not in (204, 304) else "none"
    if framing == "chunked" and version == "HTTP/1.0":
        framing = "length"
    if framing == "length":
        lines.append(f"Content-Length: {len(body)}")
    elif framing == "chunked":
        lines.append("Transfer-Encoding: chunked")
    elif framing == "none":
        body = b""
    head = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n"
    informational = b"HTTP/1.1 100 Continue\r\n\r\n" if rng.random() < 0.1 else b""
    payload = chunked(rng, body, trailers=rng.random() < 0.3) if framing == "chunked" else body
    eof = framing == "close" or close or rng.random() < 0.1
    return informational + head + payload, eof


BROKEN_STATUS = [
    b"HTTP/1.1 2000 OK", b"HTTP/1.1 20 OK", b"HTTP/1.1 abc OK", b"HTP/1.1 200 OK", b"HTTP/1.1  200 OK",
    b"HTTP/1.1 +200 OK", b"HTTP/1.1 -20 OK", b"HTTP/2 200 OK", b"ICY 200 OK", b"HTTP/1.1", b"", b"HTTP/1.1 200OK",
    b"HTTP/1.1 2_0 OK", b"HTTP/1.1 099 Low",
]  # fmt: skip
BROKEN_HEADERS = [
    b"NoColonHere", b"Bad Name: x", b"Name : x", b"Na\x00me: x", b": empty-name", b"X-Ok: a\x00b", b"X-\x7f: x",
    b"(x): y", b"X-Ok\x01: y",
]  # fmt: skip
BROKEN_CHUNK_SIZES = [b"zz", b"-1", b"0x5", b"5 5", b"", b"1_0", b"+5", b" 5", b"ffffffffffffffffffffffff"]
BROKEN_LENGTHS = [b"abc", b"-5", b"+5", b"5, 6", b"1_0", b"0x10", b" ", b"5 5"]


def broken(rng: random.Random) -> tuple[bytes, bool]:
    """A response with one defect, or a well-formed one cut short."""
    body = b"0123456789"
    kind = rng.choice(["status", "header", "chunk", "length", "cut", "chunk_crlf"])
    status_line, headers = b"HTTP/1.1 200 OK", [b"X-A: 1"]
    payload, eof = body, rng.random() < 0.5
    if kind == "status":
        status_line = rng.choice(BROKEN_STATUS)
        headers.append(b"Content-Length: 10")
    elif kind == "header":
        headers.insert(rng.randint(0, len(headers)), rng.choice(BROKEN_HEADERS))
        headers.append(b"Content-Length: 10")
    elif kind == "chunk":
        headers.append(b"Transfer-Encoding: chunked")
        payload = b"a\r\n" + body + b"\r\n" + rng.choice(BROKEN_CHUNK_SIZES) + b"\r\nxxxxx\r\n0\r\n\r\n"
    elif kind == "chunk_crlf":
        headers.append(b"Transfer-Encoding: chunked")
        payload = b"a\r\n" + body + b"XX0\r\n\r\n"
    elif kind == "length":
        headers.append(b"Content-Length: " + rng.choice(BROKEN_LENGTHS))
    else:  # cut: a valid response that stops early, then EOF
        data, _ = valid(rng)
        return data[: rng.randint(0, max(0, len(data) - 1))], True
    return status_line + b"\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + payload, eof


def split(rng: random.Random, data: bytes) -> list[bytes]:
    if rng.random() < 0.05:
        return [data[i : i + 1] for i in range(len(data))]  # byte by byte
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 6)))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def agree(mine: Verdict, reference: Verdict) -> bool:
    if mine.truncated:
        # The client stopped at the cap: h11 read the same head and the same first MAX_BODY bytes, and
        # the body goes on (or h11 was still reading, or failed, past the point the client stopped).
        return (
            (mine.status, mine.headers) == (reference.status, reference.headers)
            and len(mine.body) == MAX_BODY
            and reference.body.startswith(mine.body)
            and (len(reference.body) > MAX_BODY or not reference.complete)
            and not mine.reusable
        )
    if not mine.accepted or not reference.accepted:
        return mine.accepted == reference.accepted
    return (mine.status, mine.headers, mine.body, mine.reusable) == (
        reference.status,
        reference.headers,
        reference.body,
        reference.reusable,
    )


def run_cases(make, count: int, seed: int) -> tuple[list[str], dict[str, int]]:  # noqa: ANN001
    """Disagreements, and how the agreed cases fell (accepted, rejected, truncated)."""
    rng = random.Random(seed)
    disagreements = []
    tally = {"accepted": 0, "rejected": 0, "truncated": 0}

    async def run() -> None:
        for i in range(count):
            data, eof = make(rng)
            pieces = split(rng, data)
            mine, reference = ours(pieces, eof), theirs(pieces, eof)
            if not agree(mine, reference):
                disagreements.append(f"case {i}: {data[:300]!r} eof={eof}\n  ours:   {mine}\n  h11:    {reference}")
            else:
                tally["truncated" if mine.truncated else "accepted" if mine.accepted else "rejected"] += 1

    asyncio.run(run())  # the connection takes the running loop's clock
    return disagreements, tally


@pytest.mark.timeout(120)
def test_well_formed_responses_parse_as_h11_parses_them():
    problems, tally = run_cases(valid, CASES, SEED)
    assert not problems, f"{len(problems)} of {CASES} disagree:\n" + "\n".join(problems[:5])
    assert tally["accepted"] > CASES // 2 and tally["truncated"] > CASES // 20, tally


@pytest.mark.timeout(120)
def test_malformed_and_cut_responses_are_rejected_where_h11_rejects_them():
    problems, tally = run_cases(broken, CASES, SEED + 1)
    assert not problems, f"{len(problems)} of {CASES} disagree:\n" + "\n".join(problems[:5])
    assert tally["rejected"] > CASES // 2, tally


def test_the_harness_sees_a_disagreement():
    """The comparison is not vacuous: a parser that drops the last body byte is caught."""
    rng = random.Random(1)
    data = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"
    reference = theirs(split(rng, data), False)
    assert reference.accepted and reference.body == b"abc" and reference.reusable

    async def mine() -> Verdict:
        return ours([data], False)

    assert agree(asyncio.run(mine()), reference)
    assert not agree(Verdict(200, {"content-length": "3"}, b"ab", True), reference)


def test_the_client_stands_below_notifications_and_is_told_what_to_refuse():
    """core.http imports nothing of OmniPost's apps (nor Django); the SSRF check is handed to it."""
    import subprocess
    import sys

    code = (
        "import sys, core.http; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'notifications', 'queueing', 'dlq', 'django'}))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=30, check=True
    )
    assert out.stdout.strip() == "[]"
    with pytest.raises(TypeError, match="guard"):
        core_http.HttpClient()  # type: ignore[call-arg] - no client without a guard


@pytest.mark.timeout(30)
def test_a_huge_hostile_head_is_refused_in_linear_time():
    """A receiver is the tenant's: a 60 KB header of spaces ending in a NUL must not make the regexes
    backtrack (the head limit is 64 KB)."""
    import time

    async def run() -> float:
        started = time.process_time()
        for head in (b"X-A: a" + b" " * 60_000 + b"\x00", b"X-A:" + b" a" * 30_000 + b"\x00", b" " * 60_000):
            assert not ours([b"HTTP/1.1 200 OK\r\n" + head + b"\r\nContent-Length: 0\r\n\r\n"], False).accepted
        return time.process_time() - started

    assert asyncio.run(run()) < 0.5
