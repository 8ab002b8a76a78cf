"""Serving certificate, reloaded from its files when they change (cert-manager rotation).

uvicorn hands one `ssl.SSLContext` to asyncio for the life of the server. That
context's SNI callback runs at the start of every TLS handshake (with or
without SNI from the client) and may switch the connection to another
context; so the listening context stays fixed while each new connection gets
the most recently loaded certificate. Connections already open keep theirs.

The files are checked at most once per `check_interval` seconds (a `stat` of
each, following symlinks, as the kubelet swaps a mounted Secret through a
symlink). A half-written pair (new certificate, old key) fails to load: the
previous certificate keeps being served and the load is retried.
"""

import logging
import os
import ssl
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)


class CertificateError(Exception):
    """The certificate/key pair cannot be loaded; the message says why."""


def _signature(*paths: Path) -> tuple[tuple[int, int, int], ...]:
    stats = [os.stat(p) for p in paths]
    return tuple((s.st_mtime_ns, s.st_size, s.st_ino) for s in stats)


def new_server_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The API server speaks HTTP/1.1 to webhooks when HTTP/2 is not offered.
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(certfile=cert_file, keyfile=key_file)
    except (ssl.SSLError, OSError) as error:
        reason = getattr(error, "strerror", None) or getattr(error, "reason", None) or str(error)
        raise CertificateError(
            f"cannot load certificate {cert_file} with key {key_file} ({reason}): "
            "they must be a PEM certificate (chain) and its matching PEM private key"
        ) from None
    return context


class ReloadingCertificate:
    def __init__(self, cert_file: Path, key_file: Path, *, check_interval: float = 1.0) -> None:
        self.cert_file, self.key_file = Path(cert_file), Path(key_file)
        self.check_interval = check_interval
        self.reloads = 0
        self.failed_reloads = 0
        self._lock = threading.Lock()
        self._checked_at = time.monotonic()
        try:
            self._signature = _signature(self.cert_file, self.key_file)
        except OSError as error:
            raise CertificateError(f"cannot read {error.filename}: {error.strerror}") from None
        self._current = new_server_context(self.cert_file, self.key_file)
        # The listening context: a valid certificate of its own (in case a
        # handshake ever skips the callback) and the switch to the current one.
        self._listener = new_server_context(self.cert_file, self.key_file)
        self._listener.sni_callback = self._select

    @property
    def server_context(self) -> ssl.SSLContext:
        """The context to hand to the server once; it keeps serving the newest certificate."""
        return self._listener

    def current(self) -> ssl.SSLContext:
        """The context for a new connection, reloaded first if the files changed."""
        now = time.monotonic()
        if now - self._checked_at >= self.check_interval:
            with self._lock:
                if now - self._checked_at >= self.check_interval:
                    self._checked_at = now
                    self._reload_if_changed()
        return self._current

    def _reload_if_changed(self) -> None:
        try:
            signature = _signature(self.cert_file, self.key_file)
        except OSError as error:
            log.warning("cannot stat the TLS files (%s); still serving the previous certificate", error)
            return
        if signature == self._signature:
            return
        try:
            context = new_server_context(self.cert_file, self.key_file)
        except CertificateError as error:
            # Typically a rotation caught halfway; the next check tries again.
            self.failed_reloads += 1
            log.warning("%s; still serving the previous certificate", error)
            return
        self._current, self._signature = context, signature
        self.reloads += 1
        log.info("reloaded the TLS certificate from %s", self.cert_file)

    def _select(
        self, connection: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        connection.context = self.current()
