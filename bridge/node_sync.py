"""Node sync's decisions: Kubernetes nodes + Slurm nodes → the actions that bring them in line.

Pure: no I/O, no clock, sorted iteration, so one snapshot always gives one plan.
A plan is only ever made from a complete snapshot: a failed read raises before
this module is reached, so no taint is removed, no node undrained or deleted on
missing data. A run applies at most `max_actions` of the plan, most urgent first
(`most_urgent`); the rest wait for the next run.

The rules, per Kubernetes node (Slurm name: label `slinky.slurm.net/slurm-nodename`,
else the node's own name):

- managed (a Slurm node of that name exists): taint `slinky.slurm.net/managed-node=
  <scheduler>:NoExecute`; cordoned or not Ready → drain `slurm-bridge: <why>`;
  schedulable and Ready → undrain, only a drain of ours (our prefix, or no reason).
- not managed: our taint is removed. Nothing is asked of Slurm for it.
- labelled `scheduler.slinky.slurm.net/external-node` (or upstream docs'
  `scheduler.slinky.slurm.net/slurm-bridge-external-node`): registered as an external
  Slurm node (once schedulable and Ready), marked ours in the node's comment.
  Partitions (= features), CPUs/memory and the GPU count can only change by
  re-registering (slurmctld puts a node into NodeSet partitions only when it is
  created, and with gres.conf it refuses a new GPU count on an existing node: 422,
  error 2072): delete and create once no job runs there (a busy node is drained
  meanwhile, so no new job takes GPUs that may be going away).
  Topology and address are updated in place.
- an external Slurm node marked ours whose Kubernetes node lost the label (or is
  gone): drain, wait until no job runs, delete. Nothing else is ever deleted.
- slurmd nodes are never registered over, drained for removal or deleted: a
  Kubernetes node labelled `slinky.slurm.net/slurm-nodename` (slurm-operator's mark
  of a node running slurmd) is only tainted and drain-mirrored, as a managed node,
  whatever other label it carries; so is a labelled node whose Slurm node is not
  external (slurmd registered it).
"""

from dataclasses import dataclass
from typing import Any

from bridge import keys
from bridge.node_actions import (
    DEFAULT_INSTALLATION,
    NAME_CONFLICT,
    NOT_EXTERNAL,
    REGISTRATION_DEFERRED,
    REREGISTRATION_BLOCKED,
    SLURMD_NODE,
    TAINT_CONFLICT,
    AddTaint,
    CreateSlurmNode,
    DeleteSlurmNode,
    DrainSlurmNode,
    Json,
    NodeAction,
    NodeSnapshot,
    Registration,
    RemoveTaint,
    ReportEvent,
    UndrainSlurmNode,
    UpdateSlurmNode,
)
from bridge.node_facts import (
    NO_EXECUTE,
    desired_registration,
    drain_is_ours,
    drain_wanted,
    gpu_count,
    is_busy,
    is_drained,
    is_external,
    kube_name,
    registered_by_us,
    registration_label,
    runs_slurmd,
    slurm_name,
)


@dataclass(frozen=True)
class _Context:
    scheduler_name: str
    default_partition: str
    partitions: frozenset[str]
    installation: str


# -- the plan -----------------------------------------------------------------


def plan(
    snapshot: NodeSnapshot,
    *,
    scheduler_name: str,
    default_partition: str,
    installation: str = DEFAULT_INSTALLATION,
) -> list[NodeAction]:
    """Every action this snapshot calls for, grouped per node, in a deterministic order."""
    ctx = _Context(scheduler_name, default_partition, frozenset(snapshot.partitions), installation)
    slurm = {str(n["name"]): n for n in snapshot.slurm_nodes if n.get("name")}
    claimants: dict[str, list[Json]] = {}
    for kube in sorted(snapshot.kube_nodes, key=kube_name):
        claimants.setdefault(slurm_name(kube), []).append(kube)
    actions: list[NodeAction] = []
    for name in sorted(claimants):
        kubes = claimants[name]
        if len(kubes) > 1:
            actions += _name_conflict(name, kubes)
        else:
            actions += _plan_node(ctx, _Node(kubes[0], name), slurm.get(name))
    for name in sorted(slurm.keys() - claimants.keys()):
        node = slurm[name]
        if registered_by_us(node, scheduler_name, installation):
            actions += _removal(ctx, None, node, "its Kubernetes node is gone")
    return actions


