#!/usr/bin/python3
"""A SIP-style keep-alive peer for the voip-socket tests, as its own process
so a test can freeze it with SIGSTOP, kill it and start it again.

Usage: voip-pong-server.py [--host ADDRESS] [--port PORT] [--rcvbuf BYTES]
                           [--tls CERT KEY] [--contact LINE]...
Listens on ADDRESS (default 127.0.0.1) and PORT (default: a free one), prints
the port on stdout, and answers every CRLFCRLF ping with a CRLF pong
(RFC 5626), over TLS with --tls. --rcvbuf shrinks the receive buffer of
accepted sockets, so a frozen server closes its TCP window fast. One thread
per connection: a TLS handshake never holds up the other connections.

With --contact, it is also a registrar that lists bindings as the test
scripts them: each REGISTER gets a 200 OK with its Via, From, To, Call-ID
and CSeq, and one Contact header per --contact LINE, in which "{ours}" is the
request's Contact and "{instance}" its +sip.instance.
"""
import re
import socket
import ssl
import sys
import threading


def option(name, default=None, count=1):
    if name not in sys.argv:
        return default
    at = sys.argv.index(name)
    values = sys.argv[at + 1:at + 1 + count]
    return values[0] if count == 1 else values


rcvbuf = int(option("--rcvbuf", "0"))
contacts = [sys.argv[i + 1] for i, arg in enumerate(sys.argv[:-1]) if arg == "--contact"]
tls = option("--tls", count=2)
context = None
if tls:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls[0], tls[1])

listener = socket.socket()
# A restarted server takes its port back although its old connections linger.
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
if rcvbuf:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
listener.bind((option("--host", "127.0.0.1"), int(option("--port", "0"))))
listener.listen(16)
print(listener.getsockname()[1], flush=True)


def registered(head):
    """The 200 OK to a REGISTER whose head (without the blank line) is `head`."""
    headers = {}
    for line in head.decode(errors="replace").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    ours = headers.get("contact", "")
    instance = re.search(r'\+sip\.instance="([^"]*)"', ours)
    answer = ["SIP/2.0 200 OK"] + ["%s: %s" % (n, headers.get(n.lower(), "")) for n in ("Via", "From", "To", "Call-ID", "CSeq")]
    answer += ["Contact: " + c.replace("{ours}", ours).replace("{instance}", instance.group(1) if instance else "") for c in contacts]
    return "\r\n".join(answer + ["Content-Length: 0", "", ""]).encode()


def serve(conn):
    try:
        if context:
            conn = context.wrap_socket(conn, server_side=True)
        buffer = b""
        while True:
            data = conn.recv(65536)
            if not data:
                break
            buffer += data
            while b"\r\n\r\n" in buffer:
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                conn.sendall(registered(head) if contacts and head.startswith(b"REGISTER ") else b"\r\n")
            if not contacts:
                buffer = buffer[-3:]
    except (OSError, ssl.SSLError):
        pass
    finally:
        conn.close()


while True:
    conn, _ = listener.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
