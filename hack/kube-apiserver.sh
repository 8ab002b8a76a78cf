#!/usr/bin/env bash
# A real kube-apiserver + etcd on loopback, for tests: the reference Kubernetes.
# Nothing else of Kubernetes runs (no kubelet, controller-manager or scheduler):
# tests that need one play it and say so (testbed/kube_real/).
#
#   hack/kube-apiserver.sh start DIR [--port P] [--etcd-port P] [--owner PID]
#        start an instance whose state (etcd data, logs, kubeconfig) lives in DIR;
#        prints KUBECONFIG=, K8S_API=, K8S_CA=, K8S_WEBHOOK_CERT=, K8S_WEBHOOK_KEY=,
#        K8S_ADMIN_TOKEN= lines (also written to DIR/env). With --owner, the
#        instance belongs to that process: a later `start` stops instances whose
#        owner has died (a killed test session leaves nothing running for long).
#   hack/kube-apiserver.sh stop DIR      stop the instance started in DIR (by its PIDs)
#   hack/kube-apiserver.sh assets        exit 0 when the binaries are there; print their folder
#
# The binaries are found the way envtest finds its assets: the folder named by
# SLURM_BRIDGE_K8S_ASSETS (kube-apiserver.xz, etcd.xz, SHA256SUMS), by default
# ../shared/k8s beside this repository when present. They are unpacked once and
# checked against SHA256SUMS, with a CA and certificates, under
# SLURM_BRIDGE_K8S_CACHE (default /var/cache/slurm-bridge/k8s): outside the repo.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ASSETS=${SLURM_BRIDGE_K8S_ASSETS:-$REPO/../shared/k8s}
CACHE=${SLURM_BRIDGE_K8S_CACHE:-/var/cache/slurm-bridge/k8s}
BIN=$CACHE/bin
PKI=$CACHE/pki

say() { echo "[kube-apiserver] $*" >&2; }
die() { say "error: $*"; exit 1; }

have_assets() { [ -r "$ASSETS/kube-apiserver.xz" ] && [ -r "$ASSETS/etcd.xz" ] && [ -r "$ASSETS/SHA256SUMS" ]; }

# Same binary still running under that pid (pids are reused).
alive() { # PIDFILE BINARY
  [ -s "$1" ] || return 1
  local pid; pid=$(cat "$1")
  [ -r "/proc/$pid/cmdline" ] && [ "$(tr '\0' '\n' < "/proc/$pid/cmdline" | head -n1)" = "$2" ]
}

stop_instance() { # DIR
  local dir=$1 name pid
  for name in kube-apiserver etcd; do
    if alive "$dir/$name.pid" "$BIN/$name"; then
      pid=$(cat "$dir/$name.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/$name.pid"
  done
}

unpack() {
  mkdir -p "$BIN"
  exec 9>"$CACHE/.lock"
  flock 9
  local b
  for b in kube-apiserver etcd; do
    if ! (cd "$BIN" && grep " $b\$" "$ASSETS/SHA256SUMS" | sha256sum -c --status 2>/dev/null); then
      say "unpacking $b from $ASSETS"
      xz -dc "$ASSETS/$b.xz" > "$BIN/$b.tmp"
      chmod 0755 "$BIN/$b.tmp"
      mv "$BIN/$b.tmp" "$BIN/$b"
      (cd "$BIN" && grep " $b\$" "$ASSETS/SHA256SUMS" | sha256sum -c --status) || die "checksum mismatch: $b"
    fi
  done
  [ -s "$PKI/webhook.crt" ] || make_pki
  flock -u 9
}

# A CA that signs the API server's serving certificate, one for webhooks the API
# server calls on loopback, and the key pair that signs ServiceAccount tokens.
make_pki() {
  say "making certificates in $PKI"
  mkdir -p "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=slurm-bridge-test-ca \
    -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  local name san
  for name in apiserver webhook; do
    san="IP:127.0.0.1,DNS:localhost"
    [ "$name" = apiserver ] && san="$san,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$name" -keyout "$PKI/$name.key" -out "$PKI/$name.csr" 2>/dev/null
    printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$san" > "$PKI/$name.ext"
    openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
      -days 3650 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  done
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  chmod 0600 "$PKI"/*.key
}

# Instances whose owning process is gone (a test session that was killed).
reap_orphans() {
  local owner dir
  for owner in "$CACHE"/instances/*/owner; do
    [ -e "$owner" ] || continue
    dir=$(dirname "$owner")
    if ! kill -0 "$(cat "$owner")" 2>/dev/null; then
      say "stopping the instance in $dir (its owner $(cat "$owner") is gone)"
      stop_instance "$dir"
      rm -rf "$dir"
    fi
  done
}

start() {
  local dir=$1; shift
  local port=16443 etcd_port=12379 owner=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port=$2; shift 2 ;;
      --etcd-port) etcd_port=$2; shift 2 ;;
      --owner) owner=$2; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  have_assets || die "no kube-apiserver binaries in $ASSETS (set SLURM_BRIDGE_K8S_ASSETS)"
  unpack
  reap_orphans
  mkdir -p "$dir"
  [ -z "$owner" ] || echo "$owner" > "$dir/owner"
  local token api=https://127.0.0.1:$port
  [ -s "$dir/tokens.csv" ] || echo "$(openssl rand -hex 24),admin,admin,system:masters" > "$dir/tokens.csv"
  chmod 0600 "$dir/tokens.csv"
  token=$(cut -d, -f1 "$dir/tokens.csv")
  cat > "$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "$api", certificate-authority: "$PKI/ca.crt"}
