"""kvsim's multi-node stand-ins (simulator/kvsim/multinode.py): option parsing, rank placement, and real
processes talking over loopback: the sshd stand-in admits only its authorized key, mpirun starts rank 0 with
Open MPI's environment once every worker answers, and aborts the job when a worker's connection drops."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvsim import multinode as mn
from kvsim import sshd as sshd_standin

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKvsimTestKeyOnly kvpilot@test"


def test_mpirun_options_as_the_leader_script_passes_them(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=8\n# a comment\nmn-0-1.mn.ns slots=8\n")
    opts = mn.parse_mpirun(["--allow-run-as-root", "--oversubscribe", "-n", "16", "--hostfile", str(hostfile),
                            "--mca", "plm_rsh_args", "-p 2222 -i /k/id -o ConnectionAttempts=20",
                            "-x", "HF_HOME=/h", "trtllm-llmapi-launch", "trtllm-serve", "/e", "--tp_size", "8"])
    assert opts.ranks == 16 and opts.hosts == [("localhost", 8), ("mn-0-1.mn.ns", 8)]
    assert opts.export == {"HF_HOME": "/h"} and opts.command[:2] == ["trtllm-llmapi-launch", "trtllm-serve"]
    rsh = mn.parse_rsh_args(opts.mca["plm_rsh_args"])
    assert (rsh.port, rsh.identity, rsh.attempts) == (2222, "/k/id", 20)
    assert mn.rank_ranges(opts.hosts, 16, False) == [("localhost", 0, 8), ("mn-0-1.mn.ns", 8, 8)]


def test_mpirun_refuses_more_ranks_than_slots_and_unknown_options() -> None:
    with pytest.raises(ValueError, match="not enough slots"):
        mn.rank_ranges([("localhost", 8), ("w", 4)], 16, False)
    with pytest.raises(ValueError, match="unknown option"):
        mn.parse_mpirun(["--frobnicate", "x"])
    with pytest.raises(ValueError, match="no program"):
        mn.parse_mpirun(["-n", "2"])


def test_sshd_options() -> None:
    opts = sshd_standin.parse_sshd(["-D", "-e", "-p", "2222", "-o", "ListenAddress=127.18.0.9", "-h", "/k/host",
                          "-o", "AuthorizedKeysFile=/k/authorized_keys", "-o", "StrictModes=no"])
    assert (opts.port, opts.listen, opts.host_keys, opts.authorized_keys) == (
        2222, "127.18.0.9", ["/k/host"], "/k/authorized_keys")
    with pytest.raises(ValueError):
        sshd_standin.parse_sshd(["-Z"])


def free_ip_port() -> tuple[str, int]:
    ip = f"127.77.{os.getpid() % 250}.{int(time.time() * 1000) % 250 + 2}"
    with socket.socket() as s:
        s.bind((ip, 0))
        return ip, s.getsockname()[1]


def keys(tmp_path: Path, authorized: str = KEY) -> Path:
    d = tmp_path / "ssh"
    d.mkdir()
    (d / "id").write_text("PRIVATE")
    (d / "id").chmod(0o600)
    (d / "id.pub").write_text(KEY + "\n")
    (d / "host").write_text("HOSTKEY")
    (d / "authorized_keys").write_text(authorized + "\n")
    return d


def start_sshd(d: Path, ip: str, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "kvsim.multinode", "sshd", "-D", "-p", str(port),
                             "-o", f"ListenAddress={ip}", "-h", str(d / "host"),
                             "-o", f"AuthorizedKeysFile={d / 'authorized_keys'}"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and "listening" in proc.stdout.readline()
    return proc


def mpirun(d: Path, tmp_path: Path, ip: str, port: int, *command: str) -> subprocess.Popen[str]:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"localhost slots=2\n{ip} slots=2\n")
    return subprocess.Popen([sys.executable, "-m", "kvsim.multinode", "mpirun", "-n", "4", "--hostfile", str(hostfile),
                             "--mca", "plm_rsh_args", f"-p {port} -i {d / 'id'}", "-x", "EXTRA=1", *command],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_mpirun_starts_rank_zero_once_the_worker_admits_the_key(tmp_path: Path) -> None:
    d, (ip, port) = keys(tmp_path), free_ip_port()
    sshd = start_sshd(d, ip, port)
    try:
        run = mpirun(d, tmp_path, ip, port, sys.executable, "-c",
                     "import os; print(os.environ['OMPI_COMM_WORLD_RANK'], os.environ['OMPI_COMM_WORLD_SIZE'], "
                     "os.environ['EXTRA'])")
        out, err = run.communicate(timeout=30)
        assert run.returncode == 0, err
        assert out.splitlines()[-1] == "0 4 1"
        assert f"{ip} 2-3" in out
    finally:
        sshd.terminate()
        sshd.wait(10)


def test_mpirun_is_refused_with_a_key_the_worker_does_not_know(tmp_path: Path) -> None:
    d, (ip, port) = keys(tmp_path, authorized="ssh-ed25519 AAAAsomeoneElse x"), free_ip_port()
    sshd = start_sshd(d, ip, port)
    try:
        run = mpirun(d, tmp_path, ip, port, "true")
        _, err = run.communicate(timeout=30)
        assert run.returncode == 1 and "Permission denied (publickey)" in err
    finally:
        sshd.terminate()
        sshd.wait(10)


def test_mpirun_aborts_the_job_when_a_worker_goes_away(tmp_path: Path) -> None:
    d, (ip, port) = keys(tmp_path), free_ip_port()
    sshd = start_sshd(d, ip, port)
    run = mpirun(d, tmp_path, ip, port, sys.executable, "-c", "import time; print('serving', flush=True); time.sleep(60)")
    assert run.stdout is not None
    while "serving" not in run.stdout.readline():
        pass
    sshd.kill()
    sshd.wait(10)
    _, err = run.communicate(timeout=30)
    assert run.returncode == 1 and "lost communication with a remote daemon" in err


def test_llmapi_launch_needs_one_rank_per_gpu_of_the_mapping() -> None:
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8"}
    bad = subprocess.run([sys.executable, "-m", "kvsim.multinode", "trtllm-llmapi-launch", "trtllm-serve", "/e",
                          "--tp_size", "8", "--pp_size", "2"], env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 1 and "MPI world size 8 != tp_size 8 x pp_size 2" in bad.stderr
    env["OMPI_COMM_WORLD_SIZE"] = "16"
    ok = subprocess.run([sys.executable, "-m", "kvsim.multinode", "trtllm-llmapi-launch", sys.executable, "-c",
                         "import os; print(os.environ.get('OMPI_COMM_WORLD_RANK'), os.environ['tllm_mpi_size'])",
                         "--tp_size", "8", "--pp_size", "2"], env=env, capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "None 16"  # the MPI environment is stripped before the server starts