# -- one run's share -------------------------------------------------------------

# Most urgent first: what keeps Slurm jobs and pods off a node that should not take them, then
# capacity coming back, then registrations, then removals and reports (those are also the ones
# planned again and again while they wait: a delete for a job to end, a conflict to be fixed).
URGENCY: tuple[type[NodeAction], ...] = (
    DrainSlurmNode,
    AddTaint,
    UndrainSlurmNode,
    RemoveTaint,
    UpdateSlurmNode,
    CreateSlurmNode,
    DeleteSlurmNode,
    ReportEvent,
)


def by_subject(actions: list[NodeAction]) -> list[list[NodeAction]]:
    """The actions per node, in plan order: one node's actions depend on each other."""
    groups: dict[str, list[NodeAction]] = {}
    for action in actions:
        groups.setdefault(action.subject, []).append(action)
    return list(groups.values())


def most_urgent(actions: list[NodeAction], limit: int) -> tuple[list[NodeAction], int]:
    """Whole nodes' actions, the most urgent node first, while they fit in `limit` (at least
    one node's); and how many actions are left for the next run."""
    groups = sorted(by_subject(actions), key=lambda group: min(URGENCY.index(type(a)) for a in group))
    chosen: list[NodeAction] = []
    for group in groups:
        if chosen and len(chosen) + len(group) > limit:
            break
        chosen += group
    return chosen, len(actions) - len(chosen)


# -- the rules ------------------------------------------------------------------


@dataclass(frozen=True)
class _Node:
    """One Kubernetes node and the Slurm name it maps to; builds the actions about it."""

    kube: Json
    slurm_name: str

    @property
    def ids(self) -> dict[str, Any]:
        meta = self.kube["metadata"]
        return {"slurm_node": self.slurm_name, "kube_node": meta["name"], "kube_uid": meta.get("uid") or None}

    def event(self, reason: str, message: str, *, warning: bool = True) -> ReportEvent:
        return ReportEvent(**self.ids, reason=reason, message=message, warning=warning)


def _name_conflict(name: str, kubes: list[Json]) -> list[NodeAction]:
    names = ", ".join(kube_name(k) for k in kubes)
    message = (
        f"Kubernetes nodes {names} all map to Slurm node {name} (label {keys.LABEL_SLURM_NODE_NAME}, "
        "else the node name); the bridge leaves that Slurm node and their taints alone until only one does"
    )
    return [_Node(k, name).event(NAME_CONFLICT, message) for k in kubes]


def _plan_node(ctx: _Context, node: _Node, slurm: Json | None) -> list[NodeAction]:
    if runs_slurmd(node.kube):
        return _slurmd(ctx, node, slurm)
    if registration_label(node.kube) is not None:
        return _external(ctx, node, slurm)
    if slurm is None:
        return _taint(ctx, node, want=False)
    if registered_by_us(slurm, ctx.scheduler_name, ctx.installation):
        why = f"label {keys.LABEL_EXTERNAL_NODE} removed from Kubernetes node {kube_name(node.kube)}"
        return _removal(ctx, node, slurm, why)
    return _managed(ctx, node, slurm)


