#!/usr/bin/env bash
# Start munged, slurmctld and slurmrestd (JWT), create the external nodes named
# in SLURM_NODES, and keep a fresh JWT in SLURM_TOKEN_FILE for slurm-bridge.
# The slurm.conf and the daemon commands are those of hack/slurm-sid.sh, which
# the end-to-end tests prove against the same Debian packages.
#
# Environment:
#   SLURM_NODES            space-separated external nodes to create (names of
#                          Kubernetes nodes), e.g. "kind-worker kind-worker2"
#   SLURM_NODE_CPUS        CPUs of each (4); SLURM_NODE_MEMORY_MB memory (8000)
#   SLURM_REST_PORT        slurmrestd port (6820), on every address
#   SLURM_TOKEN_FILE       where the JWT goes (/var/run/secrets/slurm/auth-token)
#   SLURM_TOKEN_UID/GID    owner of that file (10001, the slurm-bridge image's
#                          user); readable by that user and group only
#   SLURM_TOKEN_LIFESPAN   seconds a token lives (172800); a new one is written
#                          every SLURM_TOKEN_REFRESH seconds (43200): the bridge
#                          re-reads the file on every request
set -euo pipefail

NODES=${SLURM_NODES:-}
CPUS=${SLURM_NODE_CPUS:-4}
MEMORY=${SLURM_NODE_MEMORY_MB:-8000}
REST_PORT=${SLURM_REST_PORT:-6820}
TOKEN_FILE=${SLURM_TOKEN_FILE:-/var/run/secrets/slurm/auth-token}
TOKEN_UID=${SLURM_TOKEN_UID:-10001}
TOKEN_GID=${SLURM_TOKEN_GID:-$TOKEN_UID}
TOKEN_LIFESPAN=${SLURM_TOKEN_LIFESPAN:-172800}
TOKEN_REFRESH=${SLURM_TOKEN_REFRESH:-43200}
STATE=/var/lib/slurm
KEYS=$STATE/keys

say() { echo "[slurm] $*" >&2; }

mkdir -p /run/slurm /run/munge /var/log/slurm /var/log/munge "$STATE/slurmctld" "$KEYS"
chown slurm:slurm /run/slurm /var/log/slurm "$STATE/slurmctld"
chown munge:munge /run/munge /var/log/munge /etc/munge

# Keys are made once and kept in the state volume: tokens minted before a
# restart stay valid, and saved jobs stay readable.
[ -s "$KEYS/munge.key" ] || head -c 128 /dev/urandom >"$KEYS/munge.key"
[ -s "$KEYS/jwt_hs256.key" ] || head -c 32 /dev/urandom >"$KEYS/jwt_hs256.key"
install -o munge -g munge -m 0400 "$KEYS/munge.key" /etc/munge/munge.key
install -o slurm -g slurm -m 0600 "$KEYS/jwt_hs256.key" /etc/slurm/jwt_hs256.key

cat >/etc/slurm/slurm.conf <<CONF
# Written by hack/slurm/entrypoint.sh at every start
ClusterName=bridge
SlurmctldHost=$(hostname -s)(127.0.0.1)
CommunicationParameters=NoCtldInAddrAny
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key
StateSaveLocation=$STATE/slurmctld
SlurmctldPidFile=/run/slurm/slurmctld.pid
# verbose + DebugFlags=HetJob: the backfill scheduler logs the jobs it starts too
# ("sched/backfill: _start_job: HETJOB: Started JobId=..."); see docs/slurm-testbed.md.
SlurmctldDebug=verbose
MailProg=/bin/true
SchedulerType=sched/backfill
# External jobs end without an epilog, which is what normally triggers a
# scheduling pass; without a 1 s main and backfill interval a pending job
# waits up to a minute after the job before it ends.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MaxNodeCount=4096
ReturnToService=2
MinJobAge=300
MaxJobCount=100000
LogTimeFormat=iso8601_ms
DebugFlags=HetJob
GresTypes=gpu
# Preemption by partition tier: a bridge-high job cancels bridge-low jobs at once
# (no GraceTime: external nodes have no slurmd to signal). slurm-bridge never
# preempts nor is preempted.
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
# Any node with the feature slurm-bridge joins the default bridge partition.
NodeSet=bridge_nodes Feature=slurm-bridge
PartitionName=slurm-bridge Nodes=bridge_nodes Default=YES MaxTime=INFINITE State=UP PreemptMode=OFF
PartitionName=bridge-low Nodes=bridge_nodes MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL
PartitionName=bridge-high Nodes=bridge_nodes MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
CONF

