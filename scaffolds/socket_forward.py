"""Reach the policy server from inside a sandbox that has no network.

The server listens on TCP in the host's network namespace; the sandbox has its own, with only
`lo`. Two plain byte pipes bridge them through a unix socket bind-mounted into the sandbox:

  pi --TCP 127.0.0.1:<port>--> [inside: TcpToUnix] --unix socket--> [host: UnixToTcp] --TCP--> server

The inside half runs as this very file under the sandbox's Python (`python socket_forward.py
--unix SOCK --port N -- CMD...`: listen, then run CMD as a child and exit with its code), so
it uses the standard library only and imports nothing from the project.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading

_BUF = 1 << 16


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes one way until EOF, then half-close so the other side sees the end."""
    try:
        while True:
            data = src.recv(_BUF)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass  # the peer went away: the connection is over in both directions
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _bridge(a: socket.socket, b: socket.socket) -> None:
    t = threading.Thread(target=_pipe, args=(b, a), daemon=True)
    t.start()
    _pipe(a, b)
    t.join()
    a.close()
    b.close()


class _Forwarder:
    """Accept on `listener`, open a fresh upstream per connection with `connect`."""

    def __init__(self, listener: socket.socket, connect) -> None:
        self.listener = listener
        self.connect = connect
        self._closed = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def start(self) -> "_Forwarder":
        self.thread.start()
        return self

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # listener closed
            try:
                upstream = self.connect()
            except OSError as e:
                sys.stderr.write(f"socket_forward: upstream connect failed: {e}\n")
                conn.close()
                continue
            threading.Thread(target=_bridge, args=(conn, upstream), daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()


class UnixToTcp(_Forwarder):
    """Host half: a unix socket at `path` whose connections go to host:port over TCP."""

    def __init__(self, path: str, host: str, port: int, mode: int = 0o666) -> None:
        if os.path.exists(path):
            raise FileExistsError(f"{path} exists; each episode needs its own socket path")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, mode)  # the sandbox's unprivileged uid must be able to connect
        listener.listen(64)
        self.path = path
        super().__init__(listener, lambda: socket.create_connection((host, port), timeout=None))

    def close(self) -> None:
        super().close()
        if os.path.exists(self.path):
            os.unlink(self.path)


class TcpToUnix(_Forwarder):
    """Inside half: 127.0.0.1:port whose connections go to the unix socket at `path`."""

    def __init__(self, port: int, path: str) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(64)
        self.port = listener.getsockname()[1]

        def connect() -> socket.socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            return s

        super().__init__(listener, connect)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="listen on 127.0.0.1:PORT, forward to a unix "
                                                 "socket, run CMD meanwhile and exit with its code")
    parser.add_argument("--unix", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command after --")
    forwarder = TcpToUnix(args.port, args.unix).start()
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    code = child.wait()
    forwarder.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
