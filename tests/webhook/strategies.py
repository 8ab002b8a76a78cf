"""Hypothesis strategies: pods, annotation sets and workloads, valid and broken in every way that matters.

Written as composites over integers and sampled_from: generating ten thousand
nested objects is most of the property tests' run time, and these draws are
several times cheaper than dictionaries/flatmap/text (a little free text is
still mixed in where user input is free text).
"""

from typing import Any

from hypothesis import strategies as st

from tests.webhook.reviews import (
    BRIDGE_USER,
    DRA,
    JOB,
    JOBID,
    JOBSET,
    LWS,
    MANAGED_NS,
    NODE,
    OTHER_NS,
    PODGROUP,
    SCHEDULER,
    Json,
    P,
)

GOOD_QUANTITIES = ["1", "2", "16", "500m", "0.5", "1.5", "4Gi", "512Mi", "1e3", "2k", "0", "100M", "3"]
BAD_QUANTITIES = ["abc", "-", "1.2.3", "", "1Qi", "\u0663", "9" * 200, "--1", "1e99", "0x10", " ", "-1"]
COUNTS = [
    "1",
    "2",
    "4",
    " 3 ",
    "",
    "two",
    "1.5",
    "0",
    "\u0663",
    "+1",
    "9" * 30,
    "-1",
    "2147483647",
    "2147483648",
]
TIME_LIMITS = [
    "30",
    "2h",
    "90s",
    "1.5h",
    "-5",
    "1:30",
    "0:30",
    "0",
    "1-0",
    "2-12:00",
    "1:00:00",
    "UNLIMITED",
    "infinite",
    "soon",
    "1h",
    "",
]
TEXTS = ["prod", "debug", "gpu,ssd", "", "  ", "a" * 300, "team-a", "x", "normal", "hpc", "b1"]
RESOURCE_NAMES = [
    "cpu",
    "cpu",
    "memory",
    "memory",
    "nvidia.com/gpu",
    "amd.com/gpu",
    "ephemeral-storage",
    "hugepages-2Mi",
    "example.com/widget",
    DRA + "dra.cpu",
    DRA + "gpu.nvidia.com",
    DRA + "gpu.example.com",
    DRA + "fpga.example.com",
]


def _one_in(draw: st.DrawFn, n: int) -> bool:
    # A middle value, not 0: hypothesis favours 0 (and the bounds), which would
    # make every "rare" feature common; and shrinking towards 0 then removes it.
    return draw(st.integers(0, n - 1)) == n // 2


# Sentinels in a sampled list: one draw picks the common cases, a second one
# only for the rare integer or free text.
_INT, _TEXT = object(), object()


def _pick(choices: list[Any], integers: tuple[int, int] | None = None, text: bool = False) -> Any:
    pool: list[Any] = [*choices, *([_INT] if integers else []), *([_TEXT] if text else [])]

    @st.composite
    def pick(draw: st.DrawFn) -> str:
        value = draw(st.sampled_from(pool))
        if value is _INT and integers:
            return str(draw(st.integers(*integers)))
        if value is _TEXT:
            return draw(st.text(max_size=4))
        return str(value)

    return pick()


# Mostly valid values: a pod is refused for its first problem, and the
# interesting property (allowed ⇒ translatable) needs many allowed pods.
quantities = _pick(GOOD_QUANTITIES * 5 + BAD_QUANTITIES, (-3, 10**6), text=True)
counts = _pick(COUNTS + COUNTS[:4] * 4, (-2, 2**31 + 2))
time_limits = _pick(TIME_LIMITS + TIME_LIMITS[:3] * 3, (-1, 10**6))
texts = _pick(TEXTS + TEXTS[:2] * 4, text=True)

VALUES: dict[str, Any] = {
    "account": texts,
    "constraints": texts,
    "cpu-per-task": quantities,
    "exclusive": st.sampled_from(["true", "false", "TRUE", " False ", "yes", "", "1", "no"]),
    "gres": st.sampled_from(["gres/gpu=2", "gpu:1", "", "x"]),
    "group-id": counts,
    "job-name": texts,
    "licenses": texts,
    "max-nodes": counts,
    "mem-per-node": quantities,
    "min-nodes": counts,
    "partition": texts,
    "priority": counts,
    "qos": texts,
    "reservation": texts,
    "timelimit": time_limits,
    "user-id": counts,
    "wckey": texts,
    # Typos and unknown keys: ignored as upstream ignores them, and warned about.
    "timelimt": time_limits,
    "cpus-per-task": quantities,
    "nodes": counts,
}
SUFFIXES = sorted(VALUES)
KNOWN_SUFFIXES = [s for s in SUFFIXES if s not in ("timelimt", "cpus-per-task", "nodes")] * 5 + [
    "timelimt",
    "cpus-per-task",
    "nodes",
]
OTHER_KEYS = ["example.com/owner", "note", P.rstrip("/")]


@st.composite
def annotation_sets(draw: st.DrawFn) -> dict[str, str]:
    """Up to five annotations, mostly `slurmjob.slinky.slurm.net/*` ones with values for their type."""
    annotations: dict[str, str] = {}
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3, 5]))):
        if _one_in(draw, 5):
            annotations[draw(st.sampled_from(OTHER_KEYS))] = draw(texts)
        else:
            suffix = draw(st.sampled_from(KNOWN_SUFFIXES))  # typos: 1 in 5 of these
            annotations[P + suffix] = draw(VALUES[suffix])
    return annotations


@st.composite
def resource_lists(draw: st.DrawFn) -> dict[str, str]:
    return {draw(st.sampled_from(RESOURCE_NAMES)): draw(quantities) for _ in range(draw(st.integers(0, 3)))}


