"""OmniPost's HTTP/1.1 client (client.py): the webhook and Twilio providers' transport.

Hand-written because it wins end to end. Measured against aiohttp 3.14.5 (a transport with the same
guarantees: a resolver pinning the SSRF-checked addresses, no redirects, one total deadline, the
body cap, abort on cancel; commit 70e55dd, OMNIPOST_HTTP_CLIENT=aiohttp), side by side in one
sitting on a 2-core machine shared with other work, 2026-12-01, each figure the median of 5
alternating runs (A/B/A/B):

| | this client | aiohttp |
|---|---|---|
| `bench/send_path_bench.py`, CPU per delivery | 27.1 µs | 167.8 µs (6.2×) |
| `bench/versus.py --delay-ms 0 -n 120000`, OmniPost / graphile-worker | 1.46 | 0.30 |
| the same, OmniPost deliveries per second | 20,489 | 5,978 |

A second sitting (busier machine, load 7–17) gave 1.17 against 0.48. The ratio's run-to-run spread
is wide (0.62–2.72 for this client, with the anchor's own rate moving 6k–28k/s), but each of the 10
adjacent pairs favoured this client (by 1.4× to 7.7×) and the send-path CPU ranges do not overlap
(19–32 µs against 133–182 µs): at 0 ms the dispatchers are CPU-bound, and aiohttp's task, request
and response objects cost ≈ 140 µs a delivery more. httpx is further behind still
(bench/http_client_bench.py). The parser is held to h11's verdicts by tests/core/test_http_conformance.py.

Knows nothing of notifications: the SSRF check comes in as `guard`
(notifications.providers.transport.new_client builds the client the providers use).
"""

from core.http.client import (
    DEFAULT_MAX_BODY_BYTES,
    USER_AGENT,
    Guard,
    HttpClient,
    HttpConnectError,
    HttpDnsError,
    HttpError,
    HttpProtocolError,
    HttpTimeout,
    HttpTlsError,
    OnDone,
    Origin,
    Resolver,
    Response,
    build_head,
    split_url,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "USER_AGENT",
    "Guard",
    "HttpClient",
    "HttpConnectError",
    "HttpDnsError",
    "HttpError",
    "HttpProtocolError",
    "HttpTimeout",
    "HttpTlsError",
    "OnDone",
    "Origin",
    "Resolver",
    "Response",
    "build_head",
    "split_url",
]
