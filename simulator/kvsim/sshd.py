"""The ``sshd`` stand-in of a multi-node kvsim engine (``python -m kvsim.multinode sshd ARGS``): it listens where
sshd would (``-p``, ``-o ListenAddress=``), refuses to start without a host key, and holds a connection per launch
from the ``mpirun`` stand-in (kvsim.multinode), admitting only a public key in its authorized keys. It speaks a
one-line protocol of its own, not SSH (its banner says so): only these stand-ins talk to it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

BANNER = b"SSH-2.0-kvsim_sshd (a kvsim stand-in, not SSH)\r\n"


def err(prog: str, message: str) -> None:
    print(f"{prog}: {message}", file=sys.stderr, flush=True)


@dataclass
class SshdOptions:
    port: int = 22
    listen: str = "0.0.0.0"
    host_keys: list[str] = field(default_factory=list)
    authorized_keys: str = ".ssh/authorized_keys"


SSHD_FLAGS, SSHD_WITH_ARG = set("DedqtT46"), set("pohfEcguCk")


def parse_sshd(argv: list[str]) -> SshdOptions:
    opts, i = SshdOptions(), 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-") or len(arg) < 2 or (arg[1] not in SSHD_FLAGS | SSHD_WITH_ARG):
            raise ValueError(f"unknown option or argument {arg!r}")
        if arg[1] in SSHD_FLAGS:
            i += 1
            continue
        value = arg[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
        if value is None:
            raise ValueError(f"option {arg} needs an argument")
        i += 1 if arg[2:] else 2
        if arg[1] == "p":
            opts.port = int(value)
        elif arg[1] == "h":
            opts.host_keys.append(value)
        elif arg[1] == "o":
            key, _, val = value.replace("=", " ", 1).partition(" ")
            key, val = key.lower(), val.strip()
            if key == "listenaddress":
                opts.listen = val
            elif key == "port":
                opts.port = int(val)
            elif key == "hostkey":
                opts.host_keys.append(val)
            elif key == "authorizedkeysfile":
                opts.authorized_keys = val
    return opts


def key_lines(path: str) -> set[str]:
    """The ``type base64`` part of each public key line (options and comments ignored)."""
    keys = set()
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        words = line.split()
        for i, word in enumerate(words[:-1]):
            if word.startswith(("ssh-", "ecdsa-", "sk-")):
                keys.add(f"{word} {words[i + 1]}")
                break
    return keys


def _serve_launch(conn: socket.socket, peer: str, authorized: set[str]) -> None:
    """One connection: a probe (closes at once) or a launch (key, ranks) held until the job ends."""
    try:
        _launch(conn, peer, authorized)
    except OSError:  # a probe that resets, a leader gone: nothing to serve
        pass


def _launch(conn: socket.socket, peer: str, authorized: set[str]) -> None:
    with conn:
        conn.sendall(BANNER)
        stream = conn.makefile("rb")
        first = stream.readline().decode(errors="replace").split()
        if not first:
            return  # a TCP probe
        if first[0] != "KVSIM-MPI" or " ".join(first[1:3]) not in authorized:
            conn.sendall(b"DENIED Permission denied (publickey).\n")
            print(f"kvsim sshd: refused a launch from {peer}: key not in the authorized keys", flush=True)
            return
        ranks = stream.readline().decode(errors="replace").strip()
        conn.sendall(b"OK\n")
        print(f"kvsim sshd: {ranks} started for the launch from {peer}", flush=True)
        while stream.read(1):
            pass
        print(f"kvsim sshd: {ranks} ended (the launch from {peer} closed)", flush=True)


def sshd(argv: list[str]) -> int:
    try:
        opts = parse_sshd(argv)
    except ValueError as exc:
        err("sshd", str(exc))
        return 255
    if not opts.host_keys or not all(os.access(k, os.R_OK) for k in opts.host_keys):
        err("sshd", f"no hostkeys available -- exiting. (looked for {opts.host_keys or 'none given'})")
        return 1
    try:
        authorized = key_lines(opts.authorized_keys)
    except OSError as exc:
        err("sshd", f"cannot read authorized keys {opts.authorized_keys}: {exc}")
        return 1
    server = socket.create_server((opts.listen, opts.port), reuse_port=False)
    print(f"kvsim sshd: listening on {opts.listen} port {opts.port} ({len(authorized)} authorized key(s))", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        conn, addr = server.accept()
        threading.Thread(target=_serve_launch, args=(conn, f"{addr[0]}:{addr[1]}", authorized), daemon=True).start()