def _slurmd(ctx: _Context, node: _Node, slurm: Json | None) -> list[NodeAction]:
    """A node slurmd runs on (slurm-operator's label): managed like any mapped node, nothing more.

    Never registered (slurmd registers it; a dynamic slurmd may not have yet), never
    drained for removal nor deleted, even if an external node of ours carries its name.
    """
    label = registration_label(node.kube)
    events: list[NodeAction] = []
    if label is not None:
        message = (
            f"Kubernetes node {kube_name(node.kube)} carries {keys.LABEL_SLURM_NODE_NAME}="
            f"{node.slurm_name}, the mark of a node running slurmd: label {label} is ignored, the bridge "
            "never registers it as an external Slurm node; it only taints it and mirrors drains"
        )
        events.append(node.event(SLURMD_NODE, message))
    if slurm is None:
        return events + _taint(ctx, node, want=False)
    return events + _managed(ctx, node, slurm)


def _managed(ctx: _Context, node: _Node, slurm: Json) -> list[NodeAction]:
    return _taint(ctx, node, want=True) + _mirror_drain(node, slurm)


def _taint(ctx: _Context, node: _Node, *, want: bool) -> list[NodeAction]:
    taints = (node.kube.get("spec") or {}).get("taints") or []
    ours = [
        t
        for t in taints
        if t.get("key") == keys.TAINT_MANAGED_NODE
        and t.get("value") == ctx.scheduler_name
        and t.get("effect") == NO_EXECUTE
    ]
    if not want:
        return [RemoveTaint(**node.ids)] if ours else []
    if ours:
        return []
    other = next(
        (t for t in taints if t.get("key") == keys.TAINT_MANAGED_NODE and t.get("effect") == NO_EXECUTE), None
    )
    if other is not None:
        message = (
            f"taint {keys.TAINT_MANAGED_NODE}={other.get('value')}:{NO_EXECUTE} names another scheduler; "
            f"not adding {keys.TAINT_MANAGED_NODE}={ctx.scheduler_name}:{NO_EXECUTE}"
        )
        return [node.event(TAINT_CONFLICT, message)]
    return [AddTaint(**node.ids)]


def _mirror_drain(node: _Node, slurm: Json) -> list[NodeAction]:
    why = drain_wanted(node.kube)
    if why is not None:
        reason = keys.DRAIN_REASON_PREFIX + why
        if not is_drained(slurm):
            return [DrainSlurmNode(**node.ids, reason=reason)]
        if drain_is_ours(slurm.get("reason")) and slurm.get("reason") != reason:
            return [DrainSlurmNode(**node.ids, reason=reason)]  # keeps the reason telling the truth
        return []
    if is_drained(slurm) and drain_is_ours(slurm.get("reason")):
        return [UndrainSlurmNode(**node.ids)]
    return []


def _removal(ctx: _Context, node: _Node | None, slurm: Json, why: str) -> list[NodeAction]:
    """Unregister an external node of ours: drain, wait until no job runs there, delete.

    An idle node is drained and deleted in the same run: the delete re-checks Slurm
    after the drain, and slurmctld itself refuses to delete a node a job holds.
    """
    name = str(slurm["name"])
    ids = node.ids if node is not None else {"slurm_node": name}
    reason = f"{keys.DRAIN_REASON_PREFIX}removing external node {name}: {why}"
    drain = [] if is_drained(slurm) else [DrainSlurmNode(**ids, reason=reason)]
    if is_busy(slurm):
        keep_taint = _taint(ctx, node, want=True) if node is not None else []
        return [*keep_taint, *drain]  # jobs still run there: wait for them
    untaint = _taint(ctx, node, want=False) if node is not None else []
    return [*drain, DeleteSlurmNode(**ids, why=why), *untaint]


