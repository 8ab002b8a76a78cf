"""`slurm-bridge webhook`: the command, and the wiring from settings to a running server.

Registered by worker/cli.py as `app.command("webhook")(webhook)`; `python -m
webhook` runs the same function. Every option falls back to its environment
variable (named in its help), and a bad value ends the process at start with
one line naming the setting.
"""

import asyncio
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from kubernetes.aio import client as kclient
from starlette.applications import Starlette

from bridge.policy import PolicyError
from clients.kube_client import KubeClient, load_configuration
from clients.policy_file import PolicyFile
from webhook.app import Webhook, create_app
from webhook.device_classes import DeviceClassCache
from webhook.namespaces import ManagedNamespaces, NamespaceLabelCache, SelectedNamespaces, StaticNamespaces
from webhook.policy import AdmissionPolicy
from webhook.settings import ConfigurationError, WebhookSettings, load_settings
from webhook.tls import CertificateError, ReloadingCertificate

log = logging.getLogger("webhook")


def uvicorn_config(
    app: Starlette, certificate: ReloadingCertificate, *, host: str, port: int
) -> uvicorn.Config:
    """HTTPS through our own SSLContext, so certificate rotation needs no restart (see webhook.tls)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_context_factory=lambda _config, _default: certificate.server_context,
        lifespan="on",
        log_config=None,  # keep the process's logging setup
        access_log=False,  # one line per admission request is noise; decisions are logged and counted
        server_header=False,
        timeout_keep_alive=30,  # the API server reuses connections; don't drop them between requests
        timeout_graceful_shutdown=10,
    )


async def kube_configuration(settings: WebhookSettings, needed_for: str) -> kclient.Configuration:
    try:
        return await load_configuration(settings.kubeconfig)
    except Exception as error:
        raise ConfigurationError(
            f"invalid setting KUBECONFIG (--kubeconfig): cannot load a Kubernetes configuration "
            f"(needed for {needed_for}): {error}"
        ) from None


async def managed_namespaces(settings: WebhookSettings) -> ManagedNamespaces:
    selector = settings.selector
    if selector is None:
        if not settings.managed_namespaces:
            log.info("no managed namespaces: only pods naming %s are handled", settings.scheduler_name)
        return StaticNamespaces(settings.managed_namespaces)
    if settings.managed_namespaces:
        log.warning("MANAGED_NAMESPACE_SELECTOR is set, so MANAGED_NAMESPACES is ignored")
    configuration = await kube_configuration(settings, "MANAGED_NAMESPACE_SELECTOR")
    return SelectedNamespaces(selector, NamespaceLabelCache(KubeClient(configuration)))


async def device_class_cache(settings: WebhookSettings) -> DeviceClassCache | None:
    """The cluster's DeviceClasses, to refuse pods asking for one that does not exist; None with no
    honoured class (then every DRA request is refused without asking the cluster)."""
    if not settings.device_classes.classes:
        log.info("DRA_DEVICE_CLASSES is empty: pods asking for DRA devices are refused")
        return None
    configuration = await kube_configuration(
        settings, "DRA_DEVICE_CLASSES: the DeviceClasses pods ask for are looked up; empty honours none"
    )
    return DeviceClassCache(KubeClient(configuration))


def load_certificate(settings: WebhookSettings) -> ReloadingCertificate:
    try:
        return ReloadingCertificate(settings.tls_cert_file, settings.tls_key_file)
    except CertificateError as error:
        raise ConfigurationError(
            f"invalid setting WEBHOOK_TLS_CERT_FILE/WEBHOOK_TLS_KEY_FILE: {error}"
        ) from None


async def build_server(settings: WebhookSettings) -> uvicorn.Server:
    """Everything wired, not yet serving.

    Call it inside the event loop that will serve: the Kubernetes client binds to it.
    """
    certificate = load_certificate(settings)
    try:
        tenant_policy = PolicyFile(settings.tenant_policy_file)
    except PolicyError as error:
        raise ConfigurationError(
            f"invalid setting TENANT_POLICY_FILE (--tenant-policy-file): {error}"
        ) from None
    webhook_ = Webhook(
        policy=AdmissionPolicy(
            settings.scheduler_name,
            frozenset(settings.bridge_service_accounts),
            device_classes=settings.device_classes,
        ),
        namespaces=await managed_namespaces(settings),
        max_request_bytes=settings.max_request_bytes,
        tenant_policy=tenant_policy,
        device_classes=await device_class_cache(settings),
    )
    config = uvicorn_config(create_app(webhook_), certificate, host=settings.host, port=settings.port)
    return uvicorn.Server(config)


async def serve(settings: WebhookSettings) -> None:
    server = await build_server(settings)
    log.info("serving admission webhook on https://%s:%d", settings.host, settings.port)
    await server.serve()


def _fail(message: str) -> None:
    typer.echo(f"slurm-bridge: {message}", err=True)
    raise typer.Exit(2)


def webhook(
    tls_cert_file: Annotated[
        Path | None,
        typer.Option(help="serving certificate (PEM), reloaded when it changes [WEBHOOK_TLS_CERT_FILE]"),
    ] = None,
    tls_key_file: Annotated[
        Path | None, typer.Option(help="its private key (PEM) [WEBHOOK_TLS_KEY_FILE]")
    ] = None,
    port: Annotated[int | None, typer.Option(help="HTTPS port, default 9443 [WEBHOOK_PORT]")] = None,
    host: Annotated[
        str | None, typer.Option(help="address to listen on, default 0.0.0.0 [WEBHOOK_HOST]")
    ] = None,
    managed_namespaces: Annotated[
        str | None,
        typer.Option(help="comma-separated namespaces whose pods Slurm places [MANAGED_NAMESPACES]"),
    ] = None,
    managed_namespace_selector: Annotated[
        str | None,
        typer.Option(
            help="label selector of managed namespaces, e.g. slinky.slurm.net/managed=true; "
            "wins over --managed-namespaces [MANAGED_NAMESPACE_SELECTOR]"
        ),
    ] = None,
    scheduler_name: Annotated[
        str | None, typer.Option(help="default slurm-bridge-scheduler [SCHEDULER_NAME]")
    ] = None,
    bridge_service_accounts: Annotated[
        str | None,
        typer.Option(
            help="comma-separated usernames allowed to set the job-id label, node and placement "
            "annotations, default system:serviceaccount:slurm-bridge:slurm-bridge [BRIDGE_SERVICE_ACCOUNTS]"
        ),
    ] = None,
    kubeconfig: Annotated[
        str | None, typer.Option(help="kubeconfig for reading namespaces; in-cluster if unset [KUBECONFIG]")
    ] = None,
    max_request_bytes: Annotated[
        int | None,
        typer.Option(help="largest AdmissionReview accepted, default 8 MiB [WEBHOOK_MAX_REQUEST_BYTES]"),
    ] = None,
    tenant_policy_file: Annotated[
        Path | None,
        typer.Option(
            help="accounts, QOS, partitions... each namespace may ask for, re-read when it changes; "
            "unset: no restrictions [TENANT_POLICY_FILE]"
        ),
    ] = None,
    dra_device_classes: Annotated[
        str | None,
        typer.Option(
            help="DRA DeviceClasses pods may ask for and what each is in Slurm: <class>=cpu or "
            "<class>=<gres>[:<type>], comma-separated; empty: none; as the worker's "
            "[DRA_DEVICE_CLASSES]"
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning")] = "info",
) -> None:
    """Serve the admission webhook: AdmissionReview v1 on /mutate and /validate over HTTPS."""
    try:
        settings = load_settings(
            tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
            port=port,
            host=host,
            managed_namespaces=managed_namespaces,
            managed_namespace_selector=managed_namespace_selector,
            scheduler_name=scheduler_name,
            bridge_service_accounts=bridge_service_accounts,
            kubeconfig=kubeconfig,
            max_request_bytes=max_request_bytes,
            tenant_policy_file=tenant_policy_file,
            dra_device_classes=dra_device_classes,
        )
        load_certificate(settings)  # fail at start, with the one-line message, not inside the server
        if log_level.upper() not in logging.getLevelNamesMapping():
            raise ConfigurationError(
                f"invalid setting --log-level: {log_level!r} is not debug, info or warning"
            )
    except ConfigurationError as error:
        _fail(str(error))
        return
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        asyncio.run(serve(settings))
    except ConfigurationError as error:
        _fail(str(error))
    except KeyboardInterrupt:
        pass
