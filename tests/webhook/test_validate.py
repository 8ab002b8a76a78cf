"""/validate for pods over HTTPS: every denial, and what stays allowed."""

import pytest

from tests.webhook.conftest import Admission
from tests.webhook.reviews import (
    BRIDGE_USER,
    DRA,
    JOBID,
    NODE,
    OTHER_NS,
    SCHEDULER,
    Json,
    P,
    container,
    pod,
    review,
)


def bridge_pod(**kwargs: object) -> Json:
    return pod(scheduler=SCHEDULER, **kwargs)  # type: ignore[arg-type]


def denial(admission: Admission, sent: Json) -> str:
    response = admission.validate(sent)
    assert not response["allowed"], response
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    message: str = response["status"]["message"]
    assert message.startswith("slurm-bridge: ")
    return message


def allowed(admission: Admission, sent: Json) -> Json:
    response = admission.validate(sent)
    assert response["allowed"], response.get("status")
    return response


# -- bridge-owned keys --------------------------------------------------------


@pytest.mark.parametrize("namespace", ["hpc", OTHER_NS])
@pytest.mark.parametrize("scheduler", [SCHEDULER, "default-scheduler"])
def test_no_one_creates_a_pod_with_a_job_id(admission: Admission, namespace: str, scheduler: str) -> None:
    obj = pod(namespace=namespace, scheduler=scheduler, labels={JOBID: "42"})
    message = denial(admission, review(obj))
    assert f"metadata.labels: the label {JOBID} is set by slurm-bridge" in message
    assert "remove it from the manifest" in message
    assert BRIDGE_USER in message


def test_no_one_creates_a_pod_with_a_node_annotation(admission: Admission) -> None:
    message = denial(admission, review(bridge_pod(annotations={NODE: "node-1"})))
    assert f"metadata.annotations: the annotation {NODE} is set by slurm-bridge" in message


def test_the_bridge_may_set_them(admission: Admission) -> None:
    allowed(admission, review(bridge_pod(labels={JOBID: "42"}, annotations={NODE: "n"}), user=BRIDGE_USER))


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({JOBID: "42"}, {JOBID: "43"}),  # riding on another job's allocation
        ({}, {JOBID: "43"}),  # labelling first, before the bridge does
        ({JOBID: "42"}, {}),  # detaching a pod from its job
    ],
)
def test_users_cannot_change_the_job_id(
    admission: Admission, before: dict[str, str], after: dict[str, str]
) -> None:
    old, new = bridge_pod(labels=before), bridge_pod(labels=after)
    message = denial(admission, review(new, old=old, operation="UPDATE"))
    assert f"the label {JOBID} cannot be changed" in message
    assert "keep its current value" in message
    allowed(admission, review(new, old=old, operation="UPDATE", user=BRIDGE_USER))


def test_users_cannot_change_the_node_annotation(admission: Admission) -> None:
    old, new = bridge_pod(annotations={NODE: "a"}), bridge_pod(annotations={NODE: "b"})
    message = denial(admission, review(new, old=old, operation="UPDATE"))
    assert 'cannot be changed from "a" to "b"' in message


PLACEMENT = "slurm-bridge/placement"


@pytest.mark.parametrize("namespace", ["hpc", OTHER_NS])
def test_no_one_but_the_bridge_claims_a_pod_for_a_placement(admission: Admission, namespace: str) -> None:
    claimed = {PLACEMENT: "placement/hpc/other/uid-1"}
    message = denial(admission, review(pod(namespace=namespace, annotations=claimed)))
    assert f"metadata.annotations: the annotation {PLACEMENT} is set by slurm-bridge" in message
    old, new = bridge_pod(annotations={PLACEMENT: "a"}), bridge_pod(annotations={PLACEMENT: "b"})
    assert 'cannot be changed from "a" to "b"' in denial(admission, review(new, old=old, operation="UPDATE"))
    assert "cannot be changed" in denial(admission, review(bridge_pod(), old=old, operation="UPDATE"))
    allowed(admission, review(new, old=old, operation="UPDATE", user=BRIDGE_USER))
    allowed(admission, review(bridge_pod(annotations=claimed), user=BRIDGE_USER))


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({}, {NODE: "node-7"}),  # pointing the pod at a node before the bridge binds it
        ({NODE: "node-1"}, {}),  # erasing where the bridge placed it
    ],
)
def test_users_cannot_set_or_erase_the_node_annotation(
    admission: Admission, before: dict[str, str], after: dict[str, str]
) -> None:
    old, new = bridge_pod(annotations=before), bridge_pod(annotations=after)
    assert f"the annotation {NODE} cannot be changed" in denial(
        admission, review(new, old=old, operation="UPDATE")
    )
    allowed(admission, review(new, old=old, operation="UPDATE", user=BRIDGE_USER))


