#!/usr/bin/python3
"""A SIP-style keep-alive peer for the voip-socket tests, as its own process
so a test can freeze it with SIGSTOP.

Usage: voip-pong-server.py [--rcvbuf BYTES]
Listens on 127.0.0.1 (a free port), prints the port on stdout, and answers
every CRLFCRLF ping with a CRLF pong (RFC 5626). --rcvbuf shrinks the receive
buffer of accepted sockets, so a frozen server closes its TCP window fast.
"""
import selectors
import socket
import sys

rcvbuf = int(sys.argv[sys.argv.index("--rcvbuf") + 1]) if "--rcvbuf" in sys.argv else 0
listener = socket.socket()
if rcvbuf:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
listener.bind(("127.0.0.1", 0))
listener.listen(16)
listener.setblocking(False)
print(listener.getsockname()[1], flush=True)

selector = selectors.DefaultSelector()
selector.register(listener, selectors.EVENT_READ)
pending = {}
while True:
    for key, _ in selector.select():
        if key.fileobj is listener:
            conn, _ = listener.accept()
            conn.setblocking(False)
            pending[conn] = b""
            selector.register(conn, selectors.EVENT_READ)
            continue
        conn = key.fileobj
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            selector.unregister(conn)
            pending.pop(conn, None)
            conn.close()
            continue
        buffer = pending[conn] + data
        while b"\r\n\r\n" in buffer:
            _, _, buffer = buffer.partition(b"\r\n\r\n")
            conn.send(b"\r\n")
        pending[conn] = buffer[-3:]
