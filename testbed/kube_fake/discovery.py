"""Minimal discovery documents (/api, /apis, /apis/{g}, resource lists, /version)."""

from __future__ import annotations

from .resources import Registry, ResourceType
from .util import JSON

VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
VERSION_INFO: JSON = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.0-kube-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions(server_address: str) -> JSON:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group(name: str, versions: list[str]) -> JSON:
    gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}


def api_group_list(registry: Registry) -> JSON:
    groups = [_group(g, vs) for g, vs in sorted(registry.groups().items()) if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> JSON | None:
    versions = registry.groups().get(group)
    if not group or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(group, versions)}


def _resource(rt: ResourceType) -> JSON:
    doc: JSON = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": VERBS,
    }
    if rt.short_names:
        doc["shortNames"] = list(rt.short_names)
    return doc


def _sub(rt: ResourceType, sub: str, kind: str, verbs: list[str], group: str | None = None) -> JSON:
    doc: JSON = {"name": f"{rt.plural}/{sub}", "singularName": "", "namespaced": rt.namespaced, "kind": kind}
    if group is not None:
        doc.update(group=group, version="v1")
    doc["verbs"] = verbs
    return doc


def resource_list(registry: Registry, group: str, version: str) -> JSON | None:
    resources: list[JSON] = []
    for rt in sorted(registry.all(), key=lambda r: r.plural):
        if (rt.group, rt.version) != (group, version):
            continue
        resources.append(_resource(rt))
        if rt.status_subresource:
            resources.append(_sub(rt, "status", rt.kind, ["get", "patch", "update"]))
        if rt.key == ("", "pods"):
            resources.append(_sub(rt, "binding", "Binding", ["create"]))
            resources.append(_sub(rt, "eviction", "Eviction", ["create"], group="policy"))
    if not resources:
        return None
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
