"""The ASGI app: `/mutate`, `/validate`, `/healthz`, `/readyz`, `/metrics`.

Contract with the API server: a well-formed AdmissionReview always gets HTTP
200 and a decision (a failure inside a decision becomes a denial that says
so); anything else gets a 4xx with a Status body saying what is wrong. The
webhook never answers 500 and never waits on a client or the API server
without a time limit.
"""

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from clients.policy_file import PolicyFile
from webhook.device_classes import DeviceClassLookup, dra_classes_named
from webhook.metrics import Metrics
from webhook.mutate import mutate
from webhook.namespaces import ManagedNamespaces, NamespaceLookupError
from webhook.policy import AdmissionPolicy, ClusterDeviceClasses
from webhook.review import API_VERSION, AdmissionRequest, AdmissionResponse, AdmissionReview
from webhook.validate import validate

log = logging.getLogger(__name__)

# The API server caps a request at 3 MiB and an object at ~1.5 MiB; an UPDATE
# review carries two objects. 8 MiB admits anything real and bounds the rest.
DEFAULT_MAX_REQUEST_BYTES = 8 * 2**20
Decide = Callable[..., AdmissionResponse]
DECISIONS: dict[str, Decide] = {"mutate": mutate, "validate": validate}


class RequestError(Exception):
    def __init__(self, code: int, message: str) -> None:
        self.code, self.message = code, message
        super().__init__(message)


_REASONS = {400: "BadRequest", 408: "Timeout", 413: "RequestEntityTooLarge", 415: "UnsupportedMediaType"}


def status_response(code: int, message: str) -> Response:
    body = {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "message": message,
        "reason": _REASONS.get(code, "BadRequest"),
        "code": code,
    }
    return Response(json.dumps(body), status_code=code, media_type="application/json")


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise RequestError(415, f"content type {content_type!r} is not supported: send application/json")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise RequestError(413, f"the body is larger than {limit} bytes (--max-request-bytes)")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestError(413, f"the body is larger than {limit} bytes (--max-request-bytes)")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestError(408, f"the body did not arrive within {timeout:g}s") from None
    except ClientDisconnect:
        raise RequestError(400, "the client went away before sending the whole body") from None
    return b"".join(chunks)


def parse_review(body: bytes) -> AdmissionRequest:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise RequestError(400, f"the body is not JSON: {str(error)[:200]}") from None
    if not isinstance(data, dict):
        raise RequestError(400, "the body must be an AdmissionReview object")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != "AdmissionReview":
        raise RequestError(
            400,
            f"expected kind AdmissionReview of apiVersion {API_VERSION}, got {str(data.get('kind'))[:50]} "
            f"of {str(data.get('apiVersion'))[:50]}: "
            "set admissionReviewVersions: [v1] in the webhook configuration",
        )
    try:
        return AdmissionReview.model_validate(data).request
    except ValidationError as error:
        details = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors(include_url=False)[:5]
        )
        raise RequestError(400, f"malformed AdmissionReview: {details}") from None
    except RecursionError:
        raise RequestError(400, "malformed AdmissionReview: nested too deeply") from None


