"""The bind's listing of a node's pods on the real API server: consistent read or watch cache.

    python -m bench.kube_listing [--pods 10000] [--nodes 100] [--reads 40]

Every bind lists the pods on its node (those of an ended job may still hold it), with a field
selector on the node and a label selector on the Slurm job id. This stands up the real
kube-apiserver v1.28 + etcd (testbed/kube_real), creates `--pods` pods spread over `--nodes`
nodes, and times `--reads` such listings each way: with no resourceVersion (a consistent read,
which kube-apiserver answers from etcd, reading every pod) and with resourceVersion=0 (its watch
cache, which indexes pods by node). Nothing else runs beside it. Figures are printed, never
asserted; the instance is removed at the end.
"""

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

from bench.kube import KubeDriver, RealKube, pod_manifest
from bridge import keys

NAMESPACE = "kube-listing"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--reads", type=int, default=40, help="listings timed each way")
    args = parser.parse_args(argv)

    real = RealKube().start()
    try:
        driver = KubeDriver(real.endpoint)
        driver.create_namespace(NAMESPACE)
        for index in range(args.nodes):
            driver.create_node(f"node-{index}", 100, 100_000)

        def create(index: int) -> None:
            manifest = pod_manifest(NAMESPACE, f"pod-{index}")
            manifest["metadata"]["labels"] = {keys.LABEL_SLURM_JOB_ID: str(1000 + index)}
            manifest["spec"]["nodeName"] = f"node-{index % args.nodes}"
            driver.create_pod(manifest)

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, range(args.pods)))
        print(f"{args.pods:,} pods on {args.nodes} nodes, created in {time.monotonic() - started:.0f} s")

        connection = driver.connection(timeout=60)
        ways: tuple[tuple[str, dict[str, str]], ...] = (
            ("consistent read (no resourceVersion)", {}),
            ("watch cache (resourceVersion=0)", {"resourceVersion": "0"}),
        )
        for label, extra in ways:
            times: list[float] = []
            for read in range(args.reads):
                query = {
                    "fieldSelector": f"spec.nodeName=node-{read % args.nodes}",
                    "labelSelector": keys.LABEL_SLURM_JOB_ID,
                    **extra,
                }
                began = time.perf_counter()
                items = connection.call("GET", f"/api/v1/pods?{urlencode(query)}")["items"]
                times.append((time.perf_counter() - began) * 1000)
            times.sort()
            p90 = times[min(len(times) - 1, int(len(times) * 0.9))]
            print(
                f"{label:<38} p50 {statistics.median(times):7.1f} ms  p90 {p90:7.1f} ms  "
                f"max {times[-1]:7.1f} ms  ({len(items)} pods a node)"
            )
        connection.close()
    finally:
        real.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