users:
- name: admin
  user: {token: "$token"}
contexts:
- name: test
  context: {cluster: test, user: admin, namespace: default}
current-context: test
EOF
  if ! alive "$dir/etcd.pid" "$BIN/etcd"; then
    # --unsafe-no-fsync: test data, and fsync is most of etcd's latency on a shared disk.
    setsid "$BIN/etcd" --name test --data-dir "$dir/etcd" \
      --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
      --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
      --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
      --initial-cluster "test=http://127.0.0.1:$((etcd_port + 1))" --unsafe-no-fsync \
      > "$dir/etcd.log" 2>&1 < /dev/null 9>&- &
    echo $! > "$dir/etcd.pid"
  fi
  # Every request's outcome, one JSON line each: tests check that the bridge's account was never
  # refused (testbed/kube_real/apiserver.py, refused()).
  printf '%s\n' 'apiVersion: audit.k8s.io/v1' 'kind: Policy' 'omitStages: [RequestReceived]' 'rules:' \
    '- level: Metadata' > "$dir/audit-policy.yaml"
  if ! alive "$dir/kube-apiserver.pid" "$BIN/kube-apiserver"; then
    setsid "$BIN/kube-apiserver" --audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/audit.log" \
      --audit-log-maxsize=500 --bind-address=127.0.0.1 --advertise-address=127.0.0.1 \
      --secure-port="$port" --etcd-servers="http://127.0.0.1:$etcd_port" \
      --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
      --client-ca-file="$PKI/ca.crt" --cert-dir="$dir/certs" \
      --token-auth-file="$dir/tokens.csv" --authorization-mode=Node,RBAC \
      --service-account-issuer=https://kubernetes.default.svc \
      --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
      --service-cluster-ip-range=10.0.0.0/24 --endpoint-reconciler-type=none --allow-privileged=true \
      > "$dir/kube-apiserver.log" 2>&1 < /dev/null 9>&- &
    echo $! > "$dir/kube-apiserver.pid"
  fi
  local ok=""
  for _ in $(seq 1 240); do
    if curl -sf --max-time 2 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $token" "$api/readyz" 2>/dev/null \
      | grep -qx ok; then
      ok=1; break
    fi
    alive "$dir/kube-apiserver.pid" "$BIN/kube-apiserver" || { tail -20 "$dir/kube-apiserver.log" >&2; die "kube-apiserver exited"; }
    sleep 0.25
  done
  [ -n "$ok" ] || die "kube-apiserver not ready in 60 s; see $dir/kube-apiserver.log"
  {
    echo "KUBECONFIG=$dir/kubeconfig"
    echo "K8S_API=$api"
    echo "K8S_CA=$PKI/ca.crt"
    echo "K8S_WEBHOOK_CERT=$PKI/webhook.crt"
    echo "K8S_WEBHOOK_KEY=$PKI/webhook.key"
    echo "K8S_ADMIN_TOKEN=$token"
  } | tee "$dir/env"
}

case "${1:-}" in
  start) [ $# -ge 2 ] || die "usage: $0 start DIR [--port P] [--etcd-port P] [--owner PID]"; shift; start "$@" ;;
  stop) [ $# -ge 2 ] || die "usage: $0 stop DIR"; stop_instance "$2" ;;
  assets) have_assets || exit 1; (cd "$ASSETS" && pwd) ;;
  *) sed -n '2,19p' "$0" >&2; exit 2 ;;
esac