@pytest.mark.parametrize(
    ("field", "key", "value"),
    [("labels", JOBID, "42"), ("annotations", NODE, "node-1"), ("annotations", PLACEMENT, "placement/x/y")],
)
def test_an_update_adding_a_bridge_key_is_refused_on_any_pod(
    admission: Admission, field: str, key: str, value: str
) -> None:
    """Not only the bridge's pods: a pod of another scheduler in an unmanaged namespace,
    labelled with a job id, would be followed as that job's (and ride on its allocation)."""
    old = pod(namespace=OTHER_NS, scheduler="default-scheduler")
    new = pod(namespace=OTHER_NS, scheduler="default-scheduler", **{field: {key: value}})  # type: ignore[arg-type]
    assert f"{key} cannot be changed" in denial(admission, review(new, old=old, operation="UPDATE"))


@pytest.mark.parametrize(
    "user",
    [
        "system:serviceaccount:web:slurm-bridge",  # the bridge's name, another namespace
        "system:serviceaccount:slurm-bridge:default",  # the bridge's namespace, another account
        "slurm-bridge",  # a plain user named like it
        "system:serviceaccount:slurm-bridge:slurm-bridge ",  # a look-alike
    ],
)
def test_only_the_configured_service_account_writes_bridge_keys(admission: Admission, user: str) -> None:
    forged = bridge_pod(labels={JOBID: "42"}, annotations={NODE: "n", PLACEMENT: "placement/x/y"})
    message = denial(admission, review(forged, user=user))
    for key in (JOBID, NODE, PLACEMENT):
        assert f"{key} is set by slurm-bridge" in message
    placed = bridge_pod(labels={JOBID: "41"})
    assert "cannot be changed" in denial(admission, review(forged, old=placed, operation="UPDATE", user=user))


def test_the_status_subresource_cannot_change_bridge_keys(admission: Admission) -> None:
    """pods/status keeps metadata changes on a real API server: no way around the check."""
    old = bridge_pod(labels={JOBID: "41"})
    forged = bridge_pod(labels={JOBID: "42"}, annotations={PLACEMENT: "placement/x/y"})
    message = denial(admission, review(forged, old=old, operation="UPDATE", sub_resource="status"))
    assert f"the label {JOBID} cannot be changed" in message
    assert f"the annotation {PLACEMENT} cannot be changed" in message
    running = bridge_pod(labels={JOBID: "41"})
    running["status"] = {"phase": "Running"}
    allowed(admission, review(running, old=old, operation="UPDATE", sub_resource="status"))  # the kubelet's
    allowed(admission, review(forged, old=old, operation="UPDATE", sub_resource="status", user=BRIDGE_USER))


def test_users_may_update_other_labels_of_a_placed_pod(admission: Admission) -> None:
    old = bridge_pod(labels={JOBID: "42"}, annotations={NODE: "a"})
    new = bridge_pod(labels={JOBID: "42", "team": "x"}, annotations={NODE: "a", "note": "y"})
    allowed(admission, review(new, old=old, operation="UPDATE"))


