"""One seam to the Kubernetes API: raw JSON over the official client's transport.

The `kubernetes` package gives us configuration (kubeconfig, in-cluster service
account, exec plugins, TLS) and an aiohttp transport. We deliberately skip its
generated models: they reject fields they do not know, so a newer API server
(or a CRD) would break deserialisation, and the bridge only needs a handful of
fields. Every call returns the API server's JSON as a dict.
"""

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
    """A non-2xx answer, with the API server's own Status message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"Kubernetes API {status} {reason}: {message}")

    @property
    def retryable(self) -> bool:
        # 409 is retryable too: the caller re-reads and tries again.
        return self.status in (0, 409, 429) or self.status >= 500


class KubeNotFound(KubeError):
    pass


class KubeConflict(KubeError):
    pass


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
        response = await self._send(
            method, path, query=query, body=body, content_type=content_type, timeout=timeout
        )
        try:
            data = await response.read()
        finally:
            response.release()
        decoded = json.loads(data) if data else {}
        if response.status >= 300:
            raise _error(response.status, decoded)
        return decoded if isinstance(decoded, dict) else {}

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
        try:
            if response.status == 410:
                raise WatchExpired(path)
            if response.status >= 300:
                data = await response.read()
                raise _error(response.status, json.loads(data) if data else {})
            async for line in _lines(response):
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(str(obj.get("message")))
                    raise _error(int(obj.get("code") or 500), obj)
                yield event
        finally:
            response.release()


async def _lines(response: Any) -> AsyncIterator[bytes]:
    """The watch stream's lines; a dropped connection becomes a KubeError the watcher handles."""
    try:
        async for line in response.content:
            yield line
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        raise KubeError(0, "Disconnected", f"watch stream broke: {error}") from error


def _error(status: int, body: Any) -> KubeError:
    body = body if isinstance(body, dict) else {}
    reason, message = str(body.get("reason") or ""), str(body.get("message") or "")
    if status == 404:
        return KubeNotFound(status, reason or "NotFound", message)
    if status == 409:
        return KubeConflict(status, reason or "Conflict", message)
    return KubeError(status, reason, message)
