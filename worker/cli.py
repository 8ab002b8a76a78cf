"""`slurm-bridge`: the command line of every component.

Its size (about 460 lines) is one function per command, each with its flags; the work
behind them is worker/main.py's, worker/operations.py's, worker/doctor/'s and webhook/'s.
"""

import asyncio
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote

import typer
from rich.console import Console
from rich.table import Table

from bridge import keys
from bridge.models import workflow_id_of
from worker import logs
from worker.doctor import DoctorSettings
from worker.setting_flags import with_setting_flags
from worker.settings import (
    ConfigurationError,
    OperatorSettings,
    TemporalSettings,
    WorkerSettings,
    load,
    load_settings,
)

T = TypeVar("T")

app = typer.Typer(
    name="slurm-bridge",
    help="Scheduled by Slurm, run by Kubernetes: place Kubernetes pods with Slurm external jobs.",
    no_args_is_help=True,
    add_completion=False,
)


def run_client(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run an operator command's Temporal work.

    The Temporal client's native runtime can abort the interpreter while it is
    finalizing (PyGILState_Release); a command that has printed its answer has
    nothing left to clean up, so callers leave through `done()`.
    """
    from temporalio.service import RPCError

    try:
        return asyncio.run(coroutine)
    except typer.Exit as stop:
        done(stop.exit_code)
    except RPCError as error:
        typer.echo(f"slurm-bridge: Temporal answered: {error.message}", err=True)
        if "search attribute" in error.message:
            typer.echo("slurm-bridge: has a worker run in this namespace? It registers them.", err=True)
        done(2)


def done(code: int = 0) -> NoReturn:
    """Leave without the interpreter's finalization, its output and logs flushed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail(message: str) -> NoReturn:
    """One clear line on stderr and a non-zero exit: how every user error ends."""
    typer.echo(f"slurm-bridge: {message}", err=True)
    raise typer.Exit(2)


@app.command()
@with_setting_flags(WorkerSettings)
def worker(
    overrides: dict[str, Any],
    log_level: Annotated[str, typer.Option(help="debug, info, warning")] = "info",
    log_format: Annotated[str, typer.Option(help="text, or json: one object per line [LOG_FORMAT]")] = "",
) -> None:
    """Run the Temporal worker with the pod, Slurm job and node watchers.

    Every setting is an environment variable (named in each flag's help) and a flag; a flag wins.
    """
    try:
        settings = load_settings(**overrides)
    except ConfigurationError as error:
        fail(str(error))
    fmt = log_format or os.environ.get("LOG_FORMAT", "text")
    if fmt not in ("text", "json"):
        fail(f"invalid setting LOG_FORMAT (--log-format): {fmt!r} is not text or json")
    logs.configure(log_level, fmt)
    from worker.main import run_worker

    try:
        asyncio.run(_until_stopped(run_worker(settings)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    except (OSError, RuntimeError) as error:
        fail(f"worker stopped: {error}")
    # Stopped cleanly: its tasks drained, its Lease given back, its clients closed. Leaving
    # through the interpreter's finalization can still abort it (SIGABRT, PyGILState_Release)
    # when a thread of the Temporal client's native runtime wakes late, and a pod restarted
    # for a crash it did not have is noise: leave as operator commands do.
    done()


async def _until_stopped(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` until it ends or SIGTERM comes. Kubernetes stops a container with SIGTERM, whose
    default action ends the process on the spot; here it cancels `main` as asyncio does on the
    first SIGINT, so the worker drains its tasks, gives back its Lease and closes its clients."""
    task = asyncio.ensure_future(main)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await task


@app.command()
def explain(
    source: Annotated[
        str, typer.Argument(help="a file of Kubernetes objects (YAML or JSON; - for stdin), or namespace/pod")
    ],
    partition: Annotated[str | None, typer.Option(help="default partition [SLURM_PARTITION]")] = None,
    mcs_label: Annotated[str | None, typer.Option(help="[MCS_LABEL]")] = None,
    kubeconfig: Annotated[str | None, typer.Option(help="for namespace/pod: [KUBECONFIG]")] = None,
    namespace: Annotated[str, typer.Option(help="namespace of objects that name none")] = "default",
    installation: Annotated[str | None, typer.Option(help="[INSTALLATION_ID]")] = None,
    tenant_policy_file: Annotated[str | None, typer.Option(help="[TENANT_POLICY_FILE]")] = None,
    dra_device_classes: Annotated[
        str | None, typer.Option(help="honoured DRA DeviceClasses, as the worker's [DRA_DEVICE_CLASSES]")
    ] = None,
) -> None:
    """Print the Slurm job_desc_msg (REST v0.0.44) each group of pods would be submitted as.

    For namespace/pod, the bridge's nodes are read from Kubernetes and the nodes the pods'
    node rules exclude become `excluded_nodes`, as the worker submits them; for a file, its
    Node objects stand for the nodes.
    """
    from bridge.device_classes import DeviceClassesError, parse_device_classes
    from bridge.policy import PolicyError
    from bridge.translate import Defaults
    from clients.policy_file import load_policy
    from worker.explain import ExplainError, load_objects
    from worker.explain import explain as explain_objects

    classes_text = (
        dra_device_classes if dra_device_classes is not None else os.environ.get("DRA_DEVICE_CLASSES")
    )
    try:
        classes = Defaults.device_classes if classes_text is None else parse_device_classes(classes_text)
    except DeviceClassesError as error:
        fail(f"invalid setting DRA_DEVICE_CLASSES (--dra-device-classes): {error}")
    defaults = Defaults(
        partition=partition or os.environ.get("SLURM_PARTITION") or Defaults.partition,
        mcs_label=mcs_label if mcs_label is not None else os.environ.get("MCS_LABEL", Defaults.mcs_label),
        device_classes=classes,
    )
    installation = installation or os.environ.get("INSTALLATION_ID") or keys.DEFAULT_INSTALLATION
    scheduler_name = os.environ.get("SCHEDULER_NAME") or keys.DEFAULT_SCHEDULER_NAME
    policy_path = tenant_policy_file or os.environ.get("TENANT_POLICY_FILE")
    try:
        policy = load_policy(Path(policy_path)) if policy_path else None
    except (PolicyError, OSError) as error:
        fail(f"tenant policy {policy_path}: {error}")
    path = Path(source)
    if source == "-" or path.exists():
        text = sys.stdin.read() if source == "-" else path.read_text()
        try:
            explanations = asyncio.run(
                explain_objects(
                    load_objects(text, source), defaults, namespace, installation, policy, scheduler_name
                )
            )
        except ExplainError as error:
            fail(str(error))
    elif "/" in source and not source.endswith((".yaml", ".yml", ".json")):
        explanations = [_explain_live(source, kubeconfig, defaults, installation, policy, scheduler_name)]
    else:
        fail(f"{source}: no such file (give a file, -, or namespace/pod)")
    typer.echo(json.dumps([dataclasses.asdict(e) for e in explanations], indent=2))


def _explain_live(
    reference: str, kubeconfig: str | None, defaults: Any, installation: str, policy: Any, scheduler_name: str
) -> Any:
    from activities.kube_reader import KubeReader
    from activities.node_source import list_bridge_nodes
    from bridge.grouping import GroupError
    from bridge.translate import TranslationError
    from clients.kube_client import KubeClient, KubeError, KubeNotFound, api_path, load_configuration
    from worker.explain import explain_live

    namespace, name = _split_pod(reference)

    async def run() -> Any:
        kube = KubeClient(await load_configuration(kubeconfig or os.environ.get("KUBECONFIG")))
        try:
            pod = await kube.request("GET", api_path("pods", namespace=namespace, name=name))
            return await explain_live(
                KubeReader(kube),
                pod,
                defaults,
                installation,
                nodes=await list_bridge_nodes(kube, scheduler_name),
                policy=policy,
            )
        except KubeNotFound:
            fail(f"pod {reference} does not exist")
        except (KubeError, GroupError, TranslationError) as error:
            fail(f"pod {reference}: {error}")
        finally:
            await kube.close()

    return asyncio.run(run())


AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output")]


async def _leadership(settings: OperatorSettings) -> Any:
    """Who leads and how its watchers fare, from the Lease (worker/watcher_health.py); best effort."""
    from clients.kube_client import KubeClient, load_configuration
    from worker.watcher_health import Leadership, read_leadership

    try:
        kube = KubeClient(await load_configuration(settings.kubeconfig))
    except Exception as error:  # no kubeconfig, no service account
        ref = f"{settings.lease_namespace}/{settings.lease_name}"
        return Leadership(lease=ref, error=f"no Kubernetes: {error}")
    try:
        return await read_leadership(kube, settings.lease_namespace, settings.lease_name)
    finally:
        await kube.close()


def _print_leadership(leadership: Any, *, err: bool = False) -> None:
    for line in leadership.describe():
        typer.echo(line, err=err)


def _operator_settings(overrides: dict[str, Any]) -> OperatorSettings:
    try:
        return load(OperatorSettings, **overrides)
    except ConfigurationError as error:
        fail(str(error))


async def _claim_of(kubeconfig: str | None, namespace: str, name: str) -> str | None:
    """The placement id on the pod, when the cluster can be read; None otherwise (best effort)."""
    from bridge.pod_events import claim_of
    from clients.kube_client import KubeClient, KubeError, api_path, load_configuration

    try:
        kube = KubeClient(await load_configuration(kubeconfig))
    except Exception:  # no kubeconfig, no service account: find it by pod name instead
        return None
    try:
        return claim_of(await kube.request("GET", api_path("pods", namespace=namespace, name=name)))
    except (KubeError, OSError):
        return None
    finally:
        await kube.close()


def _split_pod(reference: str) -> tuple[str, str]:
    namespace, _, name = reference.partition("/")
    if not namespace or not name:
        fail(f"{reference!r}: give the pod as namespace/name")
    return namespace, name


async def _connect(settings: TemporalSettings) -> Any:
    from worker.temporal_connection import connect_temporal

    try:
        return await connect_temporal(settings)
    except RuntimeError as error:
        fail(f"cannot reach Temporal at {settings.temporal_address}: {error}")


@app.command()
@with_setting_flags(OperatorSettings)
def status(
    overrides: dict[str, Any],
    pod: Annotated[str, typer.Argument(help="namespace/name")],
    as_json: AsJson = False,
) -> None:
    """Where a pod's placement is: phase, Slurm job and state, pending reason, node, workflow link.

    Any pod of a group finds the group's placement: the pod's claim annotation names it
    (read from Kubernetes when it can be); otherwise the placement started by that pod.
    Also the leader replica and its watchers' health, from the workers' Lease.
    """
    from worker.operations import find_placements, placement_state, placements_query

    settings = _operator_settings(overrides)
    namespace, name = _split_pod(pod)

    async def run() -> dict[str, Any]:
        client = await _connect(settings)
        query = placements_query(namespace=namespace, name=name)
        claim = await _claim_of(settings.kubeconfig, namespace, name)
        if claim is not None:
            query = f"WorkflowId = '{workflow_id_of(claim)}'"
        found = await find_placements(client, query, limit=1)
        if not found:
            fail(f"no placement found for pod {pod} (is its schedulerName the bridge's?)")
        state = await placement_state(client, found[0])
        link = f"{settings.temporal_ui_url}/namespaces/{settings.temporal_namespace}/workflows/" + quote(
            found[0].workflow_id, safe=""
        )
        leadership = await _leadership(settings)
        return {
            "pod": pod,
            "workflow_status": found[0].status,
            **state.model_dump(mode="json"),
            "link": link,
            "leadership": leadership.model_dump(mode="json"),
        }

    report = run_client(run())
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        done()
    from worker.watcher_health import Leadership

    leadership = Leadership.model_validate(report["leadership"])
    console = Console()
    table = Table(show_header=False, box=None)
    for label, key in (
        ("pod", "pod"),
        ("phase", "phase"),
        ("workflow", "workflow_status"),
        ("Slurm job", "job_id"),
        ("job components", "job_components"),
        ("job state", "job_state"),
        ("pending reason", "pending_reason"),
        ("waiting for Slurm", "slurm_unavailable"),
        ("Slurm nodes", "nodes"),
        ("Kubernetes nodes", "kube_nodes"),
        ("job ended", "end_reason"),
        ("failure", "failure"),
        ("link", "link"),
    ):
        value = report.get(key)
        if value not in (None, "", []):
            shown = ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
            table.add_row(f"[bold]{label}[/]", shown)
    console.print(table)
    _print_leadership(leadership)
    done()


@app.command("list")
@with_setting_flags(OperatorSettings)
def list_placements(
    overrides: dict[str, Any],
    phase: Annotated[
        str | None,
        typer.Option(help="Translating, Submitted, Pending, Running, Bound, Done, Failed, WaitingForSlurm"),
    ] = None,
    namespace: Annotated[str | None, typer.Option(help="only pods in this namespace")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 100,
    as_json: AsJson = False,
) -> None:
    """Placements, newest first: `slurm-bridge list --phase Failed` shows what needs attention.

    Below them, the leader replica and its watchers' health (the workers' Lease); with
    --json they go to stderr, so stdout stays the list of placements.
    """
    from worker.operations import find_placements, placements_query

    settings = _operator_settings(overrides)

    async def run() -> tuple[list[Any], Any]:
        client = await _connect(settings)
        found = await find_placements(client, placements_query(namespace=namespace, phase=phase), limit=limit)
        return found, await _leadership(settings)

    found, leadership = run_client(run())
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(p) for p in found], indent=2))
        _print_leadership(leadership, err=True)
        done()
    table = Table("pod", "phase", "workflow", "Slurm job", "nodes", "started")
    for p in found:
        table.add_row(p.pod, p.phase, p.status, str(p.job_id or ""), ", ".join(p.nodes), p.started)
    Console().print(table)
    _print_leadership(leadership)
    done()


@app.command()
@with_setting_flags(OperatorSettings)
def retry(overrides: dict[str, Any], pod: Annotated[str, typer.Argument(help="namespace/name")]) -> None:
    """Place a pod again after its placement failed (for example once its annotations are fixed)."""
    from activities.kube_reader import KubeReader
    from bridge import grouping
    from clients.kube_client import KubeClient, KubeError, KubeNotFound, api_path, load_configuration
    from worker.operations import RetryRefused, retry_placement

    settings = _operator_settings(overrides)
    namespace, name = _split_pod(pod)

    async def run() -> str:
        kube = KubeClient(await load_configuration(settings.kubeconfig))
        try:
            body = await kube.request("GET", api_path("pods", namespace=namespace, name=name))
            group = await grouping.resolve(KubeReader(kube), body)
            # A group is retried whole: every pod its failed placement claimed.
            selector = group.member_selector
            members = await KubeReader(kube).list_pods(namespace, selector) if selector else [body]
        except KubeNotFound:
            fail(f"pod {pod} does not exist")
        except (KubeError, grouping.GroupError) as error:
            fail(f"cannot resolve pod {pod}: {error}")
        finally:
            await kube.close()
        client = await _connect(settings)
        try:
            return await retry_placement(client, body, settings.temporal_task_queue, group, members=members)
        except RetryRefused as refused:
            fail(str(refused))

    run_id = run_client(run())
    typer.echo(f"placement of {pod} started again (run {run_id}); follow it with: slurm-bridge status {pod}")
    done()


@app.command()
@with_setting_flags(DoctorSettings)
def doctor(overrides: dict[str, Any], as_json: AsJson = False) -> None:
    """Check that this worker can reach and use Kubernetes, Slurm and Temporal; exit 1 if anything fails.

    It reads the worker's settings (environment variables, and the same flags as `worker`).
    """
    from worker.doctor import Check, as_json_report, as_text, diagnose, failed

    try:
        settings = load(DoctorSettings, **overrides)
        checks = asyncio.run(diagnose(settings))
    except ConfigurationError as error:
        checks = [Check("configuration", "settings", "fail", str(error), "fix the setting it names")]
    typer.echo(as_json_report(checks) if as_json else as_text(checks))
    done(1 if failed(checks) else 0)


def _register_webhook() -> None:
    # The webhook's options live with the webhook (webhook/command.py).
    from webhook.command import webhook

    app.command("webhook")(webhook)


_register_webhook()


if __name__ == "__main__":
    app()