# -- placement ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "spec.topologySpreadConstraints is not supported"),
        ({"resourceClaims": [{"name": "gpu"}]}, "spec.resourceClaims is not supported"),
        ({"nodeName": "node-1"}, 'spec.nodeName is "node-1"'),
        (
            {"containers": [container(limits={"cpu": "1"}), container("b", limits={DRA + "dra.cpu": "2"})]},
            f'"cpu" and "{DRA}dra.cpu" cannot both be requested',
        ),
        (
            {"initContainers": [container("setup", requests={DRA + "fpga.example.com": "1"})]},
            'container "setup" uses unsupported DRA device class "fpga.example.com"',
        ),
        ({"containers": [container(limits={"memory": "lots"})]}, "'lots' is not a Kubernetes quantity"),
        ({"overhead": {"cpu": "1.2.3"}}, "spec.overhead cpu"),
    ],
)
def test_what_slurm_cannot_place_is_refused(admission: Admission, spec: Json, expected: str) -> None:
    assert expected in denial(admission, review(bridge_pod(**spec)))


def test_an_empty_topology_spread_list_is_fine(admission: Admission) -> None:
    allowed(admission, review(bridge_pod(topologySpreadConstraints=[])))


def test_supported_devices_are_fine(admission: Admission) -> None:
    dra = [
        container(limits={DRA + "gpu.nvidia.com": "2", DRA + "dra.cpu": "4"}),
        container("b", limits={DRA + "gpu.nvidia.com": "1", "example.com/widget": "3"}),
    ]
    allowed(admission, review(bridge_pod(containers=dra)))
    plugin = [container(limits={"nvidia.com/gpu": "1", "amd.com/gpu": "1", "example.com/widget": "3"})]
    allowed(admission, review(bridge_pod(containers=plugin)))


def test_dra_requests_the_bridge_cannot_pin_to_slurms_devices_are_denied(admission: Admission) -> None:
    # Slurm counts one gres/gpu per node: two GPU names in one pod cannot be told apart.
    mixed = [container(limits={DRA + "gpu.nvidia.com": "1"}), container("b", limits={"nvidia.com/gpu": "1"})]
    assert "a pod may use one GPU resource name only" in denial(
        admission, review(bridge_pod(containers=mixed))
    )
    # Init containers would need the regular containers' devices as well: not pinned.
    init = {
        "containers": [container()],
        "initContainers": [container("setup", limits={DRA + "gpu.nvidia.com": "1"})],
    }
    assert 'init container "setup" requests DRA devices' in denial(admission, review(bridge_pod(**init)))
    half = [container(limits={DRA + "gpu.nvidia.com": "500m"})]
    assert "devices are counted in whole numbers" in denial(admission, review(bridge_pod(containers=half)))


def test_pods_of_other_schedulers_are_not_checked(admission: Admission) -> None:
    allowed(admission, review(pod(scheduler="volcano", topologySpreadConstraints=[{"maxSkew": 1}])))
    allowed(admission, review(pod(namespace=OTHER_NS, annotations={P + "timelimit": "soon"})))


def test_a_default_scheduler_pod_in_a_managed_namespace_is_checked(admission: Admission) -> None:
    # What /mutate would have made ours (e.g. if the mutating webhook is set to Ignore and was down).
    assert "timelimit" in denial(admission, review(pod(annotations={P + "timelimit": "soon"})))


# -- annotations --------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("min-nodes", "two", "must be a whole number"),
        ("max-nodes", "0", "must be at least 1: Slurm refuses a maximum of 0 nodes"),
        ("priority", "-1", "must not be negative"),
        ("group-id", "99999999999", "must be at most 2147483647"),
        ("timelimit", "soon", "is not a time limit"),
        ("timelimit", "0", "is zero: Slurm would end the job at once"),
        ("mem-per-node", "4GB", "'4GB' is not a Kubernetes quantity (examples: 2, 500m"),
        ("cpu-per-task", "-1", "must not be negative"),
        ("partition", " ", "must not be empty"),
    ],
)
def test_each_bad_annotation_is_named_with_its_fix(
    admission: Admission, key: str, value: str, expected: str
) -> None:
    message = denial(admission, review(bridge_pod(annotations={P + key: value})))
    assert f'annotation {P}{key}="{value}": {expected}' in message


