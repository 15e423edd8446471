"""Test helpers for the dashboards: a loopback TCP relay whose cable can be pulled, free
ports, and starting/stopping a real MLflow tracking server.

:class:`Relay` forwards 127.0.0.1:<port> to a real server. ``cut()`` closes the listening
socket and every open connection (the client then gets connection errors, as when a
tracking server goes away mid-run); ``restore()`` listens again on the same port. Nothing
in the traffic is looked at or changed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def stop_group(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Stop a process started with ``start_new_session=True`` and the children it started
    (its own process group, by the group id we created)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


class Relay:
    def __init__(self, target_port: int, port: int | None = None):
        self.target = ("127.0.0.1", target_port)
        self.port = port or free_port()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    @property
    def up(self) -> bool:
        return self._listener is not None

    def restore(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(64)
            self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def start_dashboard(store: Path, port: int, root: Path, log: Path) -> tuple[subprocess.Popen, list[str]]:
    """``make dashboard`` (where make exists; else the command it runs) on a store of our own.
    Returns the process (its own session) and the command."""
    import shutil
    import sys

    if shutil.which("make") and (root / "Makefile").is_file():
        # -o: never (re)install from a test, whatever the install stamp's age
        cmd = ["make", "-s", "-o", "install", "-o", ".venv/.installed", "dashboard",
               f"PORT={port}", f"STORE={store}", f"PY={sys.executable}"]
    else:
        cmd = [sys.executable, "-m", "dashboards", "ui", "--store", str(store), "--port", str(port)]
    out = log.open("w")
    proc = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, cmd


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (from /proc/net/tcp{,6})."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # LISTEN
                found.add(address)
    return found
