# Shared by hack/images/*.sh: logging, the tools and the flags every podman/buildah run here needs.
# shellcheck shell=bash

images_log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
images_die() { images_log "ERROR: $*"; exit 1; }

# runc, not crun: crun refuses this machine's hybrid cgroup layout ("cgroups in hybrid mode not supported").
IMAGES_RUNTIME=${KVPILOT_OCI_RUNTIME:-/usr/sbin/runc}

# Installs what is missing, once (apt-get update first: a fresh machine has no package lists).
images_ensure_tools() {
  local missing=() tool
  for tool in podman buildah mmdebstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  [[ -x "$IMAGES_RUNTIME" ]] || missing+=(runc)
  ((${#missing[@]} == 0)) && return
  command -v apt-get >/dev/null || images_die "missing ${missing[*]} and no apt-get to install them"
  local sudo=()
  ((EUID == 0)) || sudo=(sudo)
  images_log "installing ${missing[*]} with apt-get (once)"
  "${sudo[@]}" apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq podman buildah mmdebstrap runc >/dev/null \
    || images_die "apt-get install ${missing[*]} failed"
}
