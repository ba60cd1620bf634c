"""How a TensorRT-LLM engine runs across nodes: MPI over SSH, one rank per GPU, ``trtllm-llmapi-launch`` on each.

TensorRT-LLM's "Multi-node Serving" documentation (docs/source/commands/trtllm-serve/trtllm-serve.rst, and
examples/llm-api/llm_mgmn_trtllm_serve.sh @ b35ac1b64368513d215c57d2ed01d62d910df8da, the 1.2.0rc2 tree)
starts one MPI process per GPU of the world (TP x PP), every one running ``trtllm-llmapi-launch trtllm-serve
MODEL --tp_size .. --host 0.0.0.0 ...``; the launcher (tensorrt_llm/llmapi/trtllm-llmapi-launch) runs the
server on rank 0 (in the background, with the MPI environment removed) next to ``mgmn_leader_node``, and
``mgmn_worker_node`` on every other rank. The documentation launches with Slurm (``srun --mpi=pmix``);
on Kubernetes there is no Slurm, so the leader pod starts the same processes with Open MPI's ``mpirun``
over SSH, as NVIDIA's Dynamo and NIM operators do (shared/reference/multinode-and-routing.md): a hostfile of
``<host> slots=<gpusPerNode>`` lines, the leader first as ``localhost``.

UNVERIFIED here: that the 1.2 release image ships an SSH server (Open MPI's ``mpirun`` is there: the
launcher reads ``OMPI_COMM_WORLD_RANK``), and which Open MPI major it carries (``OMPI_MCA_orte_*`` names are
Open MPI 4's; an unknown MCA variable in the environment is ignored). An image with ``sshd`` may have to be
given in ``spec.runtime.image``.

The two scripts are static text in a ConfigMap: every value reaches them as an environment variable or as
an argument (the trtllm-serve argv), never as shell text. ``trtllm-llmapi-launch`` itself re-splits its
arguments on whitespace (``task_with_command="${@:1}"``), which admission's patterns keep out of paths.
"""

from __future__ import annotations

SSH_PORT = 2222
# Not under /etc/kvpilot, the LLM-API ConfigMap's (read-only) mount: a mount point inside it cannot be created.
SSH_DIR = "/etc/kvpilot-ssh"
SCRIPTS_DIR = "/etc/kvpilot-multinode"
LEADER_SCRIPT = "leader.sh"
WORKER_SCRIPT = "worker.sh"
# Key names in the engine's SSH Secret (desired/sshkeys.py generates them).
PRIVATE_KEY, PUBLIC_KEY, AUTHORIZED_KEYS = "id_ed25519", "id_ed25519.pub", "authorized_keys"
HOST_KEY, HOST_PUBLIC_KEY = "ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"
# How long the leader waits for its workers' sshd before it gives up (the pod restarts, the group is recreated).
WORKER_WAIT_SECONDS = 600

