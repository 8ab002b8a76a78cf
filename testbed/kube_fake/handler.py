"""HTTP/1.1 front end: URL routing, verbs, JSON bodies, chunked watch streams."""

from __future__ import annotations

import contextlib
import io
import json
import re
import select
import socket
import sys
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from . import discovery, errors, subresources
from .faults import Hold
from .resources import ResourceType
from .store import Filter, Mode
from .watch import WatchStream, parse_rv

if TYPE_CHECKING:
    from .server import FakeKubeServer

JSON = dict[str, Any]
_TRUE = ("true", "1")
_NOSNIFF = {"X-Content-Type-Options": "nosniff"}


def _int_param(query: dict[str, str], name: str) -> int:
    """An int64 query parameter, refused in the words of Go's strconv.ParseInt (400)."""
    value = query[name]
    if not re.fullmatch(r"[+-]?[0-9]+", value):
        raise errors.bad_request(f'strconv.ParseInt: parsing "{value}": invalid syntax')
    number = int(value)
    if not -(2**63) <= number < 2**63:
        raise errors.bad_request(f'strconv.ParseInt: parsing "{value}": value out of range')
    return number


class KubeHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: FakeKubeServer) -> None:
        self.app = app
        self.connections: set[socket.socket] = set()
        super().__init__(address, KubeHandler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        with self.app.store.cond:
            self.connections.add(sock)
        return sock, addr

    def shutdown_request(self, request: Any) -> None:
        with self.app.store.cond:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client killed mid-connection (the kill-point tests and the soak SIGKILL the
        # worker) resets its sockets; that is the client's business, not a server error
        # worth a traceback. Anything else is still printed.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def drop_connections(self) -> None:
        """Unblock handler threads parked on idle keep-alive sockets."""
        with self.app.store.cond:
            socks = list(self.connections)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class KubeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: KubeHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log on the server object replaces access logs

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ------------------------------------------------------------- plumbing
    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self, code: int, data: bytes, ctype: str = "application/json", headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _send_json(self, code: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(code, json.dumps(obj, separators=(",", ":")).encode(), headers=headers)

    def _alive(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return not readable or self.connection.recv(1, socket.MSG_PEEK) != b""
        except OSError:
            return False

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _handle(self, method: str) -> None:
        app = self.server.app
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        try:
            raw = self._read_body()
            ctype = self.headers.get("Content-Type", "")
            recorded = app.faults.record(method, url.path, query, ctype, raw)
            hold = app.faults.take_hold(method, url.path, raw, recorded)
            if hold is not None and not hold.applied and not app.faults.park(hold):
                self.close_connection = True  # dropped: never applied, never answered
                return
            watching = query.get("watch", "").lower() in _TRUE
            delay, injected = app.faults.take(method, url.path, watch=watching)
            if delay:
                app.faults.sleep(delay)
            if injected is not None:
                raise injected
            public = url.path in ("/healthz", "/livez", "/readyz")
            if app.token and not public and self.headers.get("Authorization") != f"Bearer {app.token}":
                raise errors.ApiError(401, "Unauthorized", "Unauthorized")
            if hold is not None and hold.applied:
                self._route_then_park(hold, method, url.path, query, ctype, raw)
            else:
                self._route(method, url.path, query, ctype, raw)
        except errors.ApiError as exc:
            self._send_json(exc.code, exc.status(), exc.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            err = errors.ApiError(500, "InternalError", f"Internal error occurred: kube_fake: {exc!r}")
            self._send_json(500, err.status())

    def _route_then_park(
        self, hold: Hold, method: str, path: str, query: dict[str, str], ctype: str, raw: bytes
    ) -> None:
        """Apply the request now, answer it (whatever the answer) only once the hold is released."""
        socket_file, self.wfile = self.wfile, io.BytesIO()
        try:
            try:
                self._route(method, path, query, ctype, raw)
            except errors.ApiError as exc:
                self._send_json(exc.code, exc.status(), exc.headers)
            answer = self.wfile.getvalue()
        finally:
            self.wfile = socket_file
        if not self.server.app.faults.park(hold):
            self.close_connection = True
            return
        self.wfile.write(answer)

    # -------------------------------------------------------------- routing
    def _route(self, method: str, path: str, query: dict[str, str], ctype: str, raw: bytes) -> None:
        app = self.server.app
        reg = app.registry
        path = path.rstrip("/") or "/"  # VersionApi asks for "/version/"
        if path in ("/healthz", "/livez", "/readyz"):
            return self._send(200, b"ok", "text/plain; charset=utf-8")
        if path == "/version":
            return self._send_json(200, discovery.VERSION_INFO)
        parts = [p for p in path.split("/") if p]
        doc: JSON | None = None
        if parts == ["api"]:
            doc = discovery.api_versions(f"{app.host}:{app.port}")
        elif parts == ["apis"]:
            doc = discovery.api_group_list(reg)
        elif len(parts) == 2 and parts[0] == "apis":
            doc = discovery.api_group(reg, parts[1])
        elif len(parts) == 2 and parts[0] == "api":
            doc = discovery.resource_list(reg, "", parts[1])
        elif len(parts) == 3 and parts[0] == "apis":
            doc = discovery.resource_list(reg, parts[1], parts[2])
        if doc is not None:
            return self._send_json(200, doc)
        if (
            not parts
            or parts[0] not in ("api", "apis")
            or (parts[0] == "apis" and parts[1] not in reg.groups())
        ):
            # No handler at all for the path (a group the server does not serve, or no API path):
            # the real server's mux answers in plain text, not with a Status.
            return self._send(404, b"404 page not found\n", "text/plain; charset=utf-8", _NOSNIFF)
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise errors.generic(404)  # a served group at a version it does not serve: a Status
        namespace: str | None = None
        scoped = len(rest) >= 3 and rest[0] == "namespaces"
        if scoped and (reg.get(group, version, rest[2]) is not None or rest[2] == "bindings"):
            # /namespaces/{ns}/{plural}..., as opposed to /namespaces/{name}/status
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise errors.generic(404)
        plural, name, sub = (
            rest[0],
            (rest[1] if len(rest) > 1 else None),
            (rest[2] if len(rest) > 2 else None),
        )
        if (group, plural) == ("", "bindings") and namespace and name is None and method == "POST":
            # Legacy POST /api/v1/namespaces/{ns}/bindings (pod name in the body).
            body = self._json(raw)
            pod_name = str(((body or {}).get("metadata") or {}).get("name") or "")
            if not pod_name:
                raise errors.bad_request("Name parameter required.")
            pods = reg.resolve("pods")
            return self._send_json(201, subresources.bind(app.store, pods, namespace, pod_name, body))
        rt = reg.get(group, version, plural)
        if rt is None or (rt.namespaced and namespace is None and name is not None):
            raise errors.generic(404)
        if not rt.namespaced and namespace is not None:
            raise errors.generic(404)
        if method != "GET" and query.get("dryRun"):
            raise errors.bad_request("kube_fake: dryRun is not supported")
        if name is None:
            return self._collection(method, rt, namespace, query, raw)
        return self._object(method, rt, namespace, name, sub, query, ctype, raw)

    @staticmethod
    def _json(raw: bytes) -> Any:
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise errors.bad_request(f"error decoding request body: {exc}") from exc

    def _collection(
        self, method: str, rt: ResourceType, ns: str | None, query: dict[str, str], raw: bytes
    ) -> None:
        store = self.server.app.store
        if method == "GET":
            # Decoded into ListOptions (a bad one fails the request) even where the fake then ignores it.
            parse_rv(query.get("resourceVersion"))
            if query.get("timeoutSeconds"):
                _int_param(query, "timeoutSeconds")
            flt = store.make_filter(rt, query.get("labelSelector"), query.get("fieldSelector"))
            if query.get("watch", "").lower() in _TRUE:
                return self._watch(rt, ns, flt, query)
            return self._send_json(200, store.list_objects(rt, ns, flt))
        if method == "POST" and (ns is not None or not rt.namespaced):
            return self._send_json(201, store.create(rt, ns, self._json(raw)))
        raise errors.method_not_allowed()

    def _object(
        self,
        method: str,
        rt: ResourceType,
        ns: str | None,
        name: str,
        sub: str | None,
        query: dict[str, str],
        ctype: str,
        raw: bytes,
    ) -> None:
        app = self.server.app
        store = app.store
        is_pod = rt.key == ("", "pods")
        if sub is None or (sub == "status" and rt.status_subresource):
            mode: Mode = "status" if sub else "main"
            if method == "GET":
                return self._send_json(200, store.get(rt, ns, name))
            if method == "PUT":
                return self._send_json(200, store.update(rt, ns, name, self._json(raw), mode))
            if method == "PATCH":
                return self._send_json(200, store.patch(rt, ns, name, ctype, raw, mode))
            if method == "DELETE" and sub is None:
                options = dict(self._json(raw) or {})
                if "gracePeriodSeconds" in query:
                    options["gracePeriodSeconds"] = _int_param(query, "gracePeriodSeconds")
                return self._send_json(200, store.delete(rt, ns, name, options))
            raise errors.method_not_allowed()
        if is_pod and sub in ("binding", "eviction") and ns is not None:
            if method != "POST":
                raise errors.method_not_allowed()
            body = self._json(raw)
            if sub == "binding":
                return self._send_json(201, subresources.bind(store, rt, ns, name, body))
            evicted = subresources.evict(
                store, rt, ns, name, body, app.evictions, sync_budgets=app.disruption_controller is not None
            )
            return self._send_json(201, evicted)
        raise errors.generic(404)

    def _watch(self, rt: ResourceType, ns: str | None, flt: Filter, query: dict[str, str]) -> None:
        start_rv = parse_rv(query.get("resourceVersion"))
        timeout = _int_param(query, "timeoutSeconds") if query.get("timeoutSeconds") else None
        stream = WatchStream(
            self.server.app.store,
            rt,
            ns,
            flt,
            start_rv=start_rv,
            timeout=timeout,
            allow_bookmarks=query.get("allowWatchBookmarks", "").lower() in _TRUE,
            send_initial_events=query.get("sendInitialEvents", "").lower() in _TRUE,
            write=self._write_chunk,
            alive=self._alive,
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if stream.run():
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.close_connection = True
