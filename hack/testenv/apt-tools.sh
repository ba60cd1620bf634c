#!/usr/bin/env bash
# Installs the Debian packages the end-to-end tests run for real, when missing (idempotent, shows apt's
# progress): prometheus (+ promtool) for the Prometheus e2e, lua5.1 (the Lua of Argo CD's gopher-lua) for
# the Argo CD health check. Usage: hack/testenv/apt-tools.sh  (root; apt-get update only when needed)
set -euo pipefail
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
declare -A WANT=([prometheus]=prometheus [promtool]=prometheus [lua5.1]=lua5.1)
missing=()
for cmd in "${!WANT[@]}"; do
  command -v "$cmd" >/dev/null || missing+=("${WANT[$cmd]}")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
[[ $EUID -eq 0 ]] || { echo "apt-tools: need root to install: ${missing[*]}" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
start=$SECONDS
echo "[apt-tools] installing ${missing[*]}" >&2
if ! apt-cache policy "${missing[@]}" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
  apt-get update -q >&2
fi
apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >&2
echo "[apt-tools] done in $((SECONDS - start))s: $(prometheus --version 2>&1 | head -1)" >&2
