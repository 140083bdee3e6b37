"""Where a webhook may post, and the post itself.

A URL is ``http(s)`` without ``user:password@``; its host is resolved and every address
must be public (not loopback, private, shared, link-local, multicast, unspecified or
reserved, in IPv4, IPv6 or an IPv6 form of an IPv4 address), and not a cloud metadata
name, unless it lies in a range of ``GYRE_WEBHOOK_ALLOW_NETS``. The check runs when a
webhook is registered and again at each attempt, and the attempt connects to the address
it checked (the ``Host`` header and TLS name stay the URL's), so a name that resolves
differently a moment later cannot move the post. Redirects are not followed. One attempt
takes at most ``GYRE_WEBHOOK_TIMEOUT_SECONDS`` in all: a target that answers slowly, byte
by byte, is cut off then.

What an attempt reports is a class, never the target's words: ``2xx`` to ``5xx``, or
``failed`` with a reason among :data:`REASONS`."""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

IP = ipaddress.IPv4Address | ipaddress.IPv6Address
METADATA_NAMES = {"metadata", "metadata.google.internal", "metadata.goog"}
SHARED = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")
REASONS = (
    "bad URL",
    "refused address",  # not public and not allowed, or a metadata name
    "unresolved host",
    "timeout",
    "connection error",
    "TLS error",
    "not an HTTP answer",
    "error",
)


class Refused(ValueError):
    """A URL a webhook may not use; ``reason`` says why in general terms."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class AttemptFailed(Exception):
    def __init__(self, reason: str, *, unconnected: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unconnected = unconnected  # nothing was sent: another address may be tried


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str
    addresses: tuple[str, ...]  # checked, in the resolver's order


def _embedded(ip: IP) -> list[IP]:
    """The address itself and any IPv4 address that an IPv6 form of it carries."""
    out: list[IP] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            out.append(ip.ipv4_mapped)
        if ip.sixtofour is not None:
            out.append(ip.sixtofour)
        if ip in NAT64:
            out.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return out


def _allowed_nets() -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(n, strict=False) for n in settings.GYRE_WEBHOOK_ALLOW_NETS]


def _public(ip: IP) -> bool:
    return ip.is_global and not ip.is_multicast and not ip.is_reserved and ip not in SHARED


def address_ok(text: str) -> bool:
    """May a webhook reach this address (``%zone`` ignored)?"""
    ip = ipaddress.ip_address(text.split("%", 1)[0])
    nets = _allowed_nets()
    for one in _embedded(ip):
        if any(one.version == n.version and one in n for n in nets):
            continue
        if not _public(one):
            return False
    return True


def _resolve(host: str, port: int, timeout: float) -> list[Any]:
    """getaddrinfo within ``timeout`` (a slow name server cannot hold the caller longer;
    the lookup itself ends on the resolver's own timeouts) -> its answers, or Refused."""
    out: list[Any] = []

    def lookup() -> None:
        with contextlib.suppress(OSError, UnicodeError):
            out.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        done.set()

    done = threading.Event()
    threading.Thread(target=lookup, name="gyre-webhook-dns", daemon=True).start()
    if not done.wait(timeout):
        raise Refused("timeout", "the host's name took too long to resolve")
    if not out:
        raise Refused("unresolved host", "the host does not resolve")
    return out


def check(url: str, *, timeout: float | None = None) -> Target:
    """The URL's parts and checked addresses, or :class:`Refused` (resolving the host
    within ``timeout``, default GYRE_WEBHOOK_TIMEOUT_SECONDS)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        raise Refused("bad URL", "not a URL with a valid host and port") from None
    if parts.scheme not in ("http", "https"):
        raise Refused("bad URL", "an http:// or https:// URL")
    if "@" in parts.netloc:
        raise Refused("bad URL", "no user:password@ in a webhook URL")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise Refused("bad URL", "a URL with a host")
    if host in METADATA_NAMES:
        raise Refused("refused address", "a metadata address")
    port = port or (443 if parts.scheme == "https" else 80)
    if timeout is None:
        timeout = float(settings.GYRE_WEBHOOK_TIMEOUT_SECONDS)
    infos = _resolve(host, port, timeout)
    addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses or not all(address_ok(a) for a in addresses):
        raise Refused(
            "refused address",
            "the host resolves to a loopback, private, link-local or otherwise non-public "
            "address (the operator may allow a range)",
        )
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(parts.scheme, host, port, path, addresses)


class _Pinned(http.client.HTTPConnection):
    """Connects to a checked address; ``Host`` stays the URL's."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.address = address
        self.raw: socket.socket | None = None

    def _open(self) -> socket.socket:
        self.raw = socket.create_connection((self.address, self.port), self.timeout)
        return self.raw

    def connect(self) -> None:
        self.sock = self._open()


class _PinnedTLS(_Pinned):
    default_port = 443

    def connect(self) -> None:
        ctx = ssl.create_default_context()
        self.sock = ctx.wrap_socket(self._open(), server_hostname=self.host)


def _status_class(status: int) -> str:
    if 200 <= status < 600:
        return f"{status // 100}xx"
    raise AttemptFailed("not an HTTP answer")


def _send(target: Target, address: str, data: bytes, timeout: float) -> str:
    cls = _PinnedTLS if target.scheme == "https" else _Pinned
    conn = cls(target.host, target.port, address, timeout)
    cut = threading.Event()

    def cut_off() -> None:  # wakes a read blocked on a trickling target
        cut.set()
        raw = conn.raw
        if raw is not None:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(raw, socket.SHUT_RDWR)

    timer = threading.Timer(timeout, cut_off)
    timer.daemon = True
    timer.start()
    try:
        try:
            conn.connect()
        except Exception as err:
            reason = "timeout" if cut.is_set() else _reason(err)
            raise AttemptFailed(reason, unconnected=reason == "connection error") from None
        headers = {"Content-Type": "application/json", "User-Agent": "gyre-alerts"}
        conn.request("POST", target.path, body=data, headers=headers)
        status = conn.getresponse().status  # the answer's body is never read
        if cut.is_set():
            raise AttemptFailed("timeout")
        return _status_class(status)
    except AttemptFailed:
        raise
    except Exception as err:
        raise AttemptFailed("timeout" if cut.is_set() else _reason(err)) from None
    finally:
        timer.cancel()
        conn.close()


def _reason(err: BaseException) -> str:
    if isinstance(err, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(err, ssl.SSLError | ssl.CertificateError):
        return "TLS error"
    if isinstance(err, http.client.HTTPException):
        return "not an HTTP answer"
    if isinstance(err, OSError):
        return "connection error"
    return "error"


def post(url: str, payload: dict[str, Any], *, timeout: float) -> tuple[str, str]:
    """One attempt -> (``"2xx"``..``"5xx"`` or ``"failed"``, reason or ""). Never raises
    for anything the target or the network does."""
    deadline = time.monotonic() + timeout
    try:
        target = check(url, timeout=timeout)
        data = json.dumps(payload).encode()
        failure = AttemptFailed("connection error")
        for address in target.addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                return "failed", "timeout"
            try:
                return _send(target, address, data, left), ""
            except AttemptFailed as err:
                if not err.unconnected:
                    return "failed", err.reason
                failure = err  # refused or unreachable: the next address
        return "failed", failure.reason
    except Refused as err:
        return "failed", err.reason
    except Exception as err:
        return "failed", _reason(err)
