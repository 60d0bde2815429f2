"""peer is the program that tests of walkit.testing.network run inside a host: `python peer.py COMMAND ARGS`.

Servers print `ready` once they listen; the other commands print one word per result.
"""

from __future__ import annotations

import select
import signal
import socket
import subprocess
import sys
import threading
import time


def echo(port: str, bind: str = "0.0.0.0") -> None:
    """echo serves TCP on bind:port and sends every line back to its connection."""
    server = socket.create_server((bind, int(port)))
    say("ready")
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_echo_lines, args=(conn,), daemon=True).start()


def _echo_lines(conn: socket.socket) -> None:
    with conn, conn.makefile("rwb") as stream:
        for line in stream:
            stream.write(line)
            stream.flush()


def connect(address: str, port: str, timeout: str) -> None:
    """connect prints what a TCP connect to address:port gives within timeout: ok, timeout or refused."""
    try:
        socket.create_connection((address, int(port)), timeout=float(timeout)).close()
        say("ok")
    except TimeoutError:
        say("timeout")
    except ConnectionRefusedError:
        say("refused")


def udp_listen(port: str) -> None:
    """udp_listen prints every datagram that reaches UDP port `port`, one per line."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", int(port)))
    say("ready")
    while True:
        say(sock.recv(65536).decode())


def udp_send(address: str, port: str, message: str) -> None:
    """udp_send sends one datagram."""
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(message.encode(), (address, int(port)))


def chat(address: str, port: str) -> None:
    """chat keeps one TCP connection and obeys stdin: `send TEXT TIMEOUT` or `recv TIMEOUT`.

    Each command prints `got TEXT` for the next line that comes back within TIMEOUT, or `timeout`.
    """
    conn = socket.create_connection((address, int(port)), timeout=10)
    conn.setblocking(False)
    say("connected")
    pending = b""
    for command in sys.stdin:
        words = command.split()
        if words[0] == "send":
            conn.sendall(words[1].encode() + b"\n")
        deadline = time.monotonic() + float(words[-1])
        while b"\n" not in pending and select.select([conn], [], [], max(0, deadline - time.monotonic()))[0]:
            data = conn.recv(65536)
            if not data:
                say("closed")
                return
            pending += data
        if b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            say(f"got {line.decode()}")
        else:
            say("timeout")


def sink(port: str, window: str) -> None:
    """sink reads each TCP connection for `window` seconds from its first byte, prints bytes/s, closes it."""
    server = socket.create_server(("0.0.0.0", int(port)))
    say("ready")
    while True:
        conn, _ = server.accept()
        received = len(conn.recv(1 << 20))
        start = time.monotonic()
        while (left := start + float(window) - time.monotonic()) > 0:
            conn.settimeout(left)
            try:
                received += len(conn.recv(1 << 20))
            except TimeoutError:
                break
        say(f"{received / (time.monotonic() - start):.0f}")
        conn.close()


def source(address: str, port: str) -> None:
    """source sends bytes to address:port as fast as it can until the receiver closes the connection."""
    conn = socket.create_connection((address, int(port)), timeout=30)
    chunk = bytes(1 << 16)
    try:
        while True:
            conn.sendall(chunk)
    except (ConnectionResetError, BrokenPipeError):
        pass


def stubborn() -> None:
    """stubborn ignores SIGTERM, starts a child in its process group, prints `ready CHILD_PID` and waits."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the child inherits the ignored disposition
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    say(f"ready {child.pid}")
    time.sleep(600)


def say(text: str) -> None:
    print(text, flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1].replace("-", "_")](*sys.argv[2:])