LEADER = r"""#!/bin/bash
# kvpilot: the leader (rank 0) of a multi-node TensorRT-LLM engine. Waits until every worker of its
# LeaderWorkerSet group answers on the SSH port, then starts trtllm-serve on all TP x PP ranks with Open MPI,
# one process per GPU, each through trtllm-llmapi-launch. Inputs: LWS_* (set by the LeaderWorkerSet pod
# webhook), KVPILOT_MN_* (set by kvpilot), and the trtllm-serve command line as arguments.
set -euo pipefail
size=${LWS_GROUP_SIZE:?} leader=${LWS_LEADER_ADDRESS:?}
gpus=${KVPILOT_MN_GPUS_PER_NODE:?} port=${KVPILOT_MN_SSH_PORT:?} ssh_dir=${KVPILOT_MN_SSH_DIR:?}
wait_s=${KVPILOT_MN_WORKER_WAIT_SECONDS:?}
work=$(mktemp -d)
install -m 600 "$ssh_dir/id_ed25519" "$work/id_ed25519"  # ssh refuses a key that others may read
install -m 644 "$ssh_dir/id_ed25519.pub" "$work/id_ed25519.pub"
echo "localhost slots=$gpus" >"$work/hostfile"
deadline=$((SECONDS + wait_s))
for ((i = 1; i < size; i++)); do
  host="${leader%%.*}-$i.${leader#*.}"  # worker i: <lws>-<group>-<i>.<subdomain>.<namespace>
  until ip=$(getent hosts "$host" | awk '{print $1; exit}') && [[ -n "$ip" ]] \
        && (: <"/dev/tcp/$ip/$port") 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      echo "kvpilot: worker $host did not answer on port $port within ${wait_s}s" >&2
      exit 1
    fi
    sleep 2
  done
  echo "kvpilot: worker $host is up ($ip)" >&2
  echo "$host slots=$gpus" >>"$work/hostfile"
done
exports=()
for name in ${KVPILOT_MN_EXPORT:-}; do exports+=(-x "$name"); done
echo "kvpilot: starting $((size * gpus)) ranks on $size nodes" >&2
exec mpirun --allow-run-as-root -n "$((size * gpus))" --hostfile "$work/hostfile" \
  --mca plm_rsh_args "-p $port -i $work/id_ed25519 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectionAttempts=20" \
  "${exports[@]}" trtllm-llmapi-launch "$@"
"""

WORKER = r"""#!/bin/bash
# kvpilot: a worker of a multi-node TensorRT-LLM engine. Runs sshd on the SSH port so that the leader's
# mpirun can start this node's ranks; the host key and the leader's public key come from the engine's Secret.
set -euo pipefail
ssh_dir=${KVPILOT_MN_SSH_DIR:?} port=${KVPILOT_MN_SSH_PORT:?}
work=$(mktemp -d)
install -m 600 "$ssh_dir/ssh_host_ed25519_key" "$work/host_key"  # sshd ignores a host key others may read
mkdir -p /run/sshd 2>/dev/null || true  # its privilege-separation directory
sshd=$(command -v sshd)  # sshd re-executes itself: it must be started by its absolute path
exec "$sshd" -D -e -p "$port" -o ListenAddress="${KVPILOT_MN_LISTEN:?}" -h "$work/host_key" \
  -o AuthorizedKeysFile="$ssh_dir/authorized_keys" -o StrictModes=no -o PasswordAuthentication=no \
  -o PermitRootLogin=prohibit-password -o PermitUserEnvironment=no
"""


def scripts() -> dict[str, str]:
    """The ConfigMap data: both scripts, keyed by file name."""
    return {LEADER_SCRIPT: LEADER, WORKER_SCRIPT: WORKER}


def leader_command() -> list[str]:
    return ["bash", f"{SCRIPTS_DIR}/{LEADER_SCRIPT}"]


def worker_command() -> list[str]:
    return ["bash", f"{SCRIPTS_DIR}/{WORKER_SCRIPT}"]


def leader_env(gpus_per_node: int, exported: list[str]) -> list[dict[str, str]]:
    """``exported``: names of the container's own variables every rank needs (mpirun -x)."""
    return [
        {"name": "KVPILOT_MN_GPUS_PER_NODE", "value": str(gpus_per_node)},
        {"name": "KVPILOT_MN_SSH_PORT", "value": str(SSH_PORT)},
        {"name": "KVPILOT_MN_SSH_DIR", "value": SSH_DIR},
        {"name": "KVPILOT_MN_WORKER_WAIT_SECONDS", "value": str(WORKER_WAIT_SECONDS)},
        {"name": "KVPILOT_MN_EXPORT", "value": " ".join(exported)},
        # Open MPI 4: keep the workers' stable DNS names as they are (NIM's setting).
        {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "1"},
    ]


def worker_env() -> list[dict[str, str]]:
    return [
        {"name": "KVPILOT_MN_SSH_PORT", "value": str(SSH_PORT)},
        {"name": "KVPILOT_MN_SSH_DIR", "value": SSH_DIR},
        {"name": "KVPILOT_MN_LISTEN", "value": "0.0.0.0"},
    ]
