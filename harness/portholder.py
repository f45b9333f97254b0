"""A process of the harness that holds a port (the busy_port fault).

``python -m harness.portholder PORT MODE``; MODE is ``bound`` (bind only), ``listening``
(listen, never accept) or ``accepting`` (accept every connection, never send a byte: a foreign
server on the port). Prints ``ready`` once the port is held; dies with its parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass
    if os.getppid() != parent:
        os._exit(3)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", port))
    if mode != "bound":
        s.listen(128)
    print("ready", flush=True)
    kept = []
    if mode == "accepting":
        while True:
            conn, _ = s.accept()
            kept.append(conn)      # keep it open, never answer
    else:
        signal.pause()


if __name__ == "__main__":
    main()
