""""Hosts" for tests: Linux network namespaces, each joined to this machine by a veth pair.

Host `i` of a `Hosts` gets the namespace `omnipost-<pid>-<i>` and a /30 of a 10.x.y.0/24 that no
route of this machine touches: `gateway(i)` (.4i+1) on the machine's side, `address(i)` (.4i+2)
inside, with a default route through the gateway, so a process in the namespace reaches every
address of the machine's side (PgBouncer listening there, a test's receiver) and nothing else: not
127.0.0.1 of the machine, not the other namespaces. `popen(i, …)` runs a command inside with its own
UTS namespace and hostname (`ip netns exec … unshare --uts`), so `socket.gethostname()` differs per
host as it does on real machines.

Needs root (`ip netns`). Everything is removed on exit (the processes still inside are killed, the
namespaces deleted, which deletes their veth pairs); namespaces this module left behind by a killed
test run (named after a process that no longer exists) are removed at the next start.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Sequence

PREFIX = "omnipost-"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)  # noqa: S603, S607


def _namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


def _remove_leftovers() -> None:
    for name in _namespaces():
        found = re.fullmatch(rf"{PREFIX}(\d+)-\d+", name)
        if found and not os.path.exists(f"/proc/{found.group(1)}"):
            _kill_inside(name)
            _ip("netns", "del", name, check=False)


def _kill_inside(name: str) -> None:
    pids = _ip("netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _free_subnet() -> str:
    """`10.x.y` whose /24 no address or route of this machine uses."""
    taken = _ip("-4", "route", "show", "table", "all").stdout + _ip("-4", "addr").stdout
    for _ in range(200):
        prefix = f"10.{random.randint(200, 254)}.{random.randint(0, 255)}"  # noqa: S311 - not crypto
        if f"{prefix}." not in taken:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 for test namespaces")


class Hosts:
    """`count` namespaces; `gateway(i)`, `address(i)`, `name(i)`, `popen(i, argv, hostname=…)`."""

    def __init__(self, count: int) -> None:
        if not 0 < count <= 60:
            raise ValueError("between 1 and 60 hosts")
        self.count = count
        self.subnet = ""
        self.procs: list[subprocess.Popen] = []
        self._made: list[str] = []

    def name(self, i: int) -> str:
        return f"{PREFIX}{os.getpid()}-{i}"

    def gateway(self, i: int) -> str:
        return f"{self.subnet}.{4 * i + 1}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{4 * i + 2}"

    def gateways(self) -> list[str]:
        return [self.gateway(i) for i in range(self.count)]

    def start(self) -> Hosts:
        _remove_leftovers()
        self.subnet = _free_subnet()
        token = f"{random.getrandbits(20):05x}"  # noqa: S311 - interface names are at most 15 bytes
        try:
            for i in range(self.count):
                ns, outside, inside = self.name(i), f"op{token}h{i}", f"op{token}n{i}"
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                _ip("link", "set", inside, "netns", ns)
                _ip("addr", "add", f"{self.gateway(i)}/30", "dev", outside)
                _ip("link", "set", outside, "up")
                _ip("-n", ns, "addr", "add", f"{self.address(i)}/30", "dev", inside)
                _ip("-n", ns, "link", "set", inside, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "route", "add", "default", "via", self.gateway(i))
        except BaseException:
            self.close()
            raise
        return self

    def popen(self, i: int, argv: Sequence[str], *, hostname: str, **kwargs) -> subprocess.Popen:  # noqa: ANN003
        """`argv` inside host `i`, under `hostname` (its own UTS namespace)."""
        command = [
            "ip", "netns", "exec", self.name(i), "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
            hostname, *argv,
        ]  # fmt: skip
        proc = subprocess.Popen(command, **kwargs)  # noqa: S603
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for ns in self._made:
            _kill_inside(ns)
            _ip("netns", "del", ns, check=False)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and set(self._made) & _namespaces():
            time.sleep(0.05)
        self._made.clear()

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
