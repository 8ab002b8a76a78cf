"""The test bed: the parts that tests, benchmarks and `./dev run` stand up around the bridge.

Never shipped: the image copies only the product's packages (Dockerfile, .dockerignore), and
the product never imports this package (the import contract in pyproject.toml).

* ``kube_fake``: a fake Kubernetes API server (``python -m testbed.kube_fake`` for `./dev run`
  and the benchmarks; in-process ``FakeKubeServer`` for tests);
* ``kube_real``: a real kube-apiserver + etcd on loopback (hack/kube-apiserver.sh) and the
  parts of Kubernetes a test plays beside it (kubelet, CRDs, a request-holding proxy);
* ``kube_backend``: the protocol both API servers answer, so one test body runs on either;
* ``slurm_bed``: the real Slurm in its chroot (hack/slurm-sid.sh): partitions, nodes, jobs;
* ``worker_env``: a worker's settings and environment pointed at the test bed;
* ``kill_points``: SIGKILL the worker process at one step of a placement, restart it, check;
* ``history_cost``: what a workflow execution cost Temporal, counted from its history.
* ``waiting``: the one helper that polls for a condition (``wait_until``, ``until``), where
  nothing sends an event to wait on instead.

Tests (tests/, bench/tests/), the benchmarks (bench/) and hack/dev_stack.py import it; it
imports the product where it plays a part of it (worker settings), never tests/ or bench/.
"""
