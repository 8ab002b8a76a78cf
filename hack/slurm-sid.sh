#!/usr/bin/env bash
# Real Slurm (Debian sid packages: slurmctld + slurmrestd with JWT auth) on this
# machine, inside a debootstrapped sid chroot, for tests, CI and the local stack.
# External nodes need no slurmd, so a controller and the REST daemon are all
# that runs. The host stays untouched apart from the debootstrap package.
#
#   hack/slurm-sid.sh up [--fresh] [NODE...]   build once (cached), configure, start,
#                                              create NODEs as external nodes;
#                                              prints SLURM_REST_URL / SLURM_USER_NAME /
#                                              SLURM_JWT_FILE lines, then the foreign user's
#                                              SLURM_FOREIGN_USER_NAME / SLURM_FOREIGN_JWT_FILE
#                                              (also in $DIR/env)
#   hack/slurm-sid.sh down [--wipe]            stop the daemons, unmount
#   hack/slurm-sid.sh scontrol ARGS...         run scontrol inside the chroot
#   hack/slurm-sid.sh status                   exit 0 when slurmctld and slurmrestd answer
#
# Environment: SLURM_SID_DIR (default /var/cache/slurm-bridge/slurm-sid; outside any
# repository, survives reboots so the chroot is built once per machine),
# SLURM_REST_PORT (6820), SLURM_CTLD_PORT (6817). Needs root.
# Partitions, GPUs, preemption, the foreign user and measurements: docs/slurm-testbed.md.
set -euo pipefail

DIR=${SLURM_SID_DIR:-/var/cache/slurm-bridge/slurm-sid}
ROOT=$DIR/root
REST_PORT=${SLURM_REST_PORT:-6820}
CTLD_PORT=${SLURM_CTLD_PORT:-6817}
# A second, unprivileged Slurm user, for jobs that are not the bridge's ("foreign
# jobs"). Never let it signal another user's job: with accounting_storage/none
# that deadlocks slurmctld 26.05 (docs/slurm-testbed.md).
FOREIGN_USER=foreign
PACKAGES="slurmctld slurmrestd slurm-client slurm-wlm-basic-plugins slurm-wlm-jwt-plugin munge curl ca-certificates"
BUILT=$ROOT/.built

say() { echo "[slurm-sid] $*" >&2; }
die() { say "error: $*"; exit 1; }
inside() { chroot "$ROOT" "$@"; }

[ "$(id -u)" = 0 ] || die "must run as root (chroot, mounts)"
mkdir -p "$DIR"
# One caller at a time: parallel test sessions must not build or restart twice.
# Daemons are started with fd 9 closed, or they would hold the lock forever.
exec 9>"$DIR/.lock"
flock 9

debian_mirror() {
  local m=""
  [ -r /etc/apt/sources.list.d/debian.sources ] &&
    m=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
        /etc/apt/sources.list.d/debian.sources)
  [ -z "$m" ] && [ -r /etc/apt/sources.list ] &&
    m=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; exit } }' \
        /etc/apt/sources.list)
  [ -n "$m" ] || die "no Debian mirror in the host's apt sources"
  echo "$m"
}

mounted() { mountpoint -q "$1" 2>/dev/null; }
mount_fs() {
  mounted "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
  mounted "$ROOT/dev" || mount --bind /dev "$ROOT/dev"
}
unmount_fs() {
  local m
  for m in "$ROOT/dev" "$ROOT/proc"; do
    mounted "$m" && { umount "$m" 2>/dev/null || umount -l "$m"; }
  done
  return 0
}

