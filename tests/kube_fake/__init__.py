"""Behaviour tests of the fake Kubernetes API server (testbed/kube_fake); those that take
``kube_api`` run against the real kube-apiserver (testbed/kube_real) too."""
