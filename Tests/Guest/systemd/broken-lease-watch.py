"""A D-Bus subscriber vigild did not write (jeepney, from Debian): subscribes
on the system bus to org.vigil.Vigil1.Host.SleepBrokeLease, as a lease's
holder would, and prints each signal as a JSON line:
{"lease": PATH, "holder": S, "name": S, "slept_usec": N, "wake_cause": S}.
Prints "subscribed" once the match is in place. Runs until killed."""
import json
import sys

from jeepney import MatchRule, message_bus
from jeepney.io.blocking import Proxy, open_dbus_connection

conn = open_dbus_connection(bus="SYSTEM")
# The bus matches the sender by its well-known name; the signals carry
# vigild's unique name, so the local filter leaves the sender out.
Proxy(message_bus, conn).AddMatch(MatchRule(
    type="signal", sender="org.vigil.Vigil1", interface="org.vigil.Vigil1.Host", member="SleepBrokeLease"))
print("subscribed", flush=True)
with conn.filter(MatchRule(type="signal", interface="org.vigil.Vigil1.Host", member="SleepBrokeLease")) as queue:
    while True:
        body = conn.recv_until_filtered(queue).body
        lease, holder, name, slept, cause = body
        print(json.dumps({"lease": lease, "holder": holder, "name": name, "slept_usec": slept, "wake_cause": cause}), flush=True)
