#!/usr/bin/env bash
# The slurm-bridge image, built, run and exported without a Docker daemon or a container
# registry: buildah (chroot isolation) as root, the base made from Debian's archive.
#
#   hack/image.sh build [--no-archives]
#                           (`./dev image`) install buildah, skopeo and mmdebstrap with apt
#                           when missing; make the Debian base the Dockerfile names (once per
#                           machine and tag); build the Dockerfile (layers cached); write the
#                           archives; print size, layers and times on stderr and KEY=value
#                           lines on stdout (IMAGE, IMAGE_ID, ROOTFS, SIZE_BYTES, LAYERS, and
#                           OCI_ARCHIVE, DOCKER_ARCHIVE)
#   hack/image.sh archives  write the OCI and docker archives of the built image (again only
#                           when it changed), tagged slurm-bridge:<the chart's appVersion>
#   hack/image.sh clean     remove buildah's storage and the archives (the cache grows by a few
#                           MB per code change); the base rootfs tarball stays
#   hack/image.sh run [-e NAME=VALUE]... [-v SRC:DST]... [--entrypoint PATH] [--] [ARG...]
#                           run the built image as a container runtime would with a read-only
#                           root filesystem: its entry point (or PATH) with ARGs, its user,
#                           environment and working directory, a fresh tmpfs on /tmp, SRC
#                           mounted read-only at DST, and the host's network (so 127.0.0.1 is
#                           the host's Temporal, slurmrestd and API server)
#
# Environment: SLURM_BRIDGE_IMAGE_DIR (default /var/cache/slurm-bridge/image: buildah's
# storage, the base rootfs, the archives; outside any repository, so it survives checkouts
# and is built once per machine), SLURM_BRIDGE_IMAGE_STORAGE_DRIVER (overlay; vfs also
# works, slower). Needs root (chroot, mounts, buildah's storage).
# Choices and measured times: docs/operations.md, "Building the image without Docker".
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=${SLURM_BRIDGE_IMAGE_DIR:-/var/cache/slurm-bridge/image}
DRIVER=${SLURM_BRIDGE_IMAGE_STORAGE_DRIVER:-overlay}
# buildah's run state belongs on a tmpfs-like place: stale mount records must not survive a reboot.
RUNROOT=/run/slurm-bridge-image
# The host's CA bundle: PyPI may be reached through a TLS-intercepting proxy whose CA only it has.
HOST_CA=/etc/ssl/certs/ca-certificates.crt

say() { echo "[image] $*" >&2; }
die() { say "error: $*"; exit 1; }
b() { buildah --root "$DIR/storage" --runroot "$RUNROOT" --storage-driver "$DRIVER" "$@"; }

[ "$(id -u)" = 0 ] || die "must run as root (buildah's storage, chroot, mounts): sudo $0 $*"

# The chart's appVersion is the image's version: Chart.yaml's image.tag default, the compose
# file's image and the archives all carry it (tests/deploy/test_compose.py checks they agree).
VERSION=$(awk -F'"' '/^appVersion:/ { print $2 }' "$REPO/helm/slurm-bridge/Chart.yaml")
[ -n "$VERSION" ] || die "no appVersion in helm/slurm-bridge/Chart.yaml"
IMAGE=localhost/slurm-bridge:$VERSION
ARCHIVES=$DIR/archives
OCI_ARCHIVE=$ARCHIVES/slurm-bridge-$VERSION.oci.tar
DOCKER_ARCHIVE=$ARCHIVES/slurm-bridge-$VERSION.docker.tar

# The production base the Dockerfile names, e.g. debian:bookworm-20251229-slim.
BASE=$(sed -n 's/^ARG DEBIAN_IMAGE=//p' "$REPO/Dockerfile")
SUITE=$(printf '%s' "$BASE" | sed -n 's/^debian:\([a-z]*\)-[0-9]\{8\}-slim$/\1/p')
[ -n "$SUITE" ] || die "the Dockerfile's DEBIAN_IMAGE ($BASE) is not debian:<suite>-<date>-slim"
LOCAL_BASE=localhost/${BASE}

seconds() { echo $(($(date +%s) - $1)); }

