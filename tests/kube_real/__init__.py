"""Tests of the real kube-apiserver test bed (testbed/kube_real, hack/kube-apiserver.sh)."""
