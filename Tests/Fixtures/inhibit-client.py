#!/usr/bin/python3
"""A freedesktop inhibit client for Vigil's tests, written with jeepney (a
D-Bus library Vigil did not write).

Usage: inhibit-client.py BUS_ADDRESS SCENARIO
Prints one line per step on stderr; between phases it prints "waiting" and
blocks until SIGUSR1, so the test can look at vigild meanwhile.

Scenarios:
  screensaver  Inhibit on both ScreenSaver paths, HasInhibit/HasInhibitChanged,
               a cookie used from another connection, a second owner replacing
               the name, then UnInhibit of both.
  hold         Inhibit through PowerManagement (sleep) and ScreenSaver (idle),
               then wait (until killed).
  portal       The Inhibit portal backend as xdg-desktop-portal calls it:
               Inhibit with suspend|idle, then Request.Close.
"""
import os
import signal
import sys

from jeepney import DBusAddress, HeaderFields, MatchRule, MessageType, message_bus, new_method_call
from jeepney.io.blocking import Proxy, open_dbus_connection

PM, PM_PATH = "org.freedesktop.PowerManagement.Inhibit", "/org/freedesktop/PowerManagement/Inhibit"
SS = "org.freedesktop.ScreenSaver"

address, scenario = sys.argv[1], sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})


def say(*words):
    sys.stderr.write(" ".join(str(w) for w in words) + "\n")
    sys.stderr.flush()


def pause():
    say("waiting")
    signal.sigwait({signal.SIGUSR1})


def call(conn, dest, path, interface, member, signature=None, body=()):
    reply = conn.send_and_get_reply(new_method_call(DBusAddress(path, bus_name=dest, interface=interface), member, signature, body), timeout=10)
    if reply.header.message_type == MessageType.error:
        return "error", reply.header.fields[HeaderFields.error_name]
    return "ok", reply.body


a = open_dbus_connection(address)
bus = Proxy(message_bus, a)
vigild = bus.GetNameOwner(SS)[0]
say("pid", os.getpid(), "vigild", vigild)

if scenario == "hold":
    say("pm", call(a, "org.freedesktop.PowerManagement", PM_PATH, PM, "Inhibit", "ss", ("jeepney-player", "playing"))[1][0])
    say("ss", call(a, SS, "/org/freedesktop/ScreenSaver", SS, "Inhibit", "ss", ("jeepney-slides", "presenting"))[1][0])
    pause()
    sys.exit(0)

if scenario == "portal":
    portal = "org.freedesktop.impl.portal.desktop.vigil"
    handle = "/org/freedesktop/portal/desktop/request/1_7/vigiltest"
    say("inhibit", *call(a, portal, "/org/freedesktop/portal/desktop", "org.freedesktop.impl.portal.Inhibit", "Inhibit", "ossua{sv}",
                         (handle, "org.example.Films", "", 4 | 8, {"reason": ("s", "watching a film")})))
    pause()
    say("close", call(a, portal, handle, "org.freedesktop.impl.portal.Request", "Close")[0])
    pause()
    sys.exit(0)

rule = MatchRule(type="signal", sender=vigild, interface=PM, member="HasInhibitChanged", path=PM_PATH)
bus.AddMatch(rule)
with a.filter(rule) as changes:
    cookies = []
    for path in ["/org/freedesktop/ScreenSaver", "/ScreenSaver"]:
        status, body = call(a, SS, path, SS, "Inhibit", "ss", ("jeepney-test", "via " + path))
        cookies.append(body[0])
        say("inhibit", path, status, body[0])
    say("has", call(a, vigild, PM_PATH, PM, "HasInhibit")[1][0])
    say("changed", a.recv_until_filtered(changes, timeout=10).body[0])
    pause()
    b = open_dbus_connection(address)
    say("foreign", *call(b, vigild, "/ScreenSaver", SS, "UnInhibit", "u", (cookies[0],)))
    # A desktop's screensaver takes the name over.
    say("replace", Proxy(message_bus, b).RequestName(SS, 2)[0], "owner-is-b", bus.GetNameOwner(SS)[0] == b.unique_name)
    pause()
    for path, cookie in zip(["/org/freedesktop/ScreenSaver", "/ScreenSaver"], cookies):
        say("uninhibit", path, call(a, vigild, path, SS, "UnInhibit", "u", (cookie,))[0])
    say("has", call(a, vigild, PM_PATH, PM, "HasInhibit")[1][0])
    say("changed", a.recv_until_filtered(changes, timeout=10).body[0])
