"""coordination.k8s.io/v1 Leases: what leader election relies on.

Namespaced; create of an existing name is 409 AlreadyExists; a PUT or patch
carrying a stale resourceVersion is 409 Conflict and changes nothing; every
write bumps the version. Driven through the official client's CoordinationV1Api, against
the fake and the real kube-apiserver alike (``kube_api``).
"""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from testbed.kube_fake.backend import KubeApi
from testbed.kube_fake.builders import Client, error_body, watch

# A MicroTime with a fraction that is not zero: the official client re-encodes a MicroTime
# from a dict body through datetime.isoformat(), which drops a zero fraction, and the server
# refuses a MicroTime without its six digits (400).
NOW = "2026-01-01T00:00:00.000001Z"


def lease(name: str, holder: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": NOW, **spec},
    }


@pytest.fixture
def leases(kube_api: KubeApi) -> Client:
    return kubernetes.client.CoordinationV1Api(kube_api.api_client)


@pytest.fixture
def ns(kube_api: KubeApi) -> str:
    return kube_api.namespace


def test_leases_are_namespaced(kube_api: KubeApi, leases: Client, ns: str) -> None:
    team_a = kube_api.other_namespace("team-a")
    a = leases.create_namespaced_lease(ns, lease("l", "a"))
    b = leases.create_namespaced_lease(team_a, lease("l", "b"))
    assert (a.metadata.namespace, b.metadata.namespace) == (ns, team_a)
    assert a.kind == "Lease"
    assert a.api_version == "coordination.k8s.io/v1"
    assert leases.read_namespaced_lease("l", ns).spec.holder_identity == "a"
    assert [x.metadata.name for x in leases.list_namespaced_lease(team_a).items] == ["l"]
    everywhere = leases.list_lease_for_all_namespaces().items  # the real server has leases of its own
    assert sorted(
        (x.metadata.namespace, x.spec.holder_identity)
        for x in everywhere
        if x.metadata.namespace.startswith(ns)
    ) == [
        (ns, "a"),
        (team_a, "b"),
    ]


def test_create_of_an_existing_lease_is_already_exists(leases: Client, ns: str) -> None:
    leases.create_namespaced_lease(ns, lease("l", "first"))
    with pytest.raises(ApiException) as exc:
        leases.create_namespaced_lease(ns, lease("l", "second"))
    assert exc.value.status == 409
    body = error_body(exc.value)
    assert body["reason"] == "AlreadyExists"
    assert body["message"] == 'leases.coordination.k8s.io "l" already exists'
    assert body["details"] == {"name": "l", "group": "coordination.k8s.io", "kind": "leases"}
    assert leases.read_namespaced_lease("l", ns).spec.holder_identity == "first"


def test_an_update_with_a_stale_resource_version_is_a_conflict(leases: Client, ns: str) -> None:
    created = leases.create_namespaced_lease(ns, lease("l", "a"))
    stale = created.metadata.resource_version
    # Candidate b read version `stale` and wins the race; candidate c read the same version.
    won = lease("l", "b", leaseTransitions=1)
    won["metadata"] = {"name": "l", "resourceVersion": stale}
    updated = leases.replace_namespaced_lease("l", ns, won)
    assert int(updated.metadata.resource_version) > int(stale)
    assert updated.spec.holder_identity == "b"
    lost = lease("l", "c", leaseTransitions=1)
    lost["metadata"] = {"name": "l", "resourceVersion": stale}
    with pytest.raises(ApiException) as exc:
        leases.replace_namespaced_lease("l", ns, lost)
    assert exc.value.status == 409
    body = error_body(exc.value)
    assert body["reason"] == "Conflict"
    assert "the object has been modified" in body["message"]
    current = leases.read_namespaced_lease("l", ns)
    assert current.spec.holder_identity == "b"
    assert current.metadata.resource_version == updated.metadata.resource_version


def test_a_patch_with_a_stale_resource_version_is_a_conflict(leases: Client, ns: str) -> None:
    created = leases.create_namespaced_lease(ns, lease("l", "a"))
    stale = created.metadata.resource_version
    leases.patch_namespaced_lease(
        "l", ns, {"spec": {"renewTime": "2026-01-01T00:00:05.000001Z"}}
    )  # a renewal moves the version on
    with pytest.raises(ApiException) as exc:
        leases.patch_namespaced_lease(
            "l",
            ns,
            {"metadata": {"resourceVersion": stale}, "spec": {"holderIdentity": "c"}},
            _content_type="application/merge-patch+json",
        )
    assert exc.value.status == 409
    assert error_body(exc.value)["reason"] == "Conflict"
    assert leases.read_namespaced_lease("l", ns).spec.holder_identity == "a"


def test_a_released_lease_round_trips(leases: Client, ns: str) -> None:
    """What client-go's ReleaseOnCancel writes: no holder, a one-second duration."""
    created = leases.create_namespaced_lease(ns, lease("l", "a", leaseTransitions=3))
    released = lease("l", "", leaseDurationSeconds=1, leaseTransitions=3)
    released["metadata"] = {"name": "l", "resourceVersion": created.metadata.resource_version}
    leases.replace_namespaced_lease("l", ns, released)
    spec = leases.read_namespaced_lease("l", ns).spec
    assert (spec.holder_identity, spec.lease_duration_seconds, spec.lease_transitions) == ("", 1, 3)


def test_lease_changes_are_watched(leases: Client, ns: str) -> None:
    created = leases.create_namespaced_lease(ns, lease("l", "a"))
    renewed = lease("l", "a", renewTime="2026-01-01T00:00:02.000001Z")
    renewed["metadata"] = {"name": "l", "resourceVersion": created.metadata.resource_version}
    leases.replace_namespaced_lease("l", ns, renewed)
    stream = watch.Watch().stream(
        leases.list_namespaced_lease,
        ns,
        resource_version=created.metadata.resource_version,
        timeout_seconds=1,
    )
    events = [(e["type"], e["object"].spec.renew_time.second) for e in stream]
    assert events == [("MODIFIED", 2)]


def test_a_micro_time_without_its_six_digits_is_refused(kube_api: KubeApi, ns: str) -> None:
    """What the official client sends for a MicroTime whose fraction is zero (see NOW)."""
    body = lease("l", "a", renewTime="2026-01-01T00:00:00+00:00")
    answer = kube_api.raw("POST", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", body)
    assert (answer.status_code, answer.json()) == (
        400,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": 'Lease in version "v1" cannot be handled as a Lease: '
            'parsing time "2026-01-01T00:00:00+00:00" as "2006-01-02T15:04:05.000000Z07:00": '
            'cannot parse "+00:00" as ".000000"',
            "reason": "BadRequest",
            "code": 400,
        },
    )
    assert (
        kube_api.raw(
            "POST", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", lease("l", "a")
        ).status_code
        == 201
    )
