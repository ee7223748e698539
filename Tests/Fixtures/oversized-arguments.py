#!/usr/bin/python3
"""Calls every method of every object vigild exports with an oversized
string in each string, object-path or variant argument in turn, with
jeepney (a D-Bus library Vigil did not write); then Properties.Get, GetAll
and Set with a 30 MiB unknown name.

Usage: oversized-arguments.py BUS_ADDRESS
Prints "call PATH INTERFACE.METHOD ARG OUTCOME LENGTH" per call, where
OUTCOME is the error name or "ok" and LENGTH the error message's length in
bytes, "escaped False" if any error message carried a control character,
and "gone PATH" for a lease object that ended before the walk reached it.
"""
import sys
import xml.etree.ElementTree as ET

from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection

NAME = "org.vigil.Vigil1"
conn = open_dbus_connection(sys.argv[1])
# Control characters and an escape sequence in every oversized value.
BIG = "\x1b[2J\n\r\x07" * (1 << 18)


def call(path, interface, member, signature, body, timeout=60):
    message = new_method_call(DBusAddress(path, bus_name=NAME, interface=interface), member, signature or None, tuple(body))
    return conn.send_and_get_reply(message, timeout=timeout)


def ordinary(t):
    return {"s": "x", "o": "/x", "g": "s", "b": False, "v": ("s", "x"), "d": 1.0}.get(t, 1) if len(t) == 1 else ({} if t.startswith("a{") else [])


def oversized(t):
    return {"s": BIG, "o": "/" + "a" * len(BIG), "v": ("s", BIG)}.get(t)


def report(label, reply):
    if reply.header.message_type == MessageType.error:
        text = reply.body[0] if reply.body else ""
        if any(ord(c) < 0x20 for c in text):
            print("escaped False", label)
        print("call", label, reply.header.fields[HeaderFields.error_name], len(text.encode()))
    else:
        print("call", label, "ok", 0)


def walk(path):
    reply = call(path, "org.freedesktop.DBus.Introspectable", "Introspect", "", [])
    if reply.header.message_type == MessageType.error:
        name = reply.header.fields[HeaderFields.error_name]
        # A lease may end between its parent's listing and this call (the
        # tests' "tick" strategy takes and ends one every 250 ms); any other
        # object that cannot be introspected is a failure, named.
        if name == "org.freedesktop.DBus.Error.UnknownObject" and path.startswith("/org/vigil/Vigil1/lease/"):
            print("gone", path)
            return
        sys.exit("cannot introspect %s: %s %s" % (path, name, reply.body[0] if reply.body else ""))
    node = ET.fromstring(reply.body[0])
    for interface in node.findall("interface"):
        for method in interface.findall("method"):
            types = [a.get("type") for a in method.findall("arg") if a.get("direction", "in") == "in"]
            if "h" in types:
                continue
            for i, t in enumerate(types):
                big = oversized(t)
                if big is None:
                    continue
                body = [big if j == i else ordinary(u) for j, u in enumerate(types)]
                report("%s %s.%s %d" % (path, interface.get("name"), method.get("name"), i),
                       call(path, interface.get("name"), method.get("name"), "".join(types), body))
    for child in node.findall("node"):
        walk(path.rstrip("/") + "/" + child.get("name"))


walk("/")
HUGE = "P" * (30 << 20)
PROPS = "org.freedesktop.DBus.Properties"
report("huge Get", call("/org/vigil/Vigil1", PROPS, "Get", "ss", ["org.vigil.Vigil1.Host", HUGE]))
report("huge GetAll", call("/org/vigil/Vigil1", PROPS, "GetAll", "s", [HUGE]))
report("huge Set", call("/org/vigil/Vigil1", PROPS, "Set", "ssv", ["org.vigil.Vigil1.Host", HUGE, ("s", "x")]))
