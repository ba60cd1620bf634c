#!/usr/bin/env bash
# Build the two images without Docker: the operator (ghcr.io/kvpilot/kvpilot, ./Dockerfile) and the
# simulated backend (ghcr.io/kvpilot/kvsim, images/kvsim/Dockerfile), with buildah from the repository's
# own Dockerfiles, into the local podman/buildah store.
#
# Usage: hack/images/build.sh [--help]      (or: make images)
#   1. Installs podman, buildah, mmdebstrap and runc with apt-get when one is missing.
#   2. The base: no image registry is reachable here, so a Python 3.11 base is bootstrapped from Debian's
#      own packages (mmdebstrap, about a minute) and imported as localhost/kvpilot-base:<key>. The root
#      filesystem tarball is cached in ~/.cache/kvpilot/images, keyed by suite and package list.
#      KVPILOT_BASE_IMAGE=python:3.11-slim (or any image) skips the bootstrap and builds on that instead;
#      the Dockerfiles' own default is the public python:3.11-slim users get.
#   3. Each image is rebuilt only when a hash of its inputs (Dockerfile, build context files, base image,
#      version) differs from the io.kvpilot.inputs label of the image already in the store.
#   Logs: ~/.cache/kvpilot/images/logs/<image>.log (progress lines are echoed here).
#   Env: KVPILOT_IMAGES_CACHE (cache dir), KVPILOT_IMAGE_VERSION (tag; default: pyproject's version),
#        KVPILOT_IMAGES_FORCE=1 (rebuild even when the inputs are unchanged).
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0
fi
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
(($# == 0)) || images_die "unknown argument '$1' (see --help)"
T0=$SECONDS

images_ensure_tools

CACHE=${KVPILOT_IMAGES_CACHE:-$HOME/.cache/kvpilot/images}
mkdir -p "$CACHE/logs"
VERSION=${KVPILOT_IMAGE_VERSION:-$(python3 -c 'import tomllib,sys; print(tomllib.load(open(sys.argv[1],"rb"))["project"]["version"])' "$ROOT/pyproject.toml")}
REVISION=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)

# ---------------------------------------------------------------- the base image
if [[ -n "${KVPILOT_BASE_IMAGE:-}" ]]; then
  BASE=$KVPILOT_BASE_IMAGE
  images_log "base: $BASE (KVPILOT_BASE_IMAGE)"
else
  SUITE=bookworm
  PACKAGES=python3,python3-venv,ca-certificates
  # No documentation, man pages or translations in the images (copyright files stay, as Debian asks).
  DPKG_OPTS=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
             --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
             --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias')
  KEY=$(printf 'mmdebstrap minbase %s %s %s v2' "$SUITE" "$PACKAGES" "${DPKG_OPTS[*]}" | sha256sum | cut -c1-16)
  BASE=localhost/kvpilot-base:$SUITE-$KEY
  TARBALL=$CACHE/base-$SUITE-$KEY.tar
  if podman image exists "$BASE"; then
    images_log "base: $BASE (in the image store)"
  else
    if [[ ! -s "$TARBALL" ]]; then
      images_log "base: bootstrapping Debian $SUITE with $PACKAGES (mmdebstrap, about a minute)"
      rm -f "$TARBALL.tmp"
      mmdebstrap --variant=minbase --format=tar --include="$PACKAGES" "${DPKG_OPTS[@]}" --quiet "$SUITE" "$TARBALL.tmp" \
        >"$CACHE/logs/base.log" 2>&1 || { tail -n 20 "$CACHE/logs/base.log" >&2; images_die "mmdebstrap failed (see $CACHE/logs/base.log)"; }
      mv "$TARBALL.tmp" "$TARBALL"
      images_log "base: root filesystem $(du -h "$TARBALL" | cut -f1) cached as $TARBALL"
    fi
    images_log "base: importing $TARBALL as $BASE"
    podman import --quiet --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$TARBALL" "$BASE" >/dev/null
  fi
fi
BASE_ID=$(podman image inspect --format '{{.Id}}' "$BASE" 2>/dev/null || echo "$BASE")

# ---------------------------------------------------------------- the images
# The build context is what .dockerignore lets through: hash exactly those files (tracked or not, as
# buildah sends the working tree), plus the Dockerfile, base and version.
inputs_hash() {  # inputs_hash DOCKERFILE
  {
    printf 'base=%s version=%s\n' "$BASE_ID" "$VERSION"
    sha256sum "$ROOT/$1" | cut -d' ' -f1
    (cd "$ROOT" && git ls-files -co --exclude-standard -- pyproject.toml README.md LICENSE operator simulator images/kvsim/bin \
      | grep -Ev '(__pycache__|\.py[cod]$|\.egg-info/|\.(pytest|mypy|ruff)_cache/)' | LC_ALL=C sort \
      | while read -r f; do [[ -f "$f" ]] && sha256sum "$f"; done)
  } | sha256sum | cut -c1-32
}

# RUN steps reach PyPI through this machine's network, which may re-sign TLS with its own CA (an egress
# proxy): the host's trust store is bind-mounted over the base's for the build's RUN steps only, so it is
# in no layer of the images. KVPILOT_BUILD_CA_BUNDLE= (empty) turns that off.
CA_BUNDLE=${KVPILOT_BUILD_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
BUILD_VOLUMES=()
[[ -n "$CA_BUNDLE" && -s "$CA_BUNDLE" ]] && BUILD_VOLUMES=(--volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro")

build_image() {  # build_image NAME DOCKERFILE
  local name=$1 dockerfile=$2 tag hash have log t0=$SECONDS
  tag=ghcr.io/kvpilot/$name:$VERSION
  hash=$(inputs_hash "$dockerfile")
  have=$(podman image inspect --format '{{index .Labels "io.kvpilot.inputs"}}' "$tag" 2>/dev/null || true)
  if [[ "$have" == "$hash" && "${KVPILOT_IMAGES_FORCE:-0}" != 1 ]]; then
    images_log "$name: $tag is up to date (inputs $hash)"
    return
  fi
  log=$CACHE/logs/$name.log
  images_log "$name: building $tag from $dockerfile (inputs $hash; log: $log)"
  # runc (crun refuses the hybrid cgroup layout), rlimits lowered (no CAP_SYS_RESOURCE to raise them),
  # host network so pip reaches PyPI from the builder stage.
  # No --layers: buildah 1.28 (Debian bookworm) fails `RUN --mount=type=bind,from=<stage>` when that stage
  # came from its layer cache ("couldn't find .../merged/wheels"); the inputs hash above is the cache.
  # --force-rm: a failed build leaves no working container behind.
  if ! buildah bud --layers=false --force-rm --runtime "$IMAGES_RUNTIME" --network host \
      --ulimit nofile=4096:4096 --ulimit nproc=4096:4096 "${BUILD_VOLUMES[@]}" \
      --build-arg PYTHON_IMAGE="$BASE" --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" \
      --label io.kvpilot.inputs="$hash" --label io.kvpilot.base="$BASE" \
      -f "$ROOT/$dockerfile" -t "$tag" "$ROOT" 2>&1 | tee "$log" \
      | { grep --line-buffered -E '^(\[[0-9]+/[0-9]+\] )?STEP [0-9]+/[0-9]+:|^COMMIT|^Error' || true; } | sed -u "s/^/[images]   $name: /" >&2; then
    tail -n 30 "$log" >&2
    images_die "$name: buildah bud failed (see $log)"
  fi
  images_log "$name: built $tag in $((SECONDS - t0))s"
}

build_image kvpilot Dockerfile
build_image kvsim images/kvsim/Dockerfile

for name in kvpilot kvsim; do
  images_log "$(podman image inspect --format "$name: {{.Size}} bytes, user {{.Config.User}}, entrypoint {{.Config.Entrypoint}} cmd {{.Config.Cmd}}" "ghcr.io/kvpilot/$name:$VERSION")"
done
images_log "images ready in $((SECONDS - T0))s: ghcr.io/kvpilot/kvpilot:$VERSION ghcr.io/kvpilot/kvsim:$VERSION"