def _external(ctx: _Context, node: _Node, slurm: Json | None) -> list[NodeAction]:
    registration, problems = desired_registration(
        node.kube,
        node.slurm_name,
        scheduler_name=ctx.scheduler_name,
        default_partition=ctx.default_partition,
        partitions=ctx.partitions,
        installation=ctx.installation,
    )
    events: list[NodeAction] = [node.event(reason, message) for reason, message in problems]
    if slurm is None:
        if registration is None:
            return events + _taint(ctx, node, want=False)
        why = drain_wanted(node.kube)
        if why is not None:
            # Created now, the node could take a job before our drain reached it.
            message = (
                f"Slurm node {node.slurm_name} is registered once the node is schedulable and Ready ({why})"
            )
            deferred = node.event(REGISTRATION_DEFERRED, message, warning=False)
            return [deferred, *_taint(ctx, node, want=False)]
        return [CreateSlurmNode(**node.ids, registration=registration), *_taint(ctx, node, want=True)]
    if not is_external(slurm):
        message = (
            f"Slurm node {node.slurm_name} is a regular (slurmd) node, not an external one: the bridge does "
            "not register or remove it, it only mirrors drains and taints"
        )
        return [node.event(NOT_EXTERNAL, message), *_managed(ctx, node, slurm)]
    if registration is None:
        return events + _managed(ctx, node, slurm)  # keeps its current registration; the events say why
    actions: list[NodeAction] = []
    if slurm.get("comment") != registration.comment:
        # Adopt (or re-label) it first: deleting it later needs the proof it is ours.
        actions.append(UpdateSlurmNode(**node.ids, comment=registration.comment))
    changes = _reshape(registration, slurm)
    if changes:
        return actions + _reregister(ctx, node, slurm, registration, changes)
    update = _in_place(registration, slurm)
    if update:
        actions.append(UpdateSlurmNode(**node.ids, **update))
    return actions + _managed(ctx, node, slurm)


def _reshape(registration: Registration, slurm: Json) -> str:
    """Differences only a new registration can apply, described; "" when there are none."""
    changes = []
    if slurm.get("cpus") != registration.cpus:
        changes.append(f"CPUs {slurm.get('cpus')} → {registration.cpus}")
    if slurm.get("real_memory") != registration.real_memory:
        changes.append(f"memory {slurm.get('real_memory')} → {registration.real_memory} MiB")
    current = sorted(slurm.get("features") or [])
    if current != sorted(registration.features):
        changes.append(
            f"partitions {','.join(current) or '(none)'} → {','.join(sorted(registration.features))}"
        )
    gpus = gpu_count(slurm.get("gres"))
    if gpus != registration.gpus:
        changes.append(f"GPUs {gpus} → {registration.gpus}")
    return ", ".join(changes)


def _in_place(registration: Registration, slurm: Json) -> dict[str, str]:
    update = {}
    if (slurm.get("topology") or "") != registration.topology:
        update["topology"] = registration.topology
    if slurm.get("address") != registration.address:
        update["address"] = registration.address
    return update


def _reregister(
    ctx: _Context, node: _Node, slurm: Json, registration: Registration, changes: str
) -> list[NodeAction]:
    """Delete and create again, the only way to apply `changes`, once no job runs there."""
    keep_taint = _taint(ctx, node, want=True)
    if is_drained(slurm) and not drain_is_ours(slurm.get("reason")):
        # A new node would not carry the administrator's drain: wait until they lift it.
        message = (
            f"Slurm node {node.slurm_name} must be registered again ({changes}); that waits until the "
            f"drain an administrator set ({slurm.get('reason')!r}) is lifted"
        )
        return [*keep_taint, node.event(REREGISTRATION_BLOCKED, message, warning=False)]
    if drain_wanted(node.kube) is not None:
        # Registered again once schedulable and Ready (as a new node would be); drained meanwhile.
        return [*keep_taint, *_mirror_drain(node, slurm)]
    if is_busy(slurm):
        reason = f"{keys.DRAIN_REASON_PREFIX}re-registering external node {node.slurm_name}: {changes}"
        drain = [DrainSlurmNode(**node.ids, reason=reason)] if slurm.get("reason") != reason else []
        return [*keep_taint, *drain]
    # Idle: no drain needed first, slurmctld refuses the delete if a job took the node meanwhile.
    return [
        DeleteSlurmNode(**node.ids, why=f"re-registering: {changes}"),
        CreateSlurmNode(**node.ids, registration=registration),
        *keep_taint,
    ]
