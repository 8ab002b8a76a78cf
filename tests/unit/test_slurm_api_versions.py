"""v0.0.44 and v0.0.45 as slurmrestd 26.05 documents them: the bridge may speak either.

The bridge builds and reads v0.0.44 models (bridge/slurm_api) and sends them to
the version SLURM_API_VERSION names. That is sound only while every field it
sends or reads means the same in both. This test walks the two documents the
models are generated from, for every operation the client calls, and checks
that what the bridge sends is the same in both (v0.0.45 may only add enum
values), that every field whose type changed is adapted before parsing
(bridge/slurm_api/versions.py: the models validate every field they know),
and that the other differences (fields v0.0.45 dropped or deprecated,
enum values it dropped or added) are exactly the reviewed ones, none of which
the bridge reads. Fields only v0.0.45 has are ignored by the models. A
regenerated document with any other change fails here until someone looks.
"""

import json
import re
from pathlib import Path
from typing import Any

from bridge.models import JobDescription
from bridge.slurm_api.v0044 import V0044OpenapiPartitionResp
from bridge.slurm_api.versions import CHANGED_IN_V0045, as_v0044

ROOT = Path(__file__).resolve().parents[2]
SPECS = {v: json.loads((ROOT / f"bridge/slurm_api/openapi-v0.0.{v}.json").read_text()) for v in (44, 45)}

# What clients/slurm_client.py calls (worker/doctor/ reaches Slurm only through it).
OPERATIONS = [
    ("post", "/job/submit"),
    ("post", "/job/{job_id}"),
    ("get", "/job/{job_id}"),
    ("delete", "/job/{job_id}"),
    ("get", "/jobs/"),
    ("get", "/jobs/state/"),
    ("get", "/resources/{job_id}"),
    ("get", "/nodes/"),
    ("get", "/node/{node_name}"),
    ("post", "/node/{node_name}"),
    ("delete", "/node/{node_name}"),
    ("post", "/new/node/"),
    ("get", "/partition/{partition_name}"),
    ("get", "/partitions/"),
    ("get", "/ping/"),
    ("get", "/diag/"),
]


def schemas_used(version: int) -> dict[str, Any]:
    """Every schema reachable from the operations, by version-free name."""
    spec = SPECS[version]
    schemas = spec["components"]["schemas"]
    found: dict[str, Any] = {}
    pending = []
    for method, path in OPERATIONS:
        operation = spec["paths"][f"/slurm/v0.0.{version}{path}"][method]
        pending += re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(operation))
    while pending:
        name = pending.pop()
        plain = name.removeprefix(f"v0.0.{version}_")
        if plain in found:
            continue
        found[plain] = schemas[name]
        pending += re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(schemas[name]))
    return found


