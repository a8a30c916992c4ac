"""OmniPost's HTTP/1.1 client (client.py): the webhook and Twilio providers' transport.

Kept hand-written because it wins end to end, measured side by side with aiohttp in one sitting
(FIGURES). Knows nothing of notifications: the SSRF check comes in as `guard`
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