build() {
  [ -f "$BUILT" ] && return 0
  unmount_fs
  rm -rf "$ROOT"
  command -v debootstrap >/dev/null || {
    say "installing debootstrap on the host"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
  local mirror; mirror=$(debian_mirror)
  say "building the sid chroot in $ROOT (once per machine, about 2 minutes)"
  debootstrap --variant=minbase sid "$ROOT" "$mirror" >"$DIR/build.log" 2>&1 ||
    { tail -20 "$DIR/build.log" >&2; die "debootstrap failed"; }
  # The mirror may serve a frozen snapshot whose Release file has expired.
  echo 'Acquire::Check-Valid-Until "false";' >"$ROOT/etc/apt/apt.conf.d/99no-valid-until"
  # Package scripts must not start daemons in the chroot; we start them ourselves.
  printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
  chmod +x "$ROOT/usr/sbin/policy-rc.d"
  mount_fs
  { inside apt-get update -qq &&
    inside env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $PACKAGES &&
    inside apt-get clean; } >>"$DIR/build.log" 2>&1 || { tail -20 "$DIR/build.log" >&2; die "apt-get in the chroot failed"; }
  inside useradd --system --no-create-home --shell /usr/sbin/nologin slurmrestd
  # Node names resolve from /etc/hosts only: an unknown name fails at once
  # instead of stalling slurmctld on DNS retries with its locks held.
  sed -i 's/^hosts:.*/hosts: files/' "$ROOT/etc/nsswitch.conf"
  inside dpkg-query -W -f '${Package} ${Version}\n' slurmctld slurmrestd >"$ROOT/.versions"
  touch "$BUILT"
  say "built: $(tr '\n' ' ' <"$ROOT/.versions")"
}

pid_of() { # pidfile exe-name...: print the pid only if it is our daemon in our chroot
  local file=$1 pid exe name; shift
  [ -s "$file" ] || return 1
  pid=$(tr -dc 0-9 <"$file")
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(readlink "/proc/$pid/root")" = "$ROOT" ] || return 1
  exe=$(basename "$(readlink "/proc/$pid/exe")")
  for name in "$@"; do [ "$exe" = "$name" ] && { echo "$pid"; return 0; }; done
  return 1
}

add_hosts() {
  local name
  touch "$ROOT/etc/hosts"
  for name in "$@"; do
    grep -qE "^127\.0\.0\.1([[:space:]].*)?[[:space:]]$name([[:space:]]|\$)" "$ROOT/etc/hosts" ||
      echo "127.0.0.1 $name" >>"$ROOT/etc/hosts"
  done
}

slurm_conf() {
  cat <<EOF
# Written by hack/slurm-sid.sh
ClusterName=bridge
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=$CTLD_PORT
CommunicationParameters=NoCtldInAddrAny
SlurmUser=slurm
AuthType=auth/munge
CredType=cred/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
# verbose + DebugFlags=HetJob: the backfill scheduler logs the jobs it starts too
# ("sched/backfill: _start_job: HETJOB: Started JobId=..."); see docs/slurm-testbed.md.
SlurmctldDebug=verbose
MailProg=/bin/true
SchedulerType=sched/backfill
# External jobs end without an epilog, which is what normally triggers a
# scheduling pass; without a 1 s main and backfill interval a pending job waits
# up to 60 s after the job before it is cancelled.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
# A site's size (bench/watcher.py, issue #24): 1,000 external nodes beside the tests' own, and
# 20,000 foreign plus 10,000 bridge jobs twice over, since ended jobs count until MinJobAge.
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
EOF
}

# Slurm drops a GPU without a device file ("Ignoring file-less GPU"), and then
# refuses to create a node with Gres=gpu:N. This line, for every node, gives up
# to 128 GPUs placeholder files (never opened: no slurmd runs); slurmctld takes
# the first N for a node with gpu:N and numbers them 0..N-1, so jobs get GPU
# indexes. The price: an existing node's GPU count cannot change (only to 0).
gres_conf() {
  cat <<GRES
# Written by hack/slurm-sid.sh
Name=gpu File=/dev/fake-gpu[0-127]
GRES
}

mint_token() { # user file
  # Renamed into place: sessions running meanwhile read the old token or the new
  # one, never an empty file (the token is minted again at every `up`).
  local tmp; tmp=$(mktemp "$2.XXXXXX")
  inside scontrol token "username=$1" lifespan=604800 | sed 's/^SLURM_JWT=//' >"$tmp"
  [ -s "$tmp" ] || { rm -f "$tmp"; die "scontrol token username=$1 printed nothing"; }
  mv -f "$tmp" "$2"
}

stop_daemon() { # label signal pidfile exe...
  local label=$1 sig=$2 file=$3 pid; shift 3
  pid=$(pid_of "$file" "$@") || { rm -f "$file"; return 0; }
  kill "-$sig" "$pid" 2>/dev/null || true
  for _ in $(seq 150); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  [ -d "/proc/$pid" ] && kill -KILL "$pid" 2>/dev/null
  rm -f "$file"
  say "$label stopped"
}

down() {
  [ -d "$ROOT" ] || return 0
  stop_daemon slurmrestd INT "$ROOT/run/slurm/slurmrestd.pid" slurmrestd
  stop_daemon slurmctld TERM "$ROOT/run/slurm/slurmctld.pid" slurmctld slurmctld-wlm
  stop_daemon munged TERM "$ROOT/run/munge/munged.pid" munged
  [ "${1:-}" = --wipe ] && rm -rf "$ROOT/var/lib/slurm/slurmctld/"*
  unmount_fs
}

up() {
  local fresh=0 nodes=() started_ctld=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --fresh) fresh=1 ;;
      -*) die "unknown option $1" ;;
      *) nodes+=("$1") ;;
    esac
    shift
  done
  build
  mount_fs
  mkdir -p "$ROOT/run/slurm" "$ROOT/run/munge" "$ROOT/var/lib/slurm/slurmctld" "$ROOT/var/log/slurm"
  inside chown slurm:slurm /run/slurm /var/lib/slurm/slurmctld /var/log/slurm
  inside chown munge:munge /run/munge /etc/munge
  [ -s "$ROOT/etc/munge/munge.key" ] || head -c 128 /dev/urandom >"$ROOT/etc/munge/munge.key"
  inside chown munge:munge /etc/munge/munge.key && chmod 0400 "$ROOT/etc/munge/munge.key"
  [ -s "$ROOT/etc/slurm/jwt_hs256.key" ] || head -c 32 /dev/urandom >"$ROOT/etc/slurm/jwt_hs256.key"
  inside chown slurm:slurm /etc/slurm/jwt_hs256.key && chmod 0600 "$ROOT/etc/slurm/jwt_hs256.key"
  add_hosts localhost "$(hostname -s)"
  # Added here, not in build(): chroots built before this user existed get it too.
  inside id -u "$FOREIGN_USER" >/dev/null 2>&1 ||
    inside useradd --system --no-create-home --shell /usr/sbin/nologin "$FOREIGN_USER"

  local conf gres; conf=$(slurm_conf); gres=$(gres_conf)
  if [ "$fresh" = 1 ] || [ "$conf" != "$(cat "$ROOT/etc/slurm/slurm.conf" 2>/dev/null)" ] ||
     [ "$gres" != "$(cat "$ROOT/etc/slurm/gres.conf" 2>/dev/null)" ] ||
     [ "$REST_PORT" != "$(cat "$DIR/rest-port" 2>/dev/null)" ]; then
    # AuthType and ports cannot change under a running slurmctld: restart.
    down; mount_fs
  fi
  printf '%s\n' "$conf" >"$ROOT/etc/slurm/slurm.conf"
  printf '%s\n' "$gres" >"$ROOT/etc/slurm/gres.conf"
  echo "$REST_PORT" >"$DIR/rest-port"
  if [ "$fresh" = 1 ]; then
    rm -rf "$ROOT/var/lib/slurm/slurmctld/"*
    : >"$ROOT/var/log/slurm/slurmctld.log"
  fi

  if ! pid_of "$ROOT/run/munge/munged.pid" munged >/dev/null; then
    rm -f "$ROOT/run/munge/"*
    inside runuser -u munge -- munged --pid-file=/run/munge/munged.pid 9>&-
  fi
  if ! pid_of "$ROOT/run/slurm/slurmctld.pid" slurmctld slurmctld-wlm >/dev/null; then
    rm -f "$ROOT/run/slurm/slurmctld.pid"
    inside slurmctld 9>&-
    for _ in $(seq 100); do inside scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
    inside scontrol ping >/dev/null 2>&1 || { tail -20 "$ROOT/var/log/slurm/slurmctld.log" >&2; die "slurmctld did not start"; }
    started_ctld=$(date +%s%N)
    say "slurmctld started"
  fi
  if ! pid_of "$ROOT/run/slurm/slurmrestd.pid" slurmrestd >/dev/null; then
    rm -f "$ROOT/run/slurm/slurmrestd.pid"
    touch "$ROOT/var/log/slurm/slurmrestd.log"
    inside chown slurmrestd /var/log/slurm/slurmrestd.log
    # rest_auth/jwt needs SLURM_JWT=daemon in slurmrestd's own environment, and
    # slurmrestd refuses to run as root or as SlurmUser.
    inside env SLURM_JWT=daemon SLURMRESTD_DEBUG_STDERR=info \
      start-stop-daemon --start --background --make-pidfile --pidfile /run/slurm/slurmrestd.pid \
      --chuid slurmrestd:slurmrestd --output /var/log/slurm/slurmrestd.log \
      --exec /usr/sbin/slurmrestd -- -a rest_auth/jwt "127.0.0.1:$REST_PORT" 9>&-
    for _ in $(seq 100); do inside curl -s -o /dev/null "http://127.0.0.1:$REST_PORT/" && break; sleep 0.1; done
    say "slurmrestd started on 127.0.0.1:$REST_PORT"
  fi

  local node
  for node in "${nodes[@]+"${nodes[@]}"}"; do
    add_hosts "$node"
    inside scontrol show node "$node" >/dev/null 2>&1 ||
      inside scontrol create "NodeName=$node" State=EXTERNAL Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 \
        CPUs=4 RealMemory=8000 Features=slurm-bridge
  done

  # Tokens go to files only (mode 0600), never to stdout or a log. The foreign
  # user's token is an ordinary user's: it acts as that user only.
  mint_token slurm "$DIR/jwt"
  mint_token "$FOREIGN_USER" "$DIR/jwt-foreign"
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "X-SLURM-USER-NAME: slurm" \
         -H "X-SLURM-USER-TOKEN: $(cat "$DIR/jwt")" "http://127.0.0.1:$REST_PORT/slurm/v0.0.44/partitions/")
  [ "$code" = 200 ] || die "slurmrestd answered HTTP $code; see $ROOT/var/log/slurm/slurmrestd.log"
  # Until its first scheduling pass (3-4 s after start) slurmctld uses the
  # compiled-in batch_sched_delay of 3 s; return once that pass is behind us.
  if [ "$started_ctld" != 0 ]; then
    local left_ms=$(( 4200 - ($(date +%s%N) - started_ctld) / 1000000 ))
    [ "$left_ms" -gt 0 ] && sleep "$(awk -v ms="$left_ms" 'BEGIN { printf "%.3f", ms / 1000 }')"
  fi
  local env
  env=$(printf 'SLURM_REST_URL=http://127.0.0.1:%s\nSLURM_USER_NAME=slurm\nSLURM_JWT_FILE=%s\n' "$REST_PORT" "$DIR/jwt"
        printf 'SLURM_FOREIGN_USER_NAME=%s\nSLURM_FOREIGN_JWT_FILE=%s\n' "$FOREIGN_USER" "$DIR/jwt-foreign")
  printf '%s\n' "$env" >"$DIR/env.new" && mv -f "$DIR/env.new" "$DIR/env"
  printf '%s\n' "$env"
}

status() {
  pid_of "$ROOT/run/slurm/slurmctld.pid" slurmctld slurmctld-wlm >/dev/null &&
    pid_of "$ROOT/run/slurm/slurmrestd.pid" slurmrestd >/dev/null
}

command=${1:-}; shift || true
case "$command" in
  up) up "$@" ;;
  down) down "$@" ;;
  scontrol) [ -f "$BUILT" ] || die "not built yet: run '$0 up' first"; mount_fs; inside scontrol "$@" ;;
  hosts) add_hosts "$@" ;;
  status) status ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
esac