# GPUs need device files, or Slurm drops them and refuses a node with Gres=gpu:N.
# Placeholders for up to 128 GPUs a node (never opened: there is no slurmd).
cat >/etc/slurm/gres.conf <<CONF
# Written by hack/slurm/entrypoint.sh at every start
Name=gpu File=/dev/fake-gpu[0-127]
CONF

shutdown() { # exit status
  say "stopping"
  [ -n "${refresh_pid:-}" ] && kill "$refresh_pid" 2>/dev/null || true
  # slurmrestd first (INT), then slurmctld (TERM: it saves its state), then munged.
  [ -n "${rest_pid:-}" ] && kill -INT "$rest_pid" 2>/dev/null || true
  [ -n "${ctld_pid:-}" ] && kill -TERM "$ctld_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  [ -s /run/munge/munged.pid ] && kill -TERM "$(cat /run/munge/munged.pid)" 2>/dev/null || true
  exit "$1"
}
trap "shutdown 0" TERM INT

rm -f /run/munge/munged.pid /run/slurm/slurmctld.pid
runuser -u munge -- munged --pid-file=/run/munge/munged.pid

# -D: foreground, so its log goes to the container's output.
slurmctld -D &
ctld_pid=$!
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
scontrol ping >/dev/null 2>&1 || { say "slurmctld did not start"; exit 1; }
say "slurmctld started"

for node in $NODES; do
  grep -qE "[[:space:]]$node([[:space:]]|\$)" /etc/hosts || echo "127.0.0.1 $node" >>/etc/hosts
  scontrol show node "$node" >/dev/null 2>&1 ||
    scontrol create "NodeName=$node" State=EXTERNAL Sockets=1 "CoresPerSocket=$CPUS" ThreadsPerCore=1 \
      "CPUs=$CPUS" "RealMemory=$MEMORY" Features=slurm-bridge
  say "external node $node"
done

# rest_auth/jwt needs SLURM_JWT=daemon in slurmrestd's environment.
SLURM_JWT=daemon setpriv --reuid=slurmrestd --regid=slurmrestd --init-groups \
  slurmrestd -a rest_auth/jwt "0.0.0.0:$REST_PORT" &
rest_pid=$!
say "slurmrestd on port $REST_PORT"

mint_token() {
  # The token goes to a file only, never to the log. It belongs to SlurmUser,
  # an operator token: node create/update/delete need one.
  local dir tmp
  dir=$(dirname "$TOKEN_FILE")
  mkdir -p "$dir"
  tmp=$(mktemp "$dir/.auth-token.XXXXXX")
  scontrol token username=slurm "lifespan=$TOKEN_LIFESPAN" | sed 's/^SLURM_JWT=//' >"$tmp"
  chown "$TOKEN_UID:$TOKEN_GID" "$tmp"
  chmod 0440 "$tmp"
  mv -f "$tmp" "$TOKEN_FILE"  # atomic: a reader sees the old or the new token
}
mint_token
say "token written to $TOKEN_FILE (refreshed every ${TOKEN_REFRESH}s)"
( while sleep "$TOKEN_REFRESH"; do mint_token || say "token refresh failed"; done ) &
refresh_pid=$!

# Whichever daemon stops first ends the container, with a failure status so
# that the restart policy brings it back.
wait -n "$ctld_pid" "$rest_pid" || true
say "a daemon stopped unexpectedly"
shutdown 1
