"""`bridge.grouping.Reader` over the Kubernetes API: how the worker reads owners and group members."""

from activities.kube_client import Json, KubeClient, KubeError, KubeNotFound, api_path
from bridge.grouping import Kind


class KubeReader:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    async def get(self, kind: Kind, namespace: str, name: str) -> Json | None:
        path = api_path(kind.plural, namespace=namespace, name=name, group=kind.group, version=kind.version)
        try:
            return await self.kube.request("GET", path)
        except KubeNotFound:
            return None
        except KubeError as error:
            if error.status == 403:
                raise PermissionError(error.message) from error
            raise

    async def list_pods(self, namespace: str, label_selector: str) -> list[Json]:
        query = {"labelSelector": label_selector} if label_selector else None
        listed = await self.kube.request("GET", api_path("pods", namespace=namespace), query=query)
        return list(listed.get("items", []))