@st.composite
def resources(draw: st.DrawFn) -> Json:
    found: Json = {}
    for which in ("requests", "limits"):
        if _one_in(draw, 2):
            found[which] = draw(resource_lists())
    return found


@st.composite
def containers(draw: st.DrawFn, names: tuple[str, ...] = ("main", "side"), sidecars: bool = False) -> Json:
    container: Json = {"name": draw(st.sampled_from(names)), "image": "busybox"}
    if not _one_in(draw, 4):
        container["resources"] = draw(resources())
    if sidecars and _one_in(draw, 2):
        container["restartPolicy"] = "Always"
    return container


TOLERATIONS: list[Json] = [
    {"key": "slinky.slurm.net/managed-node", "operator": "Equal", "value": SCHEDULER, "effect": "NoExecute"},
    {"key": "slinky.slurm.net/managed-node", "operator": "Exists"},
    {"key": "slinky.slurm.net/managed-node", "operator": "Equal", "value": "other", "effect": "NoExecute"},
    {"key": "slinky.slurm.net/managed-node", "operator": "Exists", "tolerationSeconds": 5},
    {"operator": "Exists"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
]
OWNERS: list[list[Json]] = [
    [{"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "1", "controller": True}],
    [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "2", "controller": True}],
    [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "3", "controller": True}],
    [{"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "4"}],
]
SCHEDULERS = [None, "", "default-scheduler", SCHEDULER, SCHEDULER, "volcano"]
namespaces = st.sampled_from([MANAGED_NS, OTHER_NS])
users = st.sampled_from(["alice", "system:serviceaccount:hpc:runner", BRIDGE_USER])


@st.composite
def pod_specs(draw: st.DrawFn) -> Json:
    how_many = draw(st.sampled_from([1, 1, 1, 2, 3]))
    spec: Json = {"containers": [draw(containers()) for _ in range(how_many)]}
    scheduler = draw(st.sampled_from(SCHEDULERS))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if _one_in(draw, 4):
        spec["initContainers"] = [
            draw(containers(("setup", "proxy"), sidecars=True)) for _ in range(draw(st.integers(1, 2)))
        ]
    if _one_in(draw, 6):
        spec["overhead"] = draw(resource_lists())
    if _one_in(draw, 6):
        spec["resources"] = draw(resources())
    if _one_in(draw, 5):
        spec["nodeName"] = draw(st.sampled_from(["", "node-1"]))
    if _one_in(draw, 3):
        spec["tolerations"] = [
            dict(draw(st.sampled_from(TOLERATIONS))) for _ in range(draw(st.integers(0, 3)))
        ]
    if _one_in(draw, 10):
        constraint = {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
        spec["topologySpreadConstraints"] = [constraint] if _one_in(draw, 2) else []
    if _one_in(draw, 20):
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "c"}]
    return spec


@st.composite
def pods(draw: st.DrawFn) -> Json:
    namespace = draw(namespaces)
    meta: Json = {"name": draw(st.sampled_from(["p", "worker-0", "x" * 63])), "namespace": namespace}
    annotations = draw(annotation_sets())
    if _one_in(draw, 20):
        annotations[NODE] = "node-1"
    if _one_in(draw, 20):
        annotations["kubernetes.io/config.mirror"] = "abc"
    if annotations or _one_in(draw, 2):
        meta["annotations"] = annotations
    if _one_in(draw, 20):
        meta["labels"] = {JOBID: draw(st.sampled_from(["12", "13", ""])), "app": "x"}
    if _one_in(draw, 4):
        meta["ownerReferences"] = [dict(o) for o in draw(st.sampled_from(OWNERS))]
    body: Json = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": draw(pod_specs())}
    # Now and then a wrong type, as a buggy client might send to /mutate.
    breakage = draw(st.integers(0, 79)) - 40  # rare: 0..3 sit in the middle of the range (see _one_in)
    if breakage == 0:
        body["spec"]["containers"][0]["resources"] = draw(st.sampled_from(["x", [], 3]))
    elif breakage == 1:
        meta["annotations"] = {P + "min-nodes": 2}
    elif breakage == 2:
        body["spec"] = draw(st.sampled_from(["x", [], None]))
    elif breakage == 3:
        meta["labels"] = ["a"]
    return body


def template(spec: Json, annotations: dict[str, str]) -> Json:
    return {"metadata": {"annotations": annotations}, "spec": spec}


@st.composite
def workloads(draw: st.DrawFn) -> tuple[tuple[str, str, str, str], Json]:
    kind = draw(st.sampled_from([JOB, JOBSET, LWS, PODGROUP]))
    meta: Json = {"name": "w", "namespace": draw(namespaces), "annotations": draw(annotation_sets())}
    templates = [
        template(draw(pod_specs()), draw(annotation_sets()) if _one_in(draw, 3) else {})
        for _ in range(draw(st.integers(1, 2)))
    ]
    if _one_in(draw, 10):
        templates[0]["metadata"]["labels"] = {JOBID: "7"}
    if kind == JOB:
        spec: Json = {"parallelism": 1, "template": templates[0]}
    elif kind == JOBSET:
        spec = {
            "replicatedJobs": [
                {"name": f"r{i}", "template": {"spec": {"template": t}}} for i, t in enumerate(templates)
            ]
        }
    elif kind == LWS:
        spec = {"leaderWorkerTemplate": {"size": 2, "workerTemplate": templates[-1]}}
        if len(templates) > 1:
            spec["leaderWorkerTemplate"]["leaderTemplate"] = templates[0]
    else:
        spec = {"minMember": 2}
    group, version, kind_name, _ = kind
    obj = {"apiVersion": f"{group}/{version}", "kind": kind_name, "metadata": meta, "spec": spec}
    return kind, obj
