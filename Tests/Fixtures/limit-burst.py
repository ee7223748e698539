#!/usr/bin/python3
"""Many calls at once against one per-uid limit, with jeepney (a D-Bus
library Vigil did not write). Run as the uid whose limit is tested.

Usage:
  limit-burst.py BUS_ADDRESS inhibit N
      One connection puts N org.freedesktop.ScreenSaver.Inhibit calls in a
      single write, then reads every answer.
  limit-burst.py BUS_ADDRESS begin N BUDGET_USEC
      N connections (with fd passing) each send one BeginBackgroundTask with
      BUDGET_USEC, all before any answer is read; then every answer is read.

Prints "granted K", then each distinct error ("error NAME MESSAGE"), and
exits 0. Granted leases are held until every answer is read.
"""
import sys

from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
from jeepney.io.blocking import open_dbus_connection

address, mode, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
answers = []

if mode == "inhibit":
    conn = open_dbus_connection(address)
    target = DBusAddress("/org/freedesktop/ScreenSaver", bus_name="org.freedesktop.ScreenSaver",
                         interface="org.freedesktop.ScreenSaver")
    first = 1000
    calls = [new_method_call(target, "Inhibit", "ss", ("burst", "call %d" % i)).serialise(serial=first + i)
             for i in range(count)]
    conn.sock.sendall(b"".join(calls))
    waiting = set(range(first, first + count))
    while waiting:
        message = conn.receive(timeout=60)
        serial = message.header.fields.get(HeaderFields.reply_serial)
        if serial in waiting:
            waiting.discard(serial)
            answers.append(message)
    held = [conn]
elif mode == "begin":
    budget = int(sys.argv[4])
    target = DBusAddress("/org/vigil/Vigil1", bus_name="org.vigil.Vigil1", interface="org.vigil.Vigil1.Host")
    held = [open_dbus_connection(address, enable_fds=True) for _ in range(count)]
    serials = []
    for conn in held:
        serials.append(next(conn.outgoing_serial))
        conn.send(new_method_call(target, "BeginBackgroundTask", "sst", ("burst", "limit test", budget)), serial=serials[-1])
    for conn, serial in zip(held, serials):
        while True:
            message = conn.receive(timeout=60)
            if message.header.fields.get(HeaderFields.reply_serial) == serial:
                answers.append(message)
                break
else:
    sys.exit("unknown mode " + mode)

errors = sorted({"error %s %s" % (m.header.fields[HeaderFields.error_name], m.body[0] if m.body else "")
                 for m in answers if m.header.message_type == MessageType.error})
print("granted", sum(1 for m in answers if m.header.message_type == MessageType.method_return))
for line in errors:
    print(line)
sys.stdout.flush()
