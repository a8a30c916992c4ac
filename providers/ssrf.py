"""SSRF guard: refuse delivery to loopback, private, link-local and other non-public addresses.

The check runs on *resolved* addresses: the HTTP client and the SMTP provider resolve the host,
check every candidate here, then connect to the checked IP itself, so a DNS answer that changes
between the check and the connect (rebinding) cannot reach an internal address.

`settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS` turns the guard off; it is read at call time so
tests can flip it with pytest-django's `settings` fixture.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Ranges that `ipaddress`'s is_* properties do not all cover on every Python version.
_EXTRA_FORBIDDEN = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network"
        "100.64.0.0/10",  # carrier-grade NAT (RFC 6598)
        "192.0.0.0/24",  # IETF protocol assignments
        "198.18.0.0/15",  # benchmarking
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved + broadcast
        "fc00::/7",  # unique local
        "fe80::/10",  # link-local
        "fec0::/10",  # deprecated site-local
        "ff00::/8",  # multicast
        "100::/64",  # discard-only
    )
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class DestinationForbidden(Exception):
    """The destination resolves to an address the SSRF guard refuses.

    The message names the rule broken, never the address or the host: it is stored in attempts and
    the DLQ and shown to the tenant, and the resolved address of a name is internal knowledge (a
    tenant could otherwise map the network by pointing providers at names). `host` and `address`
    stay on the exception for code that must tell them apart; nothing here puts them in text.
    """

    code = "destination_forbidden"
    permanent = True

    def __init__(self, host: str, address: str | None = None) -> None:
        self.host = host
        self.address = address
        self.rule = rule_broken(address if address is not None else host)
        super().__init__(
            f"the destination resolves to {self.rule}; non-public destinations are refused "
            "(an operator can allow them with OMNIPOST_ALLOW_PRIVATE_DESTINATIONS)"
        )


def rule_broken(address: str) -> str:
    """Which rule a refused address breaks, in words that do not repeat the address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "something that is not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_v4(ip)
        if embedded is not None:
            return rule_broken(str(embedded))
        if ip.scope_id:
            return "a link-local address"
    for test, words in (
        (ip.is_unspecified, "an unspecified address"),
        (ip.is_loopback, "a loopback address"),
        (ip.is_link_local, "a link-local address"),
        (ip.is_multicast, "a multicast address"),
        (ip in _CGNAT, "a shared (carrier-grade NAT) address"),
        (ip.is_reserved, "a reserved address"),
        (ip.is_private, "a private address"),
    ):
        if test:
            return words
    return "a reserved or otherwise non-public address"


def private_allowed() -> bool:
    """True when the guard is switched off by settings (read at every call)."""
    from django.conf import settings

    return bool(getattr(settings, "OMNIPOST_ALLOW_PRIVATE_DESTINATIONS", False))


def _embedded_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_forbidden_ip(ip: IPAddress | str) -> bool:
    """True for any address that is not a plain public unicast address."""
    if isinstance(ip, str):
        ip = ipaddress.ip_address(ip)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_v4(ip)
        if embedded is not None:
            return is_forbidden_ip(embedded)
        if ip.scope_id:  # zone-scoped addresses are link-local by construction
            return True
    if (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_unspecified
        or ip.is_reserved
        or not ip.is_global
    ):
        return True
    return any(ip in net for net in _EXTRA_FORBIDDEN if net.version == ip.version)


def check_addresses(host: str, addresses: Iterable[str], *, allow_private: bool | None = None) -> None:
    """Raise DestinationForbidden if any resolved address of `host` is refused.

    Every candidate is checked (not only the first) so a mixed answer cannot slip an internal
    address past the guard on a later connect attempt.
    """
    if allow_private is None:
        allow_private = private_allowed()
    if allow_private:
        return
    for address in addresses:
        try:
            forbidden = is_forbidden_ip(address)
        except ValueError:
            forbidden = True
        if forbidden:
            raise DestinationForbidden(host, address)


def resolve_checked(host: str, port: int, *, allow_private: bool | None = None) -> list[tuple]:
    """Blocking resolve + check (for validation and the SMTP worker thread).

    Returns getaddrinfo() tuples; raises socket.gaierror or DestinationForbidden.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    check_addresses(host, (info[4][0] for info in infos), allow_private=allow_private)
    return infos


def check_host(host: str, port: int) -> None:
    """Save-time check of a destination a tenant gives (a Web Push endpoint at registration): ValueError
    with the rule it breaks, or that it does not resolve. Nothing is refused when private destinations
    are allowed. Send time checks again, on the addresses it connects to."""
    if private_allowed():
        return
    try:
        resolve_checked(host, port, allow_private=False)
    except DestinationForbidden as exc:
        raise ValueError(str(exc)) from None
    except (OSError, UnicodeError):
        raise ValueError(f"the host {host} does not resolve") from None
