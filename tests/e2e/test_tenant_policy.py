"""The worker enforces the tenant policy (TENANT_POLICY_FILE) when it builds the job, on real Slurm.

The webhook denies at admission (tests/webhook/test_tenant_policy.py); a pod that got past it
(admitted before the policy, or while the webhook was down or bypassed) is refused at
translation: nothing reaches Slurm, the pod says which rule, the placement fails for good.
"""

from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from bridge import keys
from tests.e2e.conftest import StackFactory
from tests.e2e.harness import Pod, bound, finished_cleanly, job_id_of

pytestmark = pytest.mark.slurm


def scheduled_condition(pod: Pod | None) -> dict[str, Any] | None:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "PodScheduled"), None)


async def test_the_worker_denies_what_the_namespace_policy_forbids_and_tells_the_pod(
    make_stack: StackFactory, tmp_path: Path
) -> None:
    policy = tmp_path / "tenant-policy.yaml"
    stack = await make_stack(nodes=1, bridge=False, tenant_policy_file=str(policy))
    # The namespace (the test's own) may charge team-a only, on this test's partition only.
    policy.write_text(
        yaml.safe_dump(
            {
                "namespaces": {
                    stack.namespace: {
                        "allowed_accounts": ["team-a"],
                        "allowed_partitions": [stack.partition.name],
                    }
                }
            }
        )
    )
    await stack.start_bridge()
    rule = f'{keys.SLURMJOB_PREFIX}account="team-b": namespace {stack.namespace} may use accounts team-a'

    created = stack.create_pod("thief", annotations={keys.SLURMJOB_PREFIX + "account": "team-b"})
    pod = await stack.wait_pod(
        "thief", lambda p: (scheduled_condition(p) or {}).get("reason") == "InvalidPod"
    )
    condition = scheduled_condition(pod) or {}
    assert condition["status"] == "False"
    assert rule in condition["message"]
    warnings = await stack.kube.wait_for_async(
        lambda: [e for e in stack.events("thief") if e["reason"] == "InvalidPod"]
    )
    assert [e["type"] for e in warnings] == ["Warning"]
    assert rule in warnings[0]["message"]

    with pytest.raises(WorkflowFailureError) as failure:
        await stack.handle(created).result()
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError)
    assert cause.type == "InvalidPod"
    assert rule in cause.message
    assert cause.non_retryable

    # Nothing was submitted: no job in all of Slurm names the pod, none is labelled on it.
    jobs, _ = await stack.slurm.list_jobs()
    assert not [j for j in jobs if f"{stack.namespace}/thief" in (j.admin_comment or "")]
    await stack.wait_pod("thief", finished_cleanly)  # the finalizer is gone: the user may delete it
    assert (bound(stack.pod("thief")), job_id_of(stack.pod("thief"))) == (None, None)

    # A pod within the policy (SLURM_PARTITION is an allowed partition) is placed as usual.
    stack.create_pod("honest")
    honest = await stack.wait_pod("honest", bound)
    job = (await stack.slurm.get_job(job_id_of(honest) or 0)).model_dump(mode="json")
    assert job["partition"] == stack.partition.name
    stack.kube.set_pod_phase(stack.namespace, "honest", "Succeeded")
    await stack.wait_pod("honest", finished_cleanly)
