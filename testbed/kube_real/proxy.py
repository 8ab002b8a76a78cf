"""A proxy in front of the real API server that can park one request: kill points on a real cluster.

The kill-point tests (testbed/kill_points.py) SIGKILL the worker while one request
of a placement step is parked, before it reaches the API server (`applied=False`) or
after the API server made the change but before the worker hears of it (`applied=True`).
The fake API server parks requests itself (`FakeKubeServer.hold_next`); in front of the
real one this proxy does the same, with the same `Hold` (testbed/kube_fake/faults.py):
`arrived`, `release()`, `drop()`.

It serves HTTPS on 127.0.0.1 with the test bed's webhook certificate (signed by the CA
the kubeconfig trusts, for 127.0.0.1), forwards every request with its own headers
(the caller's bearer token included) and streams answers back chunk by chunk, so
watches pass through. A dropped request's connection is closed without an answer.
"""

from __future__ import annotations

import contextlib
import http.server
import re
import socket
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from testbed.kube_fake.faults import Hold, RecordedRequest
from testbed.kube_real.apiserver import ApiServer
from testbed.kube_real.cluster import RealCluster

# Hop-by-hop headers (RFC 9110) and those the proxy sets itself.
NOT_FORWARDED = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


class HoldingProxy:
    def __init__(self, server: ApiServer, on_parked: Callable[[], None] = lambda: None) -> None:
        self.server = server
        self.on_parked = on_parked  # tells waiters a request was parked (no watch event says so)
        self._cond = threading.Condition()
        self._holds: list[Hold] = []
        self._cancel = threading.Event()
        self._upstream = httpx.Client(
            base_url=server.url, verify=server.tls_context(), timeout=httpx.Timeout(30, read=None)
        )
        handler = _handler_for(self)
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(server.webhook_cert), str(server.webhook_key))
        self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="holding proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self._httpd.server_address[1]}"

    def kubeconfig(self, path: Path, *, token: str | None = None, namespace: str = "default") -> Path:
        """A kubeconfig for the API server through this proxy."""
        self.server.kubeconfig(path, token=token, namespace=namespace)
        path.write_text(path.read_text().replace(self.server.url, self.url))
        return path

    def hold_next(self, method: str, path_regex: str, *, body: str | None = None, applied: bool) -> Hold:
        """Park the next request matching (method, path, a substring of its body), as the fake does."""
        hold = Hold(self._cond, method, re.compile(path_regex), body, applied)
        with self._cond:
            self._holds.append(hold)
        return hold

    def disarm(self, hold: Hold) -> None:
        """A hold that never caught its request must not catch a later one; a parked one is dropped."""
        with self._cond:
            if hold in self._holds:
                self._holds.remove(hold)
        if hold.arrived:
            hold.drop()

    def stop(self) -> None:
        self._cancel.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._upstream.close()

    def _catch(self, method: str, path: str, raw: bytes) -> Hold | None:
        with self._cond:
            for hold in self._holds:
                if hold.matches(method, path, raw):
                    hold.request = RecordedRequest(method, path, {}, "", None)
                    self._holds.remove(hold)
                    self._cond.notify_all()
                    break
            else:
                return None
        self.on_parked()
        return hold

    def forward(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        path = handler.path.split("?", 1)[0]
        hold = self._catch(handler.command, path, raw)
        if hold is not None and not hold.applied and not hold.park(self._cancel):
            _close(handler)  # dropped before it reached the API server: it never happens
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in NOT_FORWARDED}
        request = self._upstream.build_request(handler.command, handler.path, headers=headers, content=raw)
        try:
            response = self._upstream.send(request, stream=True)
        except httpx.HTTPError:
            _close(handler)
            return
        try:
            if hold is not None and hold.applied:
                body = response.read()  # the change is made; its answer waits for the test
                if not hold.park(self._cancel):
                    _close(handler)
                    return
                _answer(handler, response, [body])
            else:
                _answer(handler, response, response.iter_raw())
        except (OSError, httpx.HTTPError):
            _close(handler)  # the client went away (a killed worker), or the API server did
        finally:
            response.close()


def _answer(handler: http.server.BaseHTTPRequestHandler, response: httpx.Response, chunks: Any) -> None:
    handler.send_response(response.status_code)
    for name, value in response.headers.items():
        if name.lower() not in NOT_FORWARDED and name.lower() != "content-encoding":
            handler.send_header(name, value)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    for chunk in chunks:
        if chunk:
            handler.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            handler.wfile.flush()
    handler.wfile.write(b"0\r\n\r\n")
    handler.wfile.flush()


def _close(handler: http.server.BaseHTTPRequestHandler) -> None:
    handler.close_connection = True
    with contextlib.suppress(OSError):
        handler.connection.shutdown(socket.SHUT_RDWR)


def _handler_for(proxy: HoldingProxy) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            proxy.forward(self)

        do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the tests read the API server's state, not this log

    return Handler


class ProxiedCluster(RealCluster):
    """A test's real cluster whose clients go through a HoldingProxy: the fake's `hold_next` too."""

    def __init__(self, server: ApiServer, namespace: str) -> None:
        super().__init__(server, namespace)
        self.proxy = HoldingProxy(server, on_parked=self.changes.bump)

    def kubeconfig(self, path: str | Path, *, token: str | None = None, namespace: str = "default") -> Path:
        return self.proxy.kubeconfig(Path(path), token=token, namespace=namespace)

    def hold_next(self, method: str, path_regex: str, *, body: str | None = None, applied: bool) -> Hold:
        return self.proxy.hold_next(method, path_regex, body=body, applied=applied)

    def disarm(self, hold: Hold) -> None:
        self.proxy.disarm(hold)

    def stop(self) -> None:
        self.proxy.stop()
        super().stop()
