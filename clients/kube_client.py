"""One seam to the Kubernetes API: raw JSON over the official client's transport.

The `kubernetes` package gives us configuration (kubeconfig, in-cluster service
account, exec plugins, TLS) and an aiohttp transport. We deliberately skip its
generated models: they reject fields they do not know, so a newer API server
(or a CRD) would break deserialisation, and the bridge only needs a handful of
fields. Every call returns the API server's JSON as a dict.

Anything else is a KubeError, and never a decoding error: the status decides its
class (404 KubeNotFound, 409 KubeConflict), and an answer that is not the API
server's JSON (a text 404 of an API group it does not serve, a proxy's HTML page,
a body or watch line cut short) is quoted in the message, with the request.
"""

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

log = logging.getLogger(__name__)

Json = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class KubeError(Exception):
    """A failed request: a non-2xx answer (with the API server's Status message, or what
    came instead), no answer at all (status 0), or an answer that could not be read."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None) -> None:
        self.status, self.reason, self.message = status, reason, message
        self.retry_after = retry_after  # seconds, when the server said (Retry-After)
        super().__init__(f"Kubernetes API {status} {reason}: {message}")

    @property
    def retryable(self) -> bool:
        # 409 is retryable too: the caller re-reads and tries again.
        return self.status in (0, 409, 429) or self.status >= 500


class KubeNotFound(KubeError):
    pass


class KubeConflict(KubeError):
    pass


class KubeBadAnswer(KubeError):
    """A 2xx answer that is not the API server's JSON object: a proxy's page, a body cut short
    or garbled, an empty one. It says nothing of the request itself and the next answer may be
    whole, so it is retryable; a read is asked again at once, a write is the caller's to repeat
    (it may have been done)."""

    @property
    def retryable(self) -> bool:
        return True


# An answer that is not the API server's JSON is quoted this far in its error: enough to
# recognise a proxy's page or where a body was cut, short enough for one log line.
EXCERPT_CHARS = 160


# Transient failures are repeated in the client a few times, quickly, before the
# error reaches an activity (whose Temporal retries back off to 30 s) or a watcher.
QUICK_RETRIES = 2
QUICK_RETRY_DELAY_SECONDS = 0.1
MAX_RETRY_AFTER_SECONDS = 1.0


class WatchBroken(KubeError):
    """A watch stream that broke off mid-way (connection cut, apiserver restarted), or carried a
    line that is not a watch event (a proxy's page, a line cut short). Always retryable: the
    watcher resumes from the last version it saw, or re-lists."""

    @property
    def retryable(self) -> bool:
        return True


# A stream that was up this long before it broke off was healthy: its last
# resourceVersion is still good, so watchers resume from it at once, as
# client-go's reflector does, instead of backing off and re-listing. One that
# breaks sooner counts as a failure (no hot loop against a server that keeps
# cutting every stream).
HEALTHY_STREAM_SECONDS = 1.0


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410): the caller must re-list."""


async def load_configuration(kubeconfig: str | None) -> kclient.Configuration:
    """A kubeconfig file when given (or found), else the in-cluster service account."""
    configuration = kclient.Configuration()
    if kubeconfig:
        await kconfig.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return configuration
    try:
        kconfig.load_incluster_config(client_configuration=configuration)
    except kconfig.ConfigException:
        await kconfig.load_kube_config(client_configuration=configuration)
    return configuration


def api_path(
    plural: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
    group: str = "",
    version: str = "v1",
) -> str:
    base = f"/apis/{group}/{version}" if group else f"/api/{version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace, safe='')}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{quote(name, safe='')}"
    if subresource is not None:
        base += f"/{subresource}"
    return base


PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")


def proxy_from_environment() -> bool:
    """Whether a proxy is set in the environment (either case, as curl and Go read them)."""
    return any(os.environ.get(name) or os.environ.get(name.lower()) for name in PROXY_VARIABLES)


class KubeClient:
    def __init__(self, configuration: kclient.Configuration) -> None:
        # The client's aiohttp session trusts the environment by default: then every request
        # looks for a proxy and reads ~/.netrc through a thread pool, which measured more than
        # half of a GET's CPU. Only a proxy in the environment needs it; a kubeconfig's
        # proxy-url is passed per request either way, and no API server takes netrc credentials.
        session = dict(getattr(configuration, "client_session_kwargs", None) or {})
        session.setdefault("trust_env", proxy_from_environment())
        configuration.client_session_kwargs = session
        self._api = kclient.ApiClient(configuration)

    async def close(self) -> None:
        await self._api.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Json:
        """One call; a read that met a transient failure, or any call refused with 429, is
        repeated a few times at once (QUICK_RETRIES) before the error reaches the caller."""
        for attempt in range(QUICK_RETRIES + 1):
            try:
                return await self._request_once(method, path, query, body, content_type, timeout)
            except KubeError as error:
                if attempt == QUICK_RETRIES or not _repeatable(method, error):
                    raise
                await asyncio.sleep(_quick_retry_delay(error, attempt))
        raise AssertionError("unreachable")

    async def _request_once(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: float,
    ) -> Json:
        response = await self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        try:
            data, cut = await _read_body(response)
        finally:
            response.release()
        what = f"{method} {path}"
        status, kind = int(response.status), str(response.headers.get("Content-Type") or "")
        if cut is not None:
            raise _unreadable(what, status, f"cut short ({_cause(cut)})", data, kind)
        # The status first: an error's body may be anything (a text 404 of an unserved API
        # group, a proxy's HTML page), and only a Status from the API server says more.
        if status >= 300:
            raise _failure(what, status, str(response.reason or ""), data, kind, response.headers)
        if status == 204:
            return {}
        if not data:
            # Never {}: a read answered with nothing must not pass for an empty object or list.
            raise _unreadable(what, status, "empty", data, kind)
        try:
            decoded = json.loads(data)
        except ValueError:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
            raise _unreadable(what, status, "not JSON", data, kind) from None
        if not isinstance(decoded, dict):
            raise _unreadable(what, status, "JSON but not an object", data, kind)
        return decoded

    async def _send(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None,
        body: Any,
        content_type: str,
        timeout: float | None,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        url_path = path + ("?" + urlencode(dict(query)) if query else "")
        method_, url, header_params, body_, _ = await self._api.param_serialize(
            method, url_path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        try:
            rest = await self._api.call_api(
                method_, url, header_params=header_params, body=body_, _request_timeout=timeout
            )
        except (OSError, TimeoutError, aiohttp.ClientError) as error:
            raise KubeError(0, "Unreachable", f"{method} {path}: {error}") from error
        except kclient.ApiException as error:
            raise KubeError(error.status or 0, str(error.reason), f"{method} {path}") from error
        return rest.response

    async def watch(
        self,
        path: str,
        *,
        resource_version: str,
        query: Mapping[str, str] | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[Json]:
        """Watch events after `resource_version`, until the server ends the stream.

        Raises WatchExpired on 410 so the caller re-lists; BOOKMARKs are passed
        through so the caller can advance its resourceVersion.
        """
        params = {
            **(query or {}),
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        response = await self._send(
            "GET",
            path,
            query=params,
            body=None,
            content_type="application/json",
            timeout=timeout_seconds + 30,
        )
        what = f"GET {path} (watch)"
        try:
            status, kind = int(response.status), str(response.headers.get("Content-Type") or "")
            if status == 410:
                raise WatchExpired(path)
            if status >= 300:
                data, cut = await _read_body(response)
                if cut is not None:
                    raise _unreadable(what, status, f"cut short ({_cause(cut)})", data, kind)
                raise _failure(what, status, str(response.reason or ""), data, kind, response.headers)
            async for line in _lines(response, what):
                event = _watch_event(line, what, status, kind)
                if event is None:
                    continue
                if event.get("type") == "ERROR":
                    obj = event.get("object")
                    obj = obj if isinstance(obj, dict) else {}
                    if obj.get("code") == 410:
                        raise WatchExpired(str(obj.get("message")))
                    raise _error(int(obj.get("code") or 500), obj)
                yield event
        finally:
            response.release()


async def _lines(response: Any, what: str) -> AsyncIterator[bytes]:
    """The watch stream's lines; a dropped connection becomes a KubeError the watcher handles."""
    try:
        async for line in response.content:
            yield line
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        raise WatchBroken(0, "Disconnected", f"{what}: the stream broke off: {_cause(error)}") from error


def _watch_event(line: bytes, what: str, status: int, content_type: str) -> Json | None:
    """One line of a watch stream as an event; None for a blank line. Anything else ends the
    stream as WatchBroken: the watcher resumes from the last event it saw, so an event whose
    line was garbled or cut is delivered again, never skipped."""
    if not line.strip():
        return None
    try:
        event = json.loads(line)
    except ValueError:  # JSONDecodeError, and UnicodeDecodeError for bytes that are not UTF-8
        event = None
    if isinstance(event, dict) and isinstance(event.get("type"), str):
        return event
    # aiohttp yields a last line without its newline when the stream ends in the middle of one.
    why = "a line that is not a watch event" if line.endswith(b"\n") else "the stream ended mid-line"
    raise WatchBroken(status, "BadWatchEvent", f"{what}: {why}: {_quoted(line, content_type)}")


async def _read_body(response: Any) -> tuple[bytes, BaseException | None]:
    """The body as far as it came, and what cut it short (None when it came whole)."""
    data = bytearray()
    try:
        async for chunk in response.content.iter_any():
            data += chunk
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        return bytes(data), error
    return bytes(data), None


def _cause(error: BaseException) -> str:
    return str(error) or type(error).__name__  # a TimeoutError says nothing by itself


def _quoted(data: bytes, content_type: str) -> str:
    """An answer as an error message shows it: its start, then its type and size."""
    text = " ".join(data.decode("utf-8", "replace").split())
    if len(text) > EXCERPT_CHARS:
        text = text[: EXCERPT_CHARS - 1] + "…"
    return f"{text!r} ({content_type or 'no content type'}, {len(data)} bytes)"


def _unreadable(what: str, status: int, why: str, data: bytes, content_type: str) -> KubeBadAnswer:
    return KubeBadAnswer(
        status, "UnreadableAnswer", f"{what}: the answer is {why}: {_quoted(data, content_type)}"
    )


def _failure(
    what: str, status: int, phrase: str, data: bytes, content_type: str, headers: Mapping[str, str]
) -> KubeError:
    """The error a non-2xx answer stands for, whatever its body."""
    try:
        body = json.loads(data) if data else None
    except ValueError:
        body = None
    if isinstance(body, dict) and (body.get("message") or body.get("reason")):
        return _error(status, body, headers.get("Retry-After"))  # the API server's Status
    # Not the API server's own words (a text 404 of an API group it does not serve, a proxy's
    # page): the HTTP reason, and what came, quoted.
    status_like = {"reason": phrase, "message": f"{what}: {_quoted(data, content_type)}"}
    return _error(status, status_like, headers.get("Retry-After"))


def _error(status: int, body: Any, retry_after: str | None = None) -> KubeError:
    body = body if isinstance(body, dict) else {}
    reason, message = str(body.get("reason") or ""), str(body.get("message") or "")
    if status == 404:
        return KubeNotFound(status, reason or "NotFound", message)
    if status == 409:
        return KubeConflict(status, reason or "Conflict", message)
    try:
        seconds = float(retry_after) if retry_after else None
    except ValueError:
        seconds = None
    return KubeError(status, reason, message, seconds)


def _repeatable(method: str, error: KubeError) -> bool:
    """Safe and worth repeating at once: a read that met no answer, a 5xx, a 429 or an answer
    it could not read (KubeBadAnswer), or any request refused with 429 and Retry-After (API
    Priority and Fairness refuses so before anything is done; a PodDisruptionBudget's 429 says
    no Retry-After and is the caller's)."""
    if error.status == 429 and error.retry_after is not None:
        return True
    transient = error.status in (0, 429) or error.status >= 500 or isinstance(error, KubeBadAnswer)
    return method == "GET" and transient


def _quick_retry_delay(error: KubeError, attempt: int) -> float:
    if error.retry_after is not None:
        return min(error.retry_after, MAX_RETRY_AFTER_SECONDS)
    return QUICK_RETRY_DELAY_SECONDS * (attempt + 1)
