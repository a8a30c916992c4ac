"""OmniPost's HTTP/1.1 client (client.py): the webhook and Twilio providers' transport.

Hand-written because it wins end to end: against aiohttp with the same guarantees (a resolver
pinning the SSRF-checked addresses, no redirects, one total deadline, the body cap, abort on cancel)
the dispatcher's send path costs several times less CPU a delivery, and at 0 ms receivers the
dispatchers are CPU-bound, so aiohttp's task, request and response objects per send are what
separates the two (side by side figures: docs/PERFORMANCE.md, "Hand-written parts"). httpx is
further behind still (bench/http_client_bench.py). The parser is held to h11's verdicts by
tests/core/test_http_conformance.py.

Knows nothing of notifications: the SSRF check comes in as `guard`
(providers.transport.new_client builds the client the providers use).
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
    refuse_whitespace,
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
    "refuse_whitespace",
    "split_url",
]
