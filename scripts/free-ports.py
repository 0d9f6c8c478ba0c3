#!/usr/bin/env python3
"""Prints N distinct free loopback ports, below the kernel's ephemeral range.

A port picked by binding port 0 and closing again comes from the ephemeral range, where the kernel hands it to
the next outgoing connection or `bind(0)` (a health-check curl, vLLM's own `get_open_port()` for torch's store)
before the process it was picked for binds it: vLLM's engine core then dies at start with "Address already in
use". Ports below that range are never handed out by the kernel. These come from 10000-19999: the Rust tests' own
`free_port` (tests/it/common/router.rs) walks 20000-31999.

    scripts/free-ports.py N [--not PORT...]    (--not: ports picked before and not bound yet)
"""
import random
import socket
import sys


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def main():
    args = sys.argv[1:]
    taken = set()
    if len(args) > 1 and args[1] == "--not" and all(a.isdigit() for a in args[2:]):
        taken = {int(a) for a in args[2:]}
        args = args[:1]
    if len(args) != 1 or not args[0].isdigit() or int(args[0]) < 1:
        sys.exit("usage: scripts/free-ports.py N [--not PORT...]")
    n = int(args[0])
    low, high = 10000, min(19999, ephemeral_low() - 1)
    if high - low < 1000:  # an unusual ephemeral range: fall back to ports the kernel picks
        socks = [socket.socket() for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        print(*(s.getsockname()[1] for s in socks))
        for s in socks:
            s.close()
        return
    ports = []
    for port in random.sample(range(low, high + 1), min(high + 1 - low, 50 * n)):
        if port not in taken and free(port):
            ports.append(port)
            if len(ports) == n:
                print(*ports)
                return
    sys.exit(f"free-ports: fewer than {n} free ports in {low}-{high}")


if __name__ == "__main__":
    main()
