"""Whether an address stays on this machine: what `serve` and `rpc-server` bind without
--allow-remote."""
from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """A loopback literal, ``localhost``, or a name that resolves only to loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False
