"""values.schema.json types every value of values.yaml, and README.md documents it."""

import json
import re
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import jsonschema  # type: ignore[import-untyped,unused-ignore]
import pytest
import yaml

from tests.deploy.chart import CHART, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def test_schema_is_a_valid_draft_7_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)


def test_values_yaml_validates() -> None:
    jsonschema.Draft7Validator(SCHEMA).validate(VALUES)
    # And as Helm itself checks it at install time.
    with helm.Chart.load(str(CHART)) as chart:
        chart.validate_schema(VALUES)


def _documented(value: Any, schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted key, its schema) for every value a user sets; Kubernetes objects
    (resources, securityContext, affinity, ...) are one value each."""
    if isinstance(value, dict) and value and "properties" in schema:
        for key, item in value.items():
            assert key in schema["properties"], f"{path}.{key} is not in values.schema.json"
            yield from _documented(item, schema["properties"][key], f"{path}.{key}" if path else key)
    else:
        yield path, schema


def test_every_value_is_in_the_schema_with_a_description() -> None:
    def strict(schema: dict[str, Any], path: list[str]) -> None:
        # An unknown key must be an error everywhere the chart defines the keys.
        if "properties" in schema:
            assert schema.get("additionalProperties") is False, f"{'.'.join(path)} accepts unknown keys"
            for key, sub in schema["properties"].items():
                strict(sub, [*path, key])

    strict(SCHEMA, [])
    for key, schema in _documented(VALUES, SCHEMA):
        assert schema.get("description"), f"{key} has no description in values.schema.json"


def test_every_value_is_documented_in_the_readme() -> None:
    readme = (CHART / "README.md").read_text()
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", readme, flags=re.MULTILINE))
    keys = {key for key, _ in _documented(VALUES, SCHEMA)}
    assert sorted(keys - documented) == [], "values missing from helm/slurm-bridge/README.md"
    assert sorted(documented - keys) == [], "README.md documents values that do not exist"


BAD_VALUES = {
    "zero worker replicas": {"worker": {"replicas": 0}},
    "replicas as a string": {"worker": {"replicas": "2"}},
    "unknown failure policy": {"webhook": {"failurePolicy": "Sometimes"}},
    "timeout above the API server's 30 s": {"webhook": {"timeoutSeconds": 60}},
    "unknown top-level key": {"replicaCount": 2},
    "typo in a nested key": {"slurm": {"restURL": "http://slurm:6820"}},
    "REST URL without a scheme": {"slurm": {"restUrl": "slurm-restapi:6820"}},
    "Temporal address without a port": {"temporal": {"address": "temporal-frontend"}},
    "bad pull policy": {"image": {"pullPolicy": "Sometimes"}},
    "namespace name with capitals": {"webhook": {"managedNamespaces": ["Slurm"]}},
    "unknown selector operator": {
        "webhook": {"managedNamespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Has"}]}}
    },
    # The selector becomes a namespaceSelector, which the API server refuses in these shapes.
    "In without values": {
        "webhook": {"managedNamespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}
    },
    "Exists with values": {
        "webhook": {
            "managedNamespaceSelector": {
                "matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]
            }
        }
    },
    "no cert-manager and no CA bundle": {"webhook": {"certManager": {"enabled": False}}},
    "memory that is not a quantity": {"worker": {"resources": {"limits": {"memory": "lots"}}}},
    "log level": {"worker": {"logLevel": "verbose"}},
    # A DeviceClass is CPUs or a GRES, never both or neither; the GRES as Slurm can be asked for it.
    "device class both cpu and gres": {
        "dra": {"deviceClasses": [{"name": "dra.cpu", "slurm": "cpu", "gres": {"name": "gpu"}}]}
    },
    "device class with no Slurm meaning": {"dra": {"deviceClasses": [{"name": "dra.cpu"}]}},
    "device class whose slurm is not cpu": {"dra": {"deviceClasses": [{"name": "a.b", "slurm": "gpu"}]}},
    "device class as a GRES named cpu": {
        "dra": {"deviceClasses": [{"name": "a.b", "gres": {"name": "cpu"}}]}
    },
    "GRES type with a colon": {
        "dra": {"deviceClasses": [{"name": "a.b", "gres": {"name": "gpu", "type": "h100:2"}}]}
    },
    "device class name with capitals": {"dra": {"deviceClasses": [{"name": "GPU", "gres": {"name": "gpu"}}]}},
    "device class name too long for a resource name": {
        "dra": {"deviceClasses": [{"name": "a" * 64, "gres": {"name": "gpu"}}]}
    },
}


@pytest.mark.parametrize("bad", list(BAD_VALUES.values()), ids=list(BAD_VALUES))
def test_helm_rejects_a_bad_value(bad: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render(bad)


def test_a_good_override_renders() -> None:
    render({"worker": {"replicas": 2, "resources": {"limits": {"memory": "1Gi", "cpu": 2}}}})