def fields(schema: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted field path → its schema with the version taken out of references (inline objects walked)."""
    flat: dict[str, Any] = {}
    for name, field in (schema.get("properties") or {}).items():
        path = f"{prefix}{name}"
        flat[path] = json.loads(re.sub(r"v0\.0\.4[45]_", "", json.dumps(field)))
        if field.get("type") == "object":
            flat.update(fields(field, path + "."))
    return flat


def differences() -> set[tuple[str, str, str]]:
    """(schema, field, kind) for every difference between the two versions."""
    old, new = schemas_used(44), schemas_used(45)
    assert set(old) <= set(new), "v0.0.45 lacks a schema the bridge uses"
    found = set()
    for schema in old:
        before, after = fields(old[schema]), fields(new[schema])
        for field in after.keys() - before.keys():
            found.add((schema, field, "added"))
        for field in before.keys() - after.keys():
            found.add((schema, field, "removed"))
        for field in before.keys() & after.keys():
            a, b = before[field], after[field]
            if a == b:
                continue
            kinds = []
            enum_a, enum_b = _enum(a), _enum(b)
            if enum_a != enum_b:
                kinds.append("enum grew" if enum_a <= enum_b else "enum lost values")
            if _strip(a) != _strip(b):
                kinds.append("deprecated" if b.get("deprecated") else "changed")
            found.add((schema, field, "+".join(kinds) or "described"))
    return found


def _enum(field: Any) -> set[str]:
    return set((field.get("items") or field).get("enum") or [])


def _strip(field: Any) -> Any:
    """The field without descriptions and enums (nested objects' field lists kept: walked separately)."""
    if isinstance(field, dict):
        return {
            k: _strip(v)
            for k, v in field.items()
            if k not in ("description", "enum") and not (k == "properties" and field.get("type") == "object")
        }
    if isinstance(field, list):
        return [_strip(v) for v in field]
    return field


# The fields the bridge sets in each request body (bridge/models.py, activities/nodes.py, slurm_client.py).
SENT = {
    # `components` is the bridge's own: each component is a job_desc_msg of its own, sent in `jobs`.
    "job_desc_msg": set(JobDescription.model_fields) - {"components"},
    "update_node_msg": {"state", "reason", "comment", "gres", "topology_str", "address"},
    "openapi_create_node_req": {"node_conf"},
    "job_submit_req": {"job", "jobs"},
}


def test_what_the_bridge_sends_means_the_same_in_both() -> None:
    old, new = schemas_used(44), schemas_used(45)
    for schema, names in SENT.items():
        before, after = fields(old[schema]), fields(new[schema])
        for name in names:
            assert name in before, f"{schema}.{name} is not in v0.0.44: SENT is out of date"
            assert name in after, f"v0.0.45 dropped {schema}.{name}, which the bridge sends"
            assert _strip(before[name]) == _strip(after[name]), f"{schema}.{name} changed"
            assert not after[name].get("deprecated"), f"{schema}.{name} is deprecated in v0.0.45"
            # Values the bridge sends under v0.0.44 stay valid: v0.0.45 may only add some.
            assert _enum(before[name]) <= _enum(after[name]), f"{schema}.{name} lost enum values"


def test_every_field_whose_type_changed_is_adapted() -> None:
    # The models validate every field they know, read or not: a changed type fails a whole answer.
    changed = {(schema, field) for schema, field, kind in differences() if "changed" in kind.split("+")}
    assert changed == CHANGED_IN_V0045
    served = {"partitions": [{"name": "p", "cpus": {"task_binding": ["CPU_BIND_TO_CORES"], "total": 4}}]}
    [partition] = V0044OpenapiPartitionResp.model_validate(as_v0044(served)).partitions or []
    assert partition.name == "p"
    assert partition.cpus is not None
    assert (partition.cpus.total, partition.cpus.task_binding) == (4, None)


def test_the_differences_are_the_reviewed_ones() -> None:
    # Reviewed against slurmrestd 26.05.5: the bridge neither sends nor reads any of these fields
    # (it reads ping hostname/responding, job ids, states, reasons, nodes, comments, resources;
    # node names, states, addresses, gres, comments; partition nodes). Fields only v0.0.45 has
    # and reworded descriptions are left out: the models ignore the one, the other changes nothing.
    # A new slurmrestd document that differs otherwise is looked at again before it is used.
    reviewed = {
        ("controller_ping", "mode", "removed"),
        ("controller_ping", "pinged", "removed"),
        ("job_desc_msg", "cpu_binding_flags", "enum lost values"),  # never sent
        ("job_desc_msg", "flags", "enum grew"),  # EXTERNAL_JOB in both
        ("job_desc_msg", "power_flags", "removed"),
        ("job_info", "flags", "enum grew"),
        ("job_info", "power", "removed"),
        ("job_info", "power.flags", "removed"),
        (
            "job_info",
            "shared",
            "deprecated",
        ),  # read nowhere (job_desc_msg.shared, which is sent, is unchanged)
        ("job_res", "select_type", "enum lost values"),
        ("node", "external_sensors", "removed"),
        ("node", "next_state_after_reboot", "enum grew"),
        ("node", "power", "removed"),
        ("node", "state", "enum grew"),  # POWER_DOWN_ASAP/FORCE: states the node rules do not test for
        ("node", "tres_weighted", "removed"),
        ("partition_info", "cpus.task_binding", "enum grew+changed"),  # dropped: bridge/slurm_api/versions.py
        ("partition_info", "defaults.memory_per_cpu", "deprecated"),
        ("partition_info", "maximums.memory_per_cpu", "deprecated"),
        ("partition_info", "maximums.oversubscribe.flags", "deprecated"),
        ("partition_info", "maximums.oversubscribe.jobs", "deprecated"),
        ("partition_info", "maximums.shares", "deprecated"),
        ("partition_info", "select_type", "enum lost values"),
        ("stats_msg", "parts_packed", "removed"),
        ("update_node_msg", "state", "enum grew"),  # DRAIN/UNDRAIN in both
    }
    assert {d for d in differences() if d[2] not in ("added", "described")} == reviewed
