"""Standalone fake apiserver for the local demo stack.

    python -m testbed.kube_fake --port 6443 --kubeconfig PATH [--kubelet] [--nodes node-1,node-2]

Prints one line ``kube_fake serving at <url>`` once it accepts connections,
then serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from .server import FakeKubeServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.kube_fake", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=6443, help="0 picks a free port")
    parser.add_argument("--kubeconfig", required=True, help="where to write a kubeconfig for this server")
    parser.add_argument("--kubelet", action="store_true", help="run the simulated kubelet")
    parser.add_argument("--nodes", default="", help="comma-separated Node objects to create (Ready)")
    parser.add_argument("--token", default=None, help="require this bearer token")
    parser.add_argument("--history-size", type=int, default=1000, help="watch event log length")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    server = FakeKubeServer(
        args.host, args.port, kubelet=args.kubelet, token=args.token, history_size=args.history_size
    )
    server.start()
    try:
        for name in filter(None, (n.strip() for n in args.nodes.split(","))):
            server.create_node(name)
        server.kubeconfig(args.kubeconfig)
        print(f"kube_fake serving at {server.url}", flush=True)
        while not stop.wait(3600):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
