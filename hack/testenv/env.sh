#!/usr/bin/env bash
# Print the environment for using the local cluster from a shell:
#   eval "$(hack/testenv/env.sh)"     -> KUBECONFIG=.testenv/kubeconfig, kubectl/helm/kwok first on PATH,
#                                        Helm's cache/config/data under .testenv/helm
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
H=$TESTENV_DIR/helm
printf 'export KUBECONFIG=%q\n' "$TESTENV_DIR/kubeconfig"
printf 'export PATH=%q:"$PATH"\n' "$TESTENV_BIN"
printf 'export HELM_CACHE_HOME=%q HELM_CONFIG_HOME=%q HELM_DATA_HOME=%q\n' "$H/cache" "$H/config" "$H/data"