tools() {
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  command -v skopeo >/dev/null || missing+=(skopeo)
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  [ ${#missing[@]} = 0 ] && return 0
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  say "installing ${missing[*]} on the host (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The mirrors the host's apt uses (as hack/slurm-sid.sh finds them): the archive, and its security archive.
host_uris() {
  local file
  for file in /etc/apt/sources.list.d/*.sources; do
    [ -r "$file" ] && awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' "$file"
  done
  [ -r /etc/apt/sources.list ] &&
    awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) { print $i; break } }' /etc/apt/sources.list
  return 0
}

# What the official debian:<suite>-<date>-slim image is, from Debian's archive: a minbase
# bootstrap (debuerreotype's), merged /usr without the usrmerge package (which would drag in
# perl), no device nodes (the runtime provides /dev), the slim variant's dpkg excludes (docs,
# man pages, locales; they stay in the rootfs's dpkg config, so later apt installs in the
# Dockerfile honour them as on the real slim image), the image's apt sources, and its config
# (PATH, CMD bash): ~78 MB, as the real one. Python, libc and paths then come from the same
# suite's packages as in production.
base() {
  if b inspect --type image "$LOCAL_BASE" >/dev/null 2>&1; then
    return 0
  fi
  local start tar mirror security
  start=$(date +%s)
  tar=$DIR/base/$(printf '%s' "$BASE" | tr ':/' '__').tar
  if [ ! -s "$tar" ]; then
    mirror=$(host_uris | grep -v security | head -n1)
    security=$(host_uris | grep security | head -n1)
    [ -n "$mirror" ] || die "no Debian mirror in the host's apt sources"
    : "${security:=http://deb.debian.org/debian-security}"
    say "making the base $BASE from $mirror with mmdebstrap (once per machine, about a minute)"
    mkdir -p "$DIR/base"
    mmdebstrap --quiet --variant=minbase --format=tar --skip=output/dev \
      --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
      --customize-hook='rm -f "$1/etc/apt/sources.list"' \
      --customize-hook="printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: $SUITE $SUITE-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\nSuites: $SUITE-security\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > \"\$1/etc/apt/sources.list.d/debian.sources\"" \
      "$SUITE" "$tar.part" \
      "deb $mirror $SUITE main" "deb $mirror $SUITE-updates main" "deb $security $SUITE-security main" \
      >"$DIR/base/mmdebstrap.log" 2>&1 || die "mmdebstrap failed; see $DIR/base/mmdebstrap.log"
    mv "$tar.part" "$tar"
  fi
  say "committing the base as $LOCAL_BASE"
  local c
  c=$(b from scratch)
  b add --quiet "$c" "$tar" / >/dev/null
  b config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash \
    --label "org.slurm-bridge.stands-for=$BASE" "$c"
  b commit --quiet --rm "$c" "$LOCAL_BASE" >/dev/null
  say "base ready in $(seconds "$start") s"
}

# One working container per image, mounted, never run: `run` bind-mounts its root
# read-only in a private mount namespace. Containers of older images are removed.
rootfs_container() {
  local id=$1 name=slurm-bridge-rootfs-${1:0:12} other
  for other in $(b containers --noheading --format '{{.ContainerName}}' | grep '^slurm-bridge-rootfs-' || true); do
    [ "$other" = "$name" ] && continue
    b umount "$other" >/dev/null 2>&1 || true
    b rm "$other" >/dev/null
  done
  if ! b inspect --type container "$name" >/dev/null 2>&1; then
    b from --pull=never --name "$name" "$id" >/dev/null
  fi
  local root
  root=$(b mount "$name")
  # The runtime's own mount points, as a container runtime creates them in the container's
  # layer (not in the image): the host's name resolution files.
  touch "$root$(inside_path "$root" /etc/hosts)" "$root$(inside_path "$root" /etc/resolv.conf)"
  echo "$root"
}

# The two archives of the built image, tagged slurm-bridge:<appVersion>: OCI (compressed, for
# `ctr import` or `skopeo copy` to a registry) and docker (what `kind load image-archive` takes).
# Written again only when the image changed.
archives() {
  local id start
  id=$(b inspect --type image --format '{{.FromImageID}}' "$IMAGE" 2>/dev/null) ||
    die "no image $IMAGE: run hack/image.sh build first"
  mkdir -p "$ARCHIVES"
  if [ "$(cat "$ARCHIVES/.image-id" 2>/dev/null)" != "$id" ] || [ ! -s "$OCI_ARCHIVE" ] || [ ! -s "$DOCKER_ARCHIVE" ]; then
    start=$(date +%s)
    rm -f "$ARCHIVES/.image-id" "$OCI_ARCHIVE.part" "$DOCKER_ARCHIVE.part"
    # buildah's scratch space for the export, emptied here: an export that was stopped (the
    # tests stop an unneeded one) leaves its half-written layers behind.
    export TMPDIR=$DIR/tmp
    rm -rf "$TMPDIR" && mkdir -p "$TMPDIR"
    # Written aside and renamed: a reader never sees half an archive.
    b push --quiet "$id" "oci-archive:$OCI_ARCHIVE.part:slurm-bridge:$VERSION" >/dev/null
    b push --quiet "$id" "docker-archive:$DOCKER_ARCHIVE.part:slurm-bridge:$VERSION" >/dev/null
    mv "$OCI_ARCHIVE.part" "$OCI_ARCHIVE"
    mv "$DOCKER_ARCHIVE.part" "$DOCKER_ARCHIVE"
    echo "$id" >"$ARCHIVES/.image-id"
    rm -rf "$TMPDIR"
    say "archives written in $(seconds "$start") s: $(($(stat -c %s "$OCI_ARCHIVE") / 1000000)) MB (OCI, compressed), $(($(stat -c %s "$DOCKER_ARCHIVE") / 1000000)) MB (docker), in $ARCHIVES"
  fi
  printf 'OCI_ARCHIVE=%s\nDOCKER_ARCHIVE=%s\n' "$OCI_ARCHIVE" "$DOCKER_ARCHIVE"
}

build() {
  local start step id root size layers secret=() with_archives=1
  [ "${1:-}" = --no-archives ] && with_archives=0
  start=$(date +%s)
  tools
  base
  step=$(date +%s)
  [ -s "$HOST_CA" ] && secret=(--secret "id=pip-ca,src=$HOST_CA")
  say "building $IMAGE from the Dockerfile (base $LOCAL_BASE)"
  # --layers: unchanged steps (the Debian Python, the pinned dependencies) come from the cache.
  b bud --quiet --layers --force-rm --pull=never --isolation chroot "${secret[@]}" \
    --build-arg "DEBIAN_IMAGE=$LOCAL_BASE" -t "$IMAGE" -f "$REPO/Dockerfile" "$REPO" >"$DIR/build.log" 2>&1 ||
    { tail -n 30 "$DIR/build.log" >&2; die "the build failed; see $DIR/build.log"; }
  id=$(b inspect --type image --format '{{.FromImageID}}' "$IMAGE")
  root=$(rootfs_container "$id")
  layers=$(b inspect --type image --format '{{range .OCIv1.RootFS.DiffIDs}}x{{end}}' "$IMAGE")
  layers=${#layers}
  size=$(du -sb --apparent-size "$root" | cut -f1)
  say "built in $(seconds "$step") s: $IMAGE ${id:0:12}, $((size / 1000000)) MB unpacked, $layers layers"
  printf 'IMAGE=%s\nIMAGE_ID=%s\nROOTFS=%s\nSIZE_BYTES=%s\nLAYERS=%s\n' "$IMAGE" "$id" "$root" "$size" "$layers"
  [ "$with_archives" = 1 ] && archives
  say "done in $(seconds "$start") s"
}

# Everything but the base rootfs tarball: buildah's storage (images, cached layers, the mounted
# rootfs container) and the archives. The next build re-imports the base and rebuilds all layers.
clean() {
  if command -v buildah >/dev/null && [ -d "$DIR/storage" ]; then
    b rm --all >/dev/null
    b rmi --all --force >/dev/null 2>&1 || true
    # buildah keeps its overlay directory bind-mounted onto itself.
    ! mountpoint -q "$DIR/storage/overlay" || umount "$DIR/storage/overlay"
  fi
  rm -rf "$DIR/storage" "$DIR/archives" "$DIR/tmp" "$RUNROOT"
  say "removed the image storage and archives in $DIR (kept the base rootfs in $DIR/base)"
}

# One builder and one archive writer at a time: parallel test sessions share the storage, the
# rootfs container and the archives. Two locks, so a build need not wait for another session's
# archives (they are written from an image id, which a later build cannot change). `run` takes
# no lock: it only reads.
locked() {
  mkdir -p "$DIR"
  exec 8>"$DIR/.archives.lock"
  exec 9>"$DIR/.lock"
  case $1 in
    build) flock 9 ;;
    archives) flock 8 ;;
    *) flock 9 && flock 8 ;;
  esac
  "$@"
}

# A path as the image sees it, its links followed inside the image's root.
inside_path() {
  chroot "$1" /usr/bin/realpath -m "$2"
}

# `run`: read the image's config, then continue in a private mount namespace (`inside`), so
# every mount below vanishes with the process and nothing is left on the host.
run() {
  local envs=() binds=() entrypoint=() arg
  while [ $# -gt 0 ]; do
    case $1 in
      -e) envs+=("$2"); shift 2 ;;
      -v) binds+=("$2"); shift 2 ;;
      --entrypoint) entrypoint=("$2"); shift 2 ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  command -v buildah >/dev/null || die "no buildah: run hack/image.sh build first"
  # The image's config in one call, a "key value" line per item.
  local config id="" user="" workdir="" key value image_env=() image_entrypoint=() image_cmd=()
  config=$(b inspect --type image --format '{{println "id" .FromImageID}}{{println "user" .OCIv1.Config.User}}{{println "workdir" .OCIv1.Config.WorkingDir}}{{range .OCIv1.Config.Env}}{{println "env" .}}{{end}}{{range .OCIv1.Config.Entrypoint}}{{println "entrypoint" .}}{{end}}{{range .OCIv1.Config.Cmd}}{{println "cmd" .}}{{end}}' "$IMAGE" 2>/dev/null) ||
    die "no image $IMAGE: run hack/image.sh build first"
  while IFS=' ' read -r key value; do
    case $key in
      id) id=$value ;;
      user) user=$value ;;
      workdir) workdir=$value ;;
      env) image_env+=("$value") ;;
      entrypoint) image_entrypoint+=("$value") ;;
      cmd) image_cmd+=("$value") ;;
    esac
  done <<<"$config"
  local root
  root=$(b mount "slurm-bridge-rootfs-${id:0:12}" 2>/dev/null) ||
    die "no root filesystem for $IMAGE: run hack/image.sh build first"
  [ ${#entrypoint[@]} = 0 ] && entrypoint=("${image_entrypoint[@]}")
  # As docker run: arguments replace CMD; without any, CMD is the arguments (unless --entrypoint).
  local args=("$@")
  if [ $# = 0 ] && [ ${#image_entrypoint[@]} -gt 0 ] && [ "${entrypoint[*]}" = "${image_entrypoint[*]}" ]; then
    args=("${image_cmd[@]}")
  fi
  # Mount points for the bind mounts, in the container's layer as a runtime makes them. A
  # target is resolved inside the image (/var/run is a link to /run there): never through
  # the host's own links.
  local resolved=() src dst
  for arg in "${binds[@]+"${binds[@]}"}"; do
    src=${arg%%:*}
    [ -e "$src" ] || die "-v $arg: $src does not exist"
    dst=$(inside_path "$root" "${arg#*:}")
    if [ -d "$src" ]; then mkdir -p "$root$dst"; else mkdir -p "$(dirname "$root$dst")"; touch "$root$dst"; fi
    resolved+=("$src:$dst")
  done
  # Passed through the environment of the re-executed script: lists do not fit in arguments.
  export IMAGE_ROOT=$root IMAGE_USER=${user:-0:0} IMAGE_WORKDIR=${workdir:-/}
  IMAGE_BINDS=$(printf '%s\n' "${resolved[@]+"${resolved[@]}"}")
  IMAGE_ENV=$(printf '%s\n' "${image_env[@]+"${image_env[@]}"}" "${envs[@]+"${envs[@]}"}")
  export IMAGE_BINDS IMAGE_ENV
  exec unshare --mount --propagation private -- "$0" __inside "${entrypoint[@]}" "${args[@]+"${args[@]}"}"
}

inside() {
  local r=$IMAGE_ROOT line d
  # The image's root, read-only: the process can write /tmp only, as under the chart.
  mount --bind "$r" "$r"
  mount -o remount,bind,ro,nosuid,nodev "$r"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/tmp"
  mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
  # A minimal /dev, as runtimes give one: no host disks in it.
  mount -t tmpfs -o mode=755,nosuid tmpfs "$r/dev"
  for d in null zero full random urandom tty; do
    touch "$r/dev/$d"
    mount --bind "/dev/$d" "$r/dev/$d"
  done
  for line in /etc/hosts /etc/resolv.conf; do
    d=$(inside_path "$r" "$line")
    mount --bind "$line" "$r$d"
    mount -o remount,bind,ro "$r$d"
  done
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    mount --bind "${line%%:*}" "$r${line#*:}"
    mount -o remount,bind,ro,nosuid,nodev "$r${line#*:}"
  done <<<"$IMAGE_BINDS"
  local env=()
  while IFS= read -r line; do
    [ -n "$line" ] && env+=("$line")
  done <<<"$IMAGE_ENV"
  # chroot drops to the image's user (no supplementary groups but its own group); env -i
  # leaves the process exactly the image's environment and the -e settings.
  exec chroot --userspec="$IMAGE_USER" --groups="${IMAGE_USER#*:}" "$r" \
    /usr/bin/env -i -C "$IMAGE_WORKDIR" "${env[@]}" "$@"
}

case "${1:-}" in
  build) shift; locked build "$@" ;;
  archives) locked archives ;;
  clean) locked clean ;;
  run) shift; run "$@" ;;
  __inside) shift; inside "$@" ;;
  *) sed -n '2,26p' "$0" >&2; exit 2 ;;
esac
