"""/validate for the workloads that carry slurmjob annotations: caught at `kubectl apply`."""

import pytest

from tests.webhook.conftest import Admission
from tests.webhook.reviews import (
    JOB,
    JOBID,
    JOBSET,
    LWS,
    NODE,
    OTHER_NS,
    PODGROUP,
    SCHEDULER,
    Json,
    P,
    review,
)

PLACEMENT = "slurm-bridge/placement"

BAD = {P + "timelimit": "soon"}


def template(
    scheduler: str | None = SCHEDULER, annotations: dict[str, str] | None = None, **spec: object
) -> Json:
    body: Json = {"containers": [{"name": "main", "image": "busybox"}], **spec}
    if scheduler is not None:
        body["schedulerName"] = scheduler
    return {"metadata": {"annotations": annotations or {}}, "spec": body}


def workload(
    gvkr: tuple[str, str, str, str], spec: Json, annotations: dict[str, str], namespace: str = "hpc"
) -> Json:
    group, version, kind, _ = gvkr
    return {
        "apiVersion": f"{group}/{version}",
        "kind": kind,
        "metadata": {"name": "w", "namespace": namespace, "annotations": annotations},
        "spec": spec,
    }


def job(t: Json, annotations: dict[str, str], namespace: str = "hpc") -> Json:
    return workload(JOB, {"template": t}, annotations, namespace)


def jobset(t: Json, annotations: dict[str, str]) -> Json:
    return workload(
        JOBSET, {"replicatedJobs": [{"name": "r", "template": {"spec": {"template": t}}}]}, annotations
    )


def lws(t: Json, annotations: dict[str, str]) -> Json:
    return workload(LWS, {"leaderWorkerTemplate": {"size": 4, "workerTemplate": t}}, annotations)


KINDS = [(JOB, job), (JOBSET, jobset), (LWS, lws)]


@pytest.mark.parametrize(("gvkr", "make"), KINDS, ids=["Job", "JobSet", "LeaderWorkerSet"])
def test_bad_annotations_on_a_workload_are_refused_at_apply(
    admission: Admission, gvkr: object, make: object
) -> None:
    obj = make(template(), BAD)  # type: ignore[operator]
    response = admission.validate(review(obj, gvkr=gvkr))  # type: ignore[arg-type]
    assert not response["allowed"]
    assert f"{gvkr[2]} not accepted" in response["status"]["message"]  # type: ignore[index]
    assert f'annotation {P}timelimit="soon": is not a time limit' in response["status"]["message"]


@pytest.mark.parametrize(("gvkr", "make"), KINDS, ids=["Job", "JobSet", "LeaderWorkerSet"])
def test_good_annotations_pass(admission: Admission, gvkr: object, make: object) -> None:
    obj = make(template(), {P + "min-nodes": "2", P + "max-nodes": "4", P + "timelimit": "60"})  # type: ignore[operator]
    assert admission.validate(review(obj, gvkr=gvkr))["allowed"]  # type: ignore[arg-type]


def test_a_pod_template_is_checked_like_the_pods_it_makes(admission: Admission) -> None:
    t = template(annotations={P + "timelimit": "maybe"}, topologySpreadConstraints=[{"maxSkew": 1}])
    message = admission.validate(review(job(t, {}), gvkr=JOB))["status"]["message"]
    assert "in spec.template: spec.topologySpreadConstraints is not supported" in message
    assert f'in spec.template: annotation {P}timelimit="maybe"' in message


def test_unknown_keys_of_a_workload_and_its_templates_are_warned_about(admission: Admission) -> None:
    t = template(annotations={P + "exclusive": "maybe"})
    response = admission.validate(review(job(t, {P + "qos": "high", P + "wckeys": "p"}), gvkr=JOB))
    assert response["allowed"]
    assert response["warnings"] == [
        f'annotation {P}wckeys="p": unknown to slurm-bridge and ignored; did you mean {P}wckey?',
        f'in spec.template: annotation {P}exclusive="maybe": taken as "true" (whole nodes): only "false" '
        "shares nodes",
    ]