def test_a_sizing_the_bridge_does_not_know_is_refused_with_the_two_it_does(admission: Admission) -> None:
    message = denial(admission, review(bridge_pod(annotations={"slurm-bridge/sizing": "exact"})))
    assert 'annotation slurm-bridge/sizing: "exact" is neither "per-pod"' in message
    assert '"largest-pod"' in message
    for sizing in ("per-pod", "largest-pod"):
        allowed(admission, review(bridge_pod(annotations={"slurm-bridge/sizing": sizing})))


def test_every_problem_is_reported_at_once(admission: Admission) -> None:
    annotations = {P + "min-nodes": "3", P + "max-nodes": "2", P + "partition": "", P + "timelimit": "x"}
    message = denial(admission, review(bridge_pod(annotations=annotations)))
    assert "min-nodes must be <= max-nodes" in message
    assert "partition" in message
    assert "timelimit" in message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        # What upstream slurm-bridge takes (its parseUserAnnotations), meaning the same here.
        ("exclusive", "yes"),
        ("user-id", "alice"),
        ("group-id", "physics"),
        ("timelimit", "2h"),
        ("timelimit", "1d12h"),
        ("max-nodes", "+4"),
        ("min-nodes", "0"),
        ("cpu-per-task", "0"),
        ("mem-per-node", "0"),
        ("account", ""),
        ("qos", " "),
        ("gres", ""),
        ("job-name", ""),
        ("timelimt", "30"),  # unknown: ignored, as upstream ignores it
    ],
)
def test_what_upstream_accepts_is_admitted(admission: Admission, key: str, value: str) -> None:
    allowed(admission, review(bridge_pod(annotations={P + key: value})))


def test_an_unknown_key_is_admitted_with_a_warning(admission: Admission) -> None:
    response = allowed(admission, review(bridge_pod(annotations={P + "timelimt": "30"})))
    assert response["warnings"] == [
        f'annotation {P}timelimt="30": unknown to slurm-bridge and ignored; did you mean {P}timelimit?'
    ]


def test_a_non_boolean_exclusive_is_admitted_with_a_warning(admission: Admission) -> None:
    response = allowed(admission, review(bridge_pod(annotations={P + "exclusive": "no"})))
    assert response["warnings"] == [
        f'annotation {P}exclusive="no": taken as "true" (whole nodes): only "false" shares nodes'
    ]
    assert "warnings" not in allowed(admission, review(bridge_pod(annotations={P + "exclusive": "false"})))


def test_an_update_warns_only_about_what_it_brings(admission: Admission) -> None:
    old = bridge_pod(annotations={P + "colour": "blue"})
    new = bridge_pod(annotations={P + "colour": "blue", P + "size": "L"})
    response = allowed(admission, review(new, old=old, operation="UPDATE"))
    assert response["warnings"] == [f'annotation {P}size="L": unknown to slurm-bridge and ignored']
    assert "warnings" not in allowed(admission, review(old, old=old, operation="UPDATE"))


def test_good_annotations_pass(admission: Admission) -> None:
    annotations = {
        P + "timelimit": "2-12:00",
        P + "mem-per-node": "4Gi",
        P + "cpu-per-task": "500m",
        P + "exclusive": "false",
        P + "partition": "gpu",
        P + "priority": "100",
    }
    allowed(admission, review(bridge_pod(annotations=annotations)))


def test_a_bare_pod_gets_the_translations_verdict(admission: Admission) -> None:
    # A bare pod is one Slurm job on one node: min-nodes 2 cannot be satisfied.
    message = denial(admission, review(bridge_pod(annotations={P + "min-nodes": "2"})))
    assert "cannot become a Slurm job" in message
    assert "min-nodes" in message


