#!/usr/bin/python3
"""An app asking to keep the machine awake, for Vigil's app policy tests
(issue 45), written with jeepney (a D-Bus library Vigil did not write).

Usage: app-policy-client.py BUS_ADDRESS NAME...
Inhibits sleep through org.freedesktop.PowerManagement once per NAME (as
that application name), on one connection, and prints one line per
request on stderr: "inhibit NAME ok COOKIE" or "inhibit NAME error
ERROR_NAME MESSAGE". Then it prints "waiting" and blocks until SIGUSR1,
when it asks again for every NAME, and so on until it is killed.

A NAME "@64k" stands for 65,536 bytes of "x"; "@nul" for a name with a NUL
byte inside; "@evil" for one with terminal escapes and a newline.
"""
import signal
import sys

from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection

PM, PM_PATH = "org.freedesktop.PowerManagement.Inhibit", "/org/freedesktop/PowerManagement/Inhibit"
SPECIAL = {
    "@64k": "x" * 65536,
    "@nul": "before\0after",
    "@evil": "\x1b]0;owned\x07\x1b[31mred\nfake vigild line",
}

address, names = sys.argv[1], sys.argv[2:]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def say(*words):
    sys.stderr.write(" ".join(str(w) for w in words).replace("\n", "\\n").replace("\x1b", "\\e").replace("\x07", "\\a") + "\n")
    sys.stderr.flush()


conn = open_dbus_connection(address)
while True:
    for name in names:
        app = SPECIAL.get(name, name)
        try:
            msg = new_method_call(DBusAddress(PM_PATH, bus_name="org.freedesktop.PowerManagement", interface=PM), "Inhibit", "ss", (app, "testing"))
            reply = conn.send_and_get_reply(msg, timeout=10)
        except Exception as error:  # the bus may drop a connection that sent a bad message
            say("inhibit", name, "failed", type(error).__name__)
            conn = open_dbus_connection(address)
            continue
        if reply.header.message_type == MessageType.error:
            say("inhibit", name, "error", reply.header.fields[HeaderFields.error_name], reply.body[0] if reply.body else "")
        else:
            say("inhibit", name, "ok", reply.body[0])
    say("waiting")
    signal.sigwait({signal.SIGUSR1})
