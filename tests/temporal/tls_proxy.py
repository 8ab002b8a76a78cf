"""A mutual-TLS front for the Temporal dev server, which itself speaks only plaintext.

It terminates TLS with a server certificate, accepts only client certificates
signed by the CA it currently trusts, and pipes the bytes to the dev server. So
the client side is real: the SDK's own TLS stack negotiates with certificate
files, against a real Temporal behind. `trust(ca)` is a CA rotation on the
server side: from then on only certificates of the new CA get in, and every open
connection is dropped, as a frontend restarted with a new CA would do.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import trustme


class MutualTLSProxy:
    def __init__(self, upstream: str, server_cert: trustme.LeafCert, client_ca: trustme.CA) -> None:
        host, _, port = upstream.rpartition(":")
        self._upstream = (host, int(port))
        self._server_cert = server_cert
        self._context = self._make_context(client_ca)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self.handshakes_refused = 0

    def _make_context(self, client_ca: trustme.CA) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_cert.configure_cert(context)
        client_ca.configure_trust(context)
        context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["h2"])  # gRPC
        return context

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> MutualTLSProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.drop_connections()
        await self._server.wait_closed()

    def trust(self, client_ca: trustme.CA) -> None:
        """Accept only certificates of `client_ca` from now on, and drop every open connection."""
        self._context = self._make_context(client_ca)
        self.drop_connections()

    def drop_connections(self) -> None:
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            try:
                await writer.start_tls(self._context)
            except (ssl.SSLError, ConnectionError, OSError):
                self.handshakes_refused += 1
                return
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
            try:
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
            finally:
                up_writer.transport.abort()
        finally:
            self._open.discard(writer)
            writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
        writer.transport.abort()
