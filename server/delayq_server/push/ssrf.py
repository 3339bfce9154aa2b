"""SSRF guard: which addresses a push may connect to, checked on the socket being connected.

The check runs in the connector's socket factory, on the exact address
aiohttp is about to connect to, after any DNS lookup: a name that resolves to a
public address at one moment and to 127.0.0.1 the next (DNS rebinding) is
refused at the connect that would use it (docs/decisions.md, push SSRF guard).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

from delayq_server.push.config import Network, Target

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Named for the refusal message; anything else not globally routable is "non-public".
METADATA = (ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254"))
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class RefusedAddress(OSError):
    """A connect to an address the target may not reach (the message says why)."""


def refusal(ip: IPAddress) -> str | None:
    """Why ``ip`` is refused by default, or None when it is a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if ip in METADATA:
        return "cloud metadata"
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip in _CGNAT:
        return "carrier-grade NAT"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non-public"
    return None


def allowed(ip: IPAddress, nets: tuple[Network, ...]) -> bool:
    return any(ip.version == n.version and ip in n for n in nets)


def check(ip: IPAddress, target: Target) -> None:
    """Raises RefusedAddress unless the target may connect to ``ip``."""
    if target.host_allowlisted or allowed(ip, target.allow_nets):
        return
    why = refusal(ip)
    if why is not None:
        raise RefusedAddress(f"address {ip} refused ({why}, not in the target's allowlist)")


def socket_factory(target: Target) -> Callable[[tuple[Any, ...]], socket.socket]:
    """A TCPConnector socket factory that refuses addresses ``target`` may not reach."""

    def make(addr_info: tuple[Any, ...]) -> socket.socket:
        family, kind, proto, _, sockaddr = addr_info
        check(ipaddress.ip_address(sockaddr[0]), target)
        return socket.socket(family=family, type=kind, proto=proto)

    return make
