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

* server-side apply (``application/apply-patch+yaml`` -> 415), the
  ``$retainKeys`` directive (422); ``dryRun`` (400);
* ``limit``/``continue`` (lists are never paginated: no ``continue`` token)
  and ``resourceVersion``/``resourceVersionMatch`` on plain lists (always
  the current state; a malformed one still fails, as on a real server);
* a watch from a resourceVersion newer than the store just waits for it;
* no garbage collector or namespace lifecycle: ``propagationPolicy`` is
  accepted and ignored (a real server keeps a Foreground deletion's object,
  with its ``foregroundDeletion`` finalizer, for a collector), ownerReferences
  never cascade, deleting a namespace does not delete its contents;
* admission plugins (service-account token volume and ``serviceAccountName``,
  default tolerations, ``preemptionPolicy``), most field validation,
  managedFields, protobuf/CBOR/YAML, authz (an optional bearer token is the
  only auth);
* core/v1 and events.k8s.io/v1 events are separate stores (no conversion);
* of kube-controller-manager only the taint-eviction and disruption
  controllers run (no node lifecycle taints, no scheduler); the disruption
  controller has no two-minute ``disruptedPods`` recheck and scales only
  ReplicaSets, Deployments and StatefulSets;
* one version per resource, except scheduling.k8s.io's Workload and PodGroup:
  Kubernetes 1.36's v1alpha2 by default, or 1.37's v1beta1 and/or v1alpha3
  (``serve_scheduling_versions``), which share one schema, so converting between
  them is the apiVersion alone; no conversion between releases.

Compared with kube-apiserver: the behaviour tests that take ``kube_api``
(``backend.py``) run against the fake and against a real kube-apiserver
(testbed/kube_real, v1.28) alike: Status bodies, unserved groups, patches, watches
and 410s, bindings, evictions, selectors, deletion. Known differences, kept on
purpose:

* the fake is a newer Kubernetes than that test bed: pods have a
  ``metadata.generation`` (1.33+), ``sendInitialEvents`` watches work (the
  WatchList gate is off in 1.28), and it serves resource.k8s.io/v1 and
  scheduling.k8s.io's PodGroup APIs; its custom resources (JobSet,
  LeaderWorkerSet, scheduling.x-k8s.io PodGroup) are registered, not CRDs;
* watch bookmarks come when a watch that allows them times out, and on
  ``send_bookmarks()``; the real server sends them on its own schedule, with no
  guarantee (none came within 75 s on 1.28), so their timing and shape are not
  compared;
* a JSON patch that cannot be applied is 422 with the real server's Status plus a
  cause carrying the patch library's text (the real ``details`` are empty);
  syntax errors in JSON bodies are worded by Python's parser (same status,
  reason and prefix); a pod update that changes its spec is refused with the
  real message minus the diff of the two specs it ends with; malformed
  MicroTimes are worded as Go's parser words the common case (no fraction);
* objects are stored as sent, with no Go round trip: empty lists and maps that
  the real server drops (``finalizers: []``) and unknown fields stay;
* answers come at once: an eviction of a pod the budgets do not protect
  (Pending or finished) whose preconditions fail is retried by the real server
  for about ten seconds before its 409; the fake answers the 409 straight away;
* its simulated kubelet and controllers (off in the ``kube_api`` tests, where
  the fake runs bare, as the real test bed runs no controller).
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
