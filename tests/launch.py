"""What the multi-process tests share: a free port for torchrun's rendezvous (a fixed one collides with
another run, or with what a killed one left listening)."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