class Webhook:
    """The decisions plus everything around them that does I/O (body, namespaces, metrics)."""

    def __init__(
        self,
        *,
        policy: AdmissionPolicy,
        namespaces: ManagedNamespaces,
        metrics: Metrics | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        body_timeout: float = 10.0,
        lookup_timeout: float = 3.0,
        tenant_policy: PolicyFile | None = None,
        device_classes: DeviceClassLookup | None = None,
    ) -> None:
        self.policy = policy
        self.tenant_policy = tenant_policy
        self.namespaces = namespaces
        # Which DeviceClasses the cluster has; None: not checked (the worker still is, at binding).
        self.device_classes = device_classes
        self.metrics = metrics or Metrics()
        self.max_request_bytes = max_request_bytes
        self.body_timeout = body_timeout
        self.lookup_timeout = lookup_timeout

    async def admit(self, request: Request) -> Response:
        endpoint = request.url.path.strip("/")
        started = time.perf_counter()
        try:
            review = parse_review(await read_body(request, self.max_request_bytes, self.body_timeout))
        except RequestError as error:
            self.metrics.rejected_requests.labels(endpoint, str(error.code)).inc()
            log.info("%s: rejected request: %s", endpoint, error.message)
            return status_response(error.code, error.message)
        response = await self.decide(endpoint, review)
        self.metrics.decision(endpoint, review.operation, response.allowed)
        self.metrics.duration.labels(endpoint).observe(time.perf_counter() - started)
        return Response(json.dumps(response.review()), media_type="application/json")

    async def decide(self, endpoint: str, request: AdmissionRequest) -> AdmissionResponse:
        who = request.user_info.username
        what = f"{request.operation} {request.kind.kind} {request.display_name} by {who!r}"
        try:
            async with asyncio.timeout(self.lookup_timeout):
                managed = bool(request.namespace) and await self.namespaces.is_managed(request.namespace)
        except (NamespaceLookupError, TimeoutError) as error:
            log.warning("%s %s: %s", endpoint, what, error or "namespace lookup timed out")
            return AdmissionResponse.deny(
                request.uid,
                f"slurm-bridge: cannot tell whether namespace {request.namespace} is managed "
                f"({error or 'the API server did not answer in time'}); try again",
            )
        try:
            policy = self.policy
            if endpoint == "validate":
                cluster = await self._cluster_classes(request, what)
                policy = dataclasses.replace(policy, cluster_classes=cluster)
            if self.tenant_policy is not None:
                # Re-read when the file changed: a ConfigMap update applies without a restart.
                policy = dataclasses.replace(policy, tenants=self.tenant_policy.current())
            response = DECISIONS[endpoint](request, managed=managed, policy=policy)
        except Exception:
            # A bug, not the user's fault: deny (failing closed, like failurePolicy: Fail) and say so.
            self.metrics.internal_errors.labels(endpoint).inc()
            log.exception("%s %s: internal error", endpoint, what)
            return AdmissionResponse.deny(
                request.uid,
                "slurm-bridge: internal error in the admission webhook (see its log); the request was denied "
                "to be safe, try again or report it",
            )
        if response.allowed:
            log.debug("%s %s: allowed%s", endpoint, what, " with patch" if response.patch else "")
        else:
            log.info("%s %s: denied: %s", endpoint, what, response.status.message if response.status else "")
        return response

    async def _cluster_classes(self, request: AdmissionRequest, what: str) -> ClusterDeviceClasses | None:
        """What the cluster says of the honoured DeviceClasses a CREATE asks for; None if nothing to ask.

        Only on CREATE: a pod's requests are fixed once it exists, and an update is judged by
        the problems it introduces, so a class deleted since must not block its pods' updates.
        A lookup that fails or outlasts `lookup_timeout` is told as such (a denial to try
        again), never as a class that does not exist.
        """
        if self.device_classes is None or request.operation != "CREATE" or request.sub_resource:
            return None
        honoured = self.policy.device_classes
        names = sorted(c for c in dra_classes_named(request.object) if honoured.get(c) is not None)
        if not names:
            return None
        try:
            async with asyncio.timeout(self.lookup_timeout):
                return await self.device_classes.lookup(names)
        except TimeoutError:
            log.warning("validate %s: DeviceClass lookup timed out", what)
            return ClusterDeviceClasses(
                unknown=tuple((n, "the API server did not answer in time") for n in names)
            )

    async def healthz(self, _: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(self, _: Request) -> Response:
        reason = self.namespaces.not_ready_reason()
        return PlainTextResponse(reason, status_code=503) if reason else PlainTextResponse("ok")

    async def metrics_endpoint(self, _: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=self.metrics.content_type)


async def _last_resort(request: Request, error: Exception) -> Response:
    # Only reachable through a bug outside the decision (which has its own
    # guard); still a 4xx with a reason rather than a bare 500.
    log.error("unhandled error for %s %s: %r", request.method, request.url.path, error)
    return status_response(
        400, f"slurm-bridge webhook could not process the request ({type(error).__name__})"
    )


def create_app(webhook: Webhook) -> Starlette:
    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await webhook.namespaces.start()
        if webhook.device_classes is not None:
            await webhook.device_classes.start()
        try:
            yield
        finally:
            if webhook.device_classes is not None:
                await webhook.device_classes.stop()
            await webhook.namespaces.stop()

    routes = [
        Route("/mutate", webhook.admit, methods=["POST"]),
        Route("/validate", webhook.admit, methods=["POST"]),
        Route("/healthz", webhook.healthz, methods=["GET"]),
        Route("/readyz", webhook.readyz, methods=["GET"]),
        Route("/metrics", webhook.metrics_endpoint, methods=["GET"]),
    ]
    handlers: dict[Any, Any] = {Exception: _last_resort}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
