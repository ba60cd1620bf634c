"""Small helpers for cluster-up.sh that are awkward in bash: free ports and health waits.

Standard library only, so it runs before (and without) the project virtualenv.

    python3 uptools.py ports 5                     -> five free loopback TCP ports, one per line
    python3 uptools.py wait NAME URL [--cacert F] [--cert F --key F] [--timeout S]
"""

from __future__ import annotations

import argparse
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request


def free_ports(count: int) -> list[int]:
    """Ask the kernel for `count` distinct free loopback ports.

    All sockets stay open until every port is chosen, so the kernel never hands out the same one
    twice; a later bind by another program can still race us, which cluster-up reports clearly.
    """
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _ssl_context(cacert: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """TLS context for the probe: verify against our CA when given, else accept self-signed serving certs
    (kube-controller-manager and kube-scheduler generate their own on start)."""
    if cacert:
        ctx = ssl.create_default_context(cafile=cacert)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert and key:
        ctx.load_cert_chain(cert, key)
    return ctx


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as dead: it exited and waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_healthy(name: str, url: str, timeout_s: float, ctx: ssl.SSLContext | None, pid: int | None) -> float:
    """Poll `url` until it answers 200; print a progress line every 5 s. Returns the seconds waited.

    With `pid`, fail at once when that process exits, instead of waiting out the timeout.
    """
    start = time.monotonic()
    next_note = start + 5
    last_error = "no answer yet"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3, context=ctx) as resp:
                if resp.status == 200:
                    return time.monotonic() - start
                last_error = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last_error = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
        except (OSError, ssl.SSLError) as exc:
            last_error = str(exc)
        now = time.monotonic()
        if pid is not None and not _alive(pid):
            raise TimeoutError(f"{name} (pid {pid}) exited before {url} became healthy: {last_error}")
        if now - start > timeout_s:
            raise TimeoutError(f"{name} at {url} not healthy after {timeout_s:.0f}s: {last_error}")
        if now >= next_note:
            print(f"  ... waiting for {name} ({now - start:.0f}s): {last_error}", file=sys.stderr, flush=True)
            next_note = now + 5
        time.sleep(0.25)


def main(argv: list[str]) -> int:
    """CLI entry point; see the module docstring."""
    parser = argparse.ArgumentParser(prog="uptools.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    ports = sub.add_parser("ports")
    ports.add_argument("count", type=int)
    wait = sub.add_parser("wait")
    wait.add_argument("name")
    wait.add_argument("url")
    wait.add_argument("--cacert")
    wait.add_argument("--cert")
    wait.add_argument("--key")
    wait.add_argument("--insecure", action="store_true", help="accept any serving certificate")
    wait.add_argument("--timeout", type=float, default=120.0)
    wait.add_argument("--pid", type=int, help="fail as soon as this process exits")
    args = parser.parse_args(argv)
    if args.cmd == "ports":
        print("\n".join(str(p) for p in free_ports(args.count)))
        return 0
    ctx = None
    if args.url.startswith("https://"):
        ctx = _ssl_context(None if args.insecure else args.cacert, args.cert, args.key)
    try:
        waited = wait_healthy(args.name, args.url, args.timeout, ctx, args.pid)
    except TimeoutError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 1
    print(f"{waited:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
