"""TLS for the listeners (``tls.cert``, ``tls.key``): one server context shared by the HTTP/WebSocket
listener and every TCP listener (native now; mist and qrpc use :func:`server_context` the same way, passing
it as ``ssl=`` to ``asyncio.start_server``).

The context is built once and reloaded in place (:func:`reload_context`, on SIGHUP): connections already
open keep their session, new handshakes use the new certificate.
"""

from __future__ import annotations

import ssl

__all__ = ["reload_context", "server_context"]


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """A server-side context with the certificate chain in ``cert`` and its private key in ``key`` (PEM
    files): TLS 1.2 or newer, the standard library's secure defaults otherwise. Raises :class:`OSError` or
    :class:`ssl.SSLError` when the files cannot be read or do not match."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


def reload_context(ctx: ssl.SSLContext, cert: str, key: str) -> None:
    """Load a renewed certificate and key into ``ctx`` for the handshakes from now on."""
    ctx.load_cert_chain(cert, key)
