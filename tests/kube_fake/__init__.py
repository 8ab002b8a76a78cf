"""A fake Kubernetes API server for tests and the local demo stack.

It speaks real HTTP/1.1 + JSON to the official ``kubernetes`` client (sync and
``kubernetes.aio``)::

    with FakeKubeServer() as kube:                 # port 0: ephemeral
        core = kubernetes.client.CoreV1Api(kube.api_client())
        ...                                        # or kube.aio_api_client(), kube.kubeconfig(path)

Module map: ``store`` (objects, resourceVersion, event log, deletion),
``patches`` (RFC 6902 / RFC 7386 / strategic merge), ``selectors``,
``watch`` (streams), ``subresources`` (binding, eviction), ``validation``
(pod defaults and immutability, names), ``dra`` (resource.k8s.io checks),
``kubelet`` (optional simulation), ``controllers`` (the controller loop),
``taint_eviction`` and ``disruption`` (controllers on by default), ``clock``,
``handler`` (HTTP routing), ``server`` (``FakeKubeServer`` and helpers).

Deliberately not supported (each answers clearly or is ignored as noted):

* server-side apply (``application/apply-patch+yaml`` -> 415), strategic
  merge patch on custom resources (415, as on a real server), the
  ``$retainKeys`` directive (422); ``dryRun`` (400);
* ``limit``/``continue`` (lists are never paginated: no ``continue`` token)
  and ``resourceVersion``/``resourceVersionMatch`` on plain lists (always
  the current state);
* a watch from a resourceVersion newer than the store just waits for it;
* no garbage collector or namespace lifecycle: ``propagationPolicy`` is
  accepted and ignored, ownerReferences never cascade, deleting a namespace
  does not delete its contents;
* graceful pod termination: without finalizers a pod is removed at once
  (even when bound); with finalizers it stays until they are removed;
* admission plugins (service-account token volume, default tolerations),
  most field validation, managedFields, protobuf/CBOR/YAML, authz
  (an optional bearer token is the only auth);
* core/v1 and events.k8s.io/v1 events are separate stores (no conversion);
* of kube-controller-manager only the taint-eviction and disruption
  controllers run (no node lifecycle taints, no scheduler); the disruption
  controller has no two-minute ``disruptedPods`` recheck and scales only
  ReplicaSets, Deployments and StatefulSets;
* one version per resource, except scheduling.k8s.io's Workload and PodGroup:
  Kubernetes 1.36's v1alpha2 by default, or 1.37's v1beta1 and/or v1alpha3
  (``serve_scheduling_versions``), which share one schema, so converting between
  them is the apiVersion alone; no conversion between releases.
"""

from .clock import FakeClock
from .errors import ApiError
from .faults import Hold, RecordedRequest
from .kubelet import EXIT_CODE, RUN_SECONDS, FakeKubelet
from .resources import DEFAULT_RESOURCES, ResourceType
from .server import FakeKubeServer

__all__ = [
    "DEFAULT_RESOURCES",
    "EXIT_CODE",
    "RUN_SECONDS",
    "ApiError",
    "FakeClock",
    "FakeKubeServer",
    "FakeKubelet",
    "Hold",
    "RecordedRequest",
    "ResourceType",
]
