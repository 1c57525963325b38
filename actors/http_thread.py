"""An ASGI app served by uvicorn in a daemon thread of the current process: how the policy
server and the recording proxy listen without a process of their own."""
from __future__ import annotations

import asyncio
import socket
import threading
import time


class ThreadedServer:
    def __init__(self, app, host: str, port: int = 0, name: str = "http-server") -> None:
        import uvicorn
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self.host, self.port = host, sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=60)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._server.serve(sockets=[sock])),
                                        name=name, daemon=True)
        self._thread.start()
        deadline = time.time() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.time() > deadline:
                raise RuntimeError(f"{name} did not start on {host}:{self.port}")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def bind_address(host: str, spans_nodes: bool) -> str:
    """rollout.server_host: 'auto' is loopback when the run is on one node, and this node's
    own address when it spans nodes (never all interfaces); anything else is taken as given."""
    if host != "auto":
        return host
    import ray
    return ray.util.get_node_ip_address() if spans_nodes and ray.is_initialized() else "127.0.0.1"