def test_a_jobset_names_the_replicated_job(admission: Admission) -> None:
    t = template(resourceClaims=[{"name": "x"}])
    message = admission.validate(review(jobset(t, {}), gvkr=JOBSET))["status"]["message"]
    assert "in spec.replicatedJobs[0].template.spec.template: spec.resourceClaims" in message


def test_a_template_with_a_job_id_is_refused_whatever_its_scheduler(admission: Admission) -> None:
    t = template(scheduler="volcano")
    t["metadata"]["labels"] = {JOBID: "5"}
    message = admission.validate(review(job(t, {}, namespace=OTHER_NS), gvkr=JOB))["status"]["message"]
    assert f"spec.template.metadata.labels: the label {JOBID} is set by slurm-bridge" in message


@pytest.mark.parametrize("key", [NODE, PLACEMENT])
def test_a_template_with_a_bridge_annotation_is_refused_on_create_and_update(
    admission: Admission, key: str
) -> None:
    forged = template()
    forged["metadata"]["annotations"] = {key: "x"}
    message = admission.validate(review(job(forged, {}), gvkr=JOB))["status"]["message"]
    assert f"spec.template.metadata.annotations: the annotation {key} is set by slurm-bridge" in message
    update = review(job(forged, {}), old=job(template(), {}), operation="UPDATE", gvkr=JOB)
    assert not admission.validate(update)["allowed"]


def test_a_template_node_name_is_fine_since_mutation_removes_it(admission: Admission) -> None:
    assert admission.validate(review(job(template(nodeName="n1"), {}), gvkr=JOB))["allowed"]


@pytest.mark.parametrize(
    ("t", "namespace"),
    [
        (template(scheduler="volcano"), "hpc"),  # another scheduler
        (template(scheduler=None), OTHER_NS),  # default scheduler outside managed namespaces
    ],
)
def test_workloads_not_for_the_bridge_are_not_checked(admission: Admission, t: Json, namespace: str) -> None:
    assert admission.validate(review(job(t, BAD, namespace), gvkr=JOB))["allowed"]


def test_a_default_scheduler_workload_in_a_managed_namespace_is_checked(admission: Admission) -> None:
    assert not admission.validate(review(job(template(scheduler=None), BAD), gvkr=JOB))["allowed"]


def test_podgroups_are_checked_in_managed_namespaces_or_when_annotated(admission: Admission) -> None:
    group = workload(PODGROUP, {"minMember": 2}, BAD)
    assert not admission.validate(review(group, gvkr=PODGROUP))["allowed"]
    elsewhere = workload(PODGROUP, {"minMember": 2}, BAD, namespace=OTHER_NS)
    assert not admission.validate(review(elsewhere, gvkr=PODGROUP))["allowed"]
    plain = workload(PODGROUP, {"minMember": 2}, {"note": "x"}, namespace=OTHER_NS)
    assert admission.validate(review(plain, gvkr=PODGROUP))["allowed"]


def test_a_workload_update_is_refused_only_for_new_problems(admission: Admission) -> None:
    old = job(template(), BAD)
    new = job(template(), {**BAD, "note": "changed"})
    response = admission.validate(review(new, old=old, operation="UPDATE", gvkr=JOB))
    assert response["allowed"]
    assert "already present" in response["warnings"][0]
    worse = job(template(), {**BAD, P + "partition": ""})
    response = admission.validate(review(worse, old=old, operation="UPDATE", gvkr=JOB))
    assert not response["allowed"]
    assert "partition" in response["status"]["message"]
    assert "timelimit" not in response["status"]["message"]


def test_workload_status_updates_and_deletes_pass(admission: Admission) -> None:
    bad = job(template(), BAD)
    assert admission.validate(review(bad, old=bad, operation="UPDATE", gvkr=JOB, sub_resource="status"))[
        "allowed"
    ]
    assert admission.validate(review(None, old=bad, operation="DELETE", gvkr=JOB))["allowed"]
