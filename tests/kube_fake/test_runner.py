"""Behaviour 12: ``python -m testbed.kube_fake`` serves until SIGTERM (the fake's own runner)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import kubernetes.client

from testbed.kube_fake.builders import Client, kube_config

ROOT = Path(__file__).resolve().parents[2]


def test_standalone_runner(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testbed.kube_fake",
            "--port",
            "0",
            "--kubeconfig",
            str(kubeconfig),
            "--kubelet",
            "--nodes",
            "node-1,node-2",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server is ready
        match = re.fullmatch(r"kube_fake serving at (http://127\.0\.0\.1:\d+)\n", line)
        assert match, line
        cfg: Client = kubernetes.client.Configuration()
        kube_config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        assert cfg.host == match.group(1)
        with kubernetes.client.ApiClient(cfg) as client:
            nodes: Client = kubernetes.client.CoreV1Api(client).list_node().items
        assert [n.metadata.name for n in nodes] == ["node-1", "node-2"]
        node = nodes[0]
        assert node.status.allocatable["cpu"] == "4"
        assert node.status.allocatable["memory"] == "8000Mi"
        assert [(c.type, c.status) for c in node.status.conditions] == [("Ready", "True")]
        assert ("InternalIP", "127.0.0.1") in [(a.type, a.address) for a in node.status.addresses]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