def test_a_workload_pod_is_shaped_by_its_workload(admission: Admission) -> None:
    obj = bridge_pod(annotations={P + "min-nodes": "2"})
    obj["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "1", "controller": True}]
    allowed(admission, review(obj))


@pytest.mark.parametrize(
    ("annotation", "resources", "expected"),
    [
        ("cpu-per-task", {DRA + "dra.cpu": "4"}, "cpu-per-task cannot be combined with"),
        ("gres", {DRA + "gpu.nvidia.com": "1"}, "gres cannot be combined with DRA device requests"),
    ],
)
def test_annotations_contradicting_dra_requests_are_refused(
    admission: Admission, annotation: str, resources: Json, expected: str
) -> None:
    value = "2" if annotation == "cpu-per-task" else "gres/gpu=1"
    obj = bridge_pod(annotations={P + annotation: value}, containers=[container(limits=resources)])
    assert expected in denial(admission, review(obj))


def test_gres_with_device_plugin_gpus_is_fine(admission: Admission) -> None:
    obj = bridge_pod(
        annotations={P + "gres": "gres/gpu=1"}, containers=[container(limits={"nvidia.com/gpu": "1"})]
    )
    allowed(admission, review(obj))


def test_annotations_must_be_strings(admission: Admission) -> None:
    obj = bridge_pod()
    obj["metadata"]["annotations"] = {P + "min-nodes": 2}
    assert "quote numbers and booleans" in denial(admission, review(obj))


# -- updates and subresources -------------------------------------------------


def test_an_update_may_not_introduce_a_bad_annotation(admission: Admission) -> None:
    old = bridge_pod()
    new = bridge_pod(annotations={P + "timelimit": "later"})
    assert "pod update not accepted" in denial(admission, review(new, old=old, operation="UPDATE"))


def test_an_old_problem_does_not_block_updates(admission: Admission) -> None:
    # A pod from before the webhook, its finalizer being removed: allowed, with a warning.
    old = bridge_pod(annotations={P + "timelimit": "later"})
    new = bridge_pod(annotations={P + "timelimit": "later"})
    new["metadata"]["finalizers"] = []
    response = allowed(admission, review(new, old=old, operation="UPDATE", user=BRIDGE_USER))
    assert "already present" in response["warnings"][0]


def test_a_bound_pod_can_be_updated(admission: Admission) -> None:
    old = bridge_pod(nodeName="node-1", labels={JOBID: "1"})
    new = bridge_pod(nodeName="node-1", labels={JOBID: "1", "x": "y"})
    allowed(admission, review(new, old=old, operation="UPDATE"))


def test_resizing_a_bridge_pod_is_refused(admission: Admission) -> None:
    old = bridge_pod(containers=[container(limits={"cpu": "1"})])
    new = bridge_pod(containers=[container(limits={"cpu": "2"})])
    message = denial(admission, review(new, old=old, operation="UPDATE", sub_resource="resize"))
    assert "pods/resize" in message
    assert "delete the pod and create it again" in message


def test_resizing_other_pods_is_fine(admission: Admission) -> None:
    allowed(admission, review(pod(), old=pod(), operation="UPDATE", sub_resource="resize"))


# Not status (see test_the_status_subresource_cannot_change_bridge_keys): binding's object is a
# Binding, and the ephemeralcontainers strategy drops every change but ephemeral containers.
@pytest.mark.parametrize("sub_resource", ["binding", "ephemeralcontainers"])
def test_other_subresources_are_not_policed(admission: Admission, sub_resource: str) -> None:
    obj = bridge_pod(labels={JOBID: "9"})
    allowed(admission, review(obj, old=bridge_pod(), operation="UPDATE", sub_resource=sub_resource))


def test_delete_is_always_allowed(admission: Admission) -> None:
    obj = bridge_pod(annotations={P + "timelimit": "never"}, labels={JOBID: "3"})
    allowed(admission, review(None, old=obj, operation="DELETE"))


def test_an_update_without_old_object_is_a_400(admission: Admission) -> None:
    response = admission.validate(review(bridge_pod(), operation="UPDATE"))
    assert not response["allowed"]
    assert response["status"]["code"] == 400
    assert "request.oldObject" in response["status"]["message"]
