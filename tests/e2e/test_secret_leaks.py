"""The Slurm JWT appears in no workflow history, log line, Event, pod condition or error.

Placements go through the bridge's success and failure paths: one runs to the
end; one meets a token slurmrestd refuses (a bad token in the token file, as a
botched rotation leaves it: the Slurm-health gate holds it and tells the pod) and
completes once the file is fixed; one is
refused by Slurm (an unknown partition), which the bridge tells on the pod and
in the workflow's failure; the `slurm-bridge status` command reports on them.
Then every workflow history of the Temporal server (payloads decoded), every
log record of the test (DEBUG and up, tracebacks included), every object in
the fake API server (Events and pod conditions among them), every request the
bridge sent to Kubernetes and the command's output are searched for the real
token and the bad one. The search itself is proven able to find a planted
token (tests/unit/test_secret_search.py); here the failures' own words are
found, so the search did see the places a leak would be.
"""

import json
import logging
import secrets
import shutil
from pathlib import Path

import pytest

from bridge import keys
from testbed.slurm_bed import SlurmTestBed
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Stack, bound, finished_cleanly, slurm_bridge
from tests.secret_search import found_in, log_texts, workflow_histories

pytestmark = pytest.mark.slurm
REFUSED = "Protocol authentication error"  # slurmrestd's words for a token it refuses


def kube_texts(stack: Stack) -> dict[str, str]:
    """Every object the fake API server holds, and every request body the bridge sent it."""
    texts = {}
    for rt in stack.fake.registry.all():
        for obj in stack.fake.store.snapshot(rt, None):
            meta = obj.get("metadata") or {}
            texts[f"{rt.kind} {meta.get('namespace')}/{meta.get('name')}"] = json.dumps(obj)
    for i, request in enumerate(stack.fake.requests):
        texts[f"request {i} {request.method} {request.path}"] = json.dumps(request.body)
    return texts


async def test_the_jwt_leaks_nowhere(
    make_stack: StackFactory, slurm_bed: SlurmTestBed, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token_file = tmp_path / "slurm-jwt"
    shutil.copy(slurm_bed.jwt_file, token_file)
    real = slurm_bed.token()
    # A well-formed JWT that slurmrestd refuses: what a botched rotation leaves in the file.
    bad = f"eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.{secrets.token_urlsafe(24)}.{secrets.token_urlsafe(16)}"
    stack = await make_stack(nodes=2, slurm_jwt_file=token_file)

    stack.create_pod("fine")
    await stack.wait_pod("fine", bound)

    token_file.write_text(f"SLURM_JWT={bad}\n")
    stack.create_pod("refused-token")
    # The Slurm-health gate tells the pod once the submission failed on the token (so the
    # failure is in the placement's history by then): wait for that Event.
    await stack.kube.wait_for_async(
        lambda: any(e["reason"] == "SlurmUnavailable" for e in stack.events("refused-token")), 30
    )
    token_file.write_text(f"SLURM_JWT={real}\n")
    await stack.wait_pod("refused-token", bound, timeout=60)

    stack.create_pod(
        "refused-by-slurm", annotations={keys.SLURMJOB_PREFIX + "partition": "no-such-partition"}
    )
    # Told on the pod (a Warning Event and its condition); the placement ends and lets go of it.
    await stack.kube.wait_for_async(
        lambda: any(e["type"] == "Warning" for e in stack.events("refused-by-slurm")), 30
    )
    await stack.wait_pod("refused-by-slurm", finished_cleanly)

    status = await slurm_bridge(
        stack,
        "status",
        f"{stack.namespace}/refused-by-slurm",
        "--kubeconfig",
        str(stack.kubeconfig),
        "--json",
    )
    for name in ("fine", "refused-token"):
        stack.kube.set_pod_phase(stack.namespace, name, "Succeeded")
        await stack.wait_pod(name, finished_cleanly)

    places = {
        **await workflow_histories(stack.temporal),
        **log_texts(caplog.records),
        **kube_texts(stack),
        "slurm-bridge status": json.dumps(status),
    }
    kinds = [name.split(" ", 1)[0] for name in places]
    counts = {kind: kinds.count(kind) for kind in sorted(set(kinds))}
    print(counts)
    assert counts["history"] >= 3, counts  # the three placements at least
    assert counts["Event"] >= 3, counts
    assert counts["log"] >= 50, counts
    # The search saw the failures: the token refusal in a history and the log, Slurm's
    # refusal of the job on the pod (so a token in those messages would have been found).
    assert [p for p in found_in(REFUSED, places) if p.startswith("history")], "no token failure seen"
    assert [p for p in found_in(REFUSED, places) if p.startswith("log")]
    assert [p for p in found_in("Invalid partition name", places) if p.startswith("Event")]
    assert found_in(real, places) == []
    assert found_in(bad, places) == []
