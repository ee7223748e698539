#!/usr/bin/python3
"""A registrar that lists bindings as the test scripts them, for the SIP
binding lookup of the voip-socket tests (kamailio lists every binding in one
comma-separated Contact header; other registrars use several headers, quote
display names with commas, or rewrite the Contact URI).

Usage: sip-registrar-stub.py PORT CONTACT_LINE...
Listens on 127.0.0.1:PORT and answers each
REGISTER with 200 OK, its Via, From, To, Call-ID and CSeq, and one Contact
header per CONTACT_LINE, in which "{ours}" is replaced by the request's
Contact value and "{instance}" by its +sip.instance parameter. Each REGISTER
is logged on stderr ("REGISTER cseq N expires E").
"""
import re
import socket
import sys
import threading

lines = sys.argv[2:]
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen(4)


def serve(connection):
    buffer = b""
    while True:
        data = connection.recv(65536)
        if not data:
            return
        buffer += data
        while b"\r\n\r\n" in buffer:
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            text = head.decode(errors="replace")
            if not text.strip():
                continue  # a CRLF keep-alive
            headers = {}
            for line in text.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                headers.setdefault(name.strip().lower(), value.strip())
            ours = headers.get("contact", "")
            instance = re.search(r'\+sip\.instance="([^"]*)"', ours)
            sys.stderr.write("REGISTER cseq %s expires %s\n" % (headers.get("cseq", "").split(" ")[0], headers.get("expires")))
            sys.stderr.flush()
            answer = ["SIP/2.0 200 OK"] + ["%s: %s" % (n, headers.get(n.lower(), "")) for n in ("Via", "From", "To", "Call-ID", "CSeq")]
            answer += ["Contact: " + line.replace("{ours}", ours).replace("{instance}", instance.group(1) if instance else "") for line in lines]
            connection.sendall(("\r\n".join(answer + ["Content-Length: 0", "", ""])).encode())


while True:
    connection, _ = listener.accept()
    threading.Thread(target=serve, args=(connection,), daemon=True).start()
