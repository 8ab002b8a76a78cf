"""The toleration of node sync's managed-node taint: the webhook adds it, the bind step checks it.

Node sync taints every bridge node `slinky.slurm.net/managed-node=<scheduler>:NoExecute`, so
pods of other schedulers stay away; the bridge's own pods must tolerate it for good.
"""

from collections.abc import Mapping
from typing import Any

from bridge import keys


def managed_node_toleration(scheduler_name: str) -> dict[str, str]:
    """The toleration the webhook adds to the bridge's pods."""
    return {
        "key": keys.TAINT_MANAGED_NODE,
        "operator": "Equal",
        "value": scheduler_name,
        "effect": "NoExecute",
    }


def tolerates_managed_nodes(toleration: Any, scheduler_name: str) -> bool:
    """Does this toleration already let the pod stay on bridge nodes for good?

    A toleration with `tolerationSeconds` does not count: on a NoExecute taint
    it only delays the eviction.
    """
    if not isinstance(toleration, Mapping) or toleration.get("tolerationSeconds") is not None:
        return False
    if toleration.get("effect") not in (None, "", "NoExecute"):
        return False
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key") or ""
    if operator == "Exists":
        return key in ("", keys.TAINT_MANAGED_NODE)
    return (
        operator == "Equal" and key == keys.TAINT_MANAGED_NODE and toleration.get("value") == scheduler_name
    )
