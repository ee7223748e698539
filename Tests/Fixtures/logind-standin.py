#!/usr/bin/python3
"""A stand-in for systemd-logind, for Vigil's tests (logind needs systemd as PID 1).

Implements the documented parts of org.freedesktop.login1.Manager
(org.freedesktop.login1(5)) that Vigil uses:
  Inhibit(s what, s who, s why, s mode) -> h   the inhibitor lives while any copy of the fd is open
  ListInhibitors() -> a(ssssuu)                 what, who, why, mode, uid, pid
  signal PrepareForSleep(b start)
  Suspend(b interactive)                        recorded as "suspend" in History (nothing sleeps)
  ListSessions() -> a(susso)                    id, uid, user, seat, path
  Properties.Get: the Manager's PreparingForSleep; a session's Class, IdleHint,
      IdleSinceHintMonotonic
and a test-only interface org.vigil.Test.LogindStandIn:
  SimulateSleep(t max_delay_usec) -> (t waited_usec, b timed_out)
      emits PrepareForSleep(true), waits until every sleep delay lock is closed
      (or max_delay_usec, like InhibitDelayMaxUSec), then PrepareForSleep(false)
  WaitForCount(u n, t timeout_usec) -> b       returns when n inhibitors exist
  History() -> as                               "add N" / "remove N" after each change
  RefuseInhibits(u n)                           the next n Inhibit (or Suspend) calls fail with
      org.freedesktop.login1.OperationInProgress, as real logind answers while its
      own sleep operation is finishing (right after a resume)
  DenyInhibits(b deny)                          Inhibit fails with AccessDenied, as logind
      answers an unprivileged user without polkit's consent
  AddSession(s id, s user, s class, b idle, t idle_since_monotonic_usec)
  SetPreparingForSleep(b preparing)             what PreparingForSleep reads
  EmitPrepareForSleep(b start)                  only the signal (a sleep forced past
      every block inhibitor, as root's `systemctl suspend -i` or the lid switch)
  WaitForSuspend(t timeout_usec) -> b           returns once Suspend was called
Usage: logind-standin.py BUS_ADDRESS   (prints "ready" once it owns the name)
"""
import os
import sys
import time

import dbus
import dbus.mainloop.glib
import dbus.service
from gi.repository import GLib

MANAGER = "org.freedesktop.login1.Manager"
PROPERTIES = "org.freedesktop.DBus.Properties"
SESSION = "org.freedesktop.login1.Session"
TEST = "org.vigil.Test.LogindStandIn"
WHATS = {"shutdown", "sleep", "idle", "handle-power-key", "handle-suspend-key",
         "handle-hibernate-key", "handle-lid-switch"}


class Manager(dbus.service.Object):
    def __init__(self, bus):
        super().__init__(bus, "/org/freedesktop/login1")
        self.bus = bus
        self.inhibitors = {}  # read end -> (what, who, why, mode, uid, pid)
        self.history = []
        self.count_waiters = []  # (n, reply, error, timeout source)
        self.sleep = None  # (started, reply, timeout source) while a sleep is pending
        self.refusals = 0  # Inhibit calls still to refuse as "operation in progress"
        self.deny = False  # refuse every Inhibit as AccessDenied
        self.sessions = []  # Session objects
        self.preparing = False
        self.suspends = 0
        self.suspend_waiters = []

    def _invalid(self, message):
        return dbus.exceptions.DBusException(message, name="org.freedesktop.DBus.Error.InvalidArgs")

    @dbus.service.method(MANAGER, in_signature="ssss", out_signature="h", sender_keyword="sender")
    def Inhibit(self, what, who, why, mode, sender=None):
        if self.deny:
            raise dbus.exceptions.DBusException("Permission denied", name="org.freedesktop.DBus.Error.AccessDenied")
        if self.refusals > 0:
            self.refusals -= 1
            self.history.append("refused")
            raise dbus.exceptions.DBusException(
                "The operation inhibition has been requested for is already running",
                name="org.freedesktop.login1.OperationInProgress")
        items = what.split(":")
        if not what or any(w not in WHATS for w in items):
            raise self._invalid("invalid what specification %r" % what)
        if mode not in ("block", "delay"):
            raise self._invalid("invalid mode specification %r" % mode)
        if mode == "delay" and any(w not in ("sleep", "shutdown") for w in items):
            raise self._invalid("delay inhibitors only make sense for sleep and shutdown")
        dbus_obj = self.bus.get_object("org.freedesktop.DBus", "/org/freedesktop/DBus")
        uid = int(dbus_obj.GetConnectionUnixUser(sender, dbus_interface="org.freedesktop.DBus"))
        pid = int(dbus_obj.GetConnectionUnixProcessID(sender, dbus_interface="org.freedesktop.DBus"))
        r, w = os.pipe()  # logind hands out a FIFO's write end; a pipe behaves the same
        self.inhibitors[r] = (what, who, why, mode, uid, pid)
        GLib.io_add_watch(r, GLib.IO_HUP | GLib.IO_ERR, self._closed)
        self._changed("add")
        fd = dbus.types.UnixFd(w)  # dups w
        os.close(w)
        return fd

    def _closed(self, fd, condition):
        self.inhibitors.pop(fd, None)
        os.close(fd)
        self._changed("remove")
        if self.sleep and not self._delay_locks():
            self._finish_sleep(False)
        return False

    def _changed(self, kind):
        n = len(self.inhibitors)
        self.history.append("%s %d" % (kind, n))
        for waiter in [w for w in self.count_waiters if w[0] == n]:
            self.count_waiters.remove(waiter)
            GLib.source_remove(waiter[3])
            waiter[1](True)

    def _delay_locks(self):
        return [i for i in self.inhibitors.values() if i[3] == "delay" and "sleep" in i[0].split(":")]

    @dbus.service.method(MANAGER, in_signature="", out_signature="a(ssssuu)")
    def ListInhibitors(self):
        return dbus.Array([dbus.Struct(v, signature="ssssuu") for v in self.inhibitors.values()], signature="(ssssuu)")

    @dbus.service.signal(MANAGER, signature="b")
    def PrepareForSleep(self, start):
        pass

    @dbus.service.method(TEST, in_signature="t", out_signature="tb", async_callbacks=("reply", "error"))
    def SimulateSleep(self, max_delay_usec, reply, error):
        self.PrepareForSleep(True)
        started = time.monotonic()
        source = GLib.timeout_add(max(1, int(max_delay_usec / 1000)), lambda: self._finish_sleep(True) and False)
        self.sleep = (started, reply, source)
        if not self._delay_locks():
            self._finish_sleep(False)

    def _finish_sleep(self, timed_out):
        if not self.sleep:
            return False
        started, reply, source = self.sleep
        self.sleep = None
        if not timed_out:
            GLib.source_remove(source)
        waited = int((time.monotonic() - started) * 1e6)
        self.PrepareForSleep(False)
        reply(dbus.UInt64(waited), dbus.Boolean(timed_out))
        return False

    @dbus.service.method(TEST, in_signature="ut", out_signature="b", async_callbacks=("reply", "error"))
    def WaitForCount(self, n, timeout_usec, reply, error):
        if len(self.inhibitors) == n:
            reply(True)
            return
        waiter = [n, reply, error, None]

        def expire():
            if waiter in self.count_waiters:
                self.count_waiters.remove(waiter)
                reply(False)
            return False

        waiter[3] = GLib.timeout_add(max(1, int(timeout_usec / 1000)), expire)
        self.count_waiters.append(waiter)

    @dbus.service.method(MANAGER, in_signature="b", out_signature="")
    def Suspend(self, interactive):
        if self.refusals > 0:
            self.refusals -= 1
            self.history.append("suspend refused")
            raise dbus.exceptions.DBusException(
                "There's already a shutdown or sleep operation in progress",
                name="org.freedesktop.login1.OperationInProgress")
        self.suspends += 1
        self.history.append("suspend")
        for reply in self.suspend_waiters:
            reply(True)
        self.suspend_waiters = []

    @dbus.service.method(TEST, in_signature="t", out_signature="b", async_callbacks=("reply", "error"))
    def WaitForSuspend(self, timeout_usec, reply, error):
        if self.suspends > 0:
            reply(True)
            return
        self.suspend_waiters.append(reply)

        def expire():
            if reply in self.suspend_waiters:
                self.suspend_waiters.remove(reply)
                reply(False)
            return False

        GLib.timeout_add(max(1, int(timeout_usec / 1000)), expire)

    @dbus.service.method(MANAGER, in_signature="", out_signature="a(susso)")
    def ListSessions(self):
        return dbus.Array([dbus.Struct((s.id, dbus.UInt32(1000), s.user, "seat0", dbus.ObjectPath(s.path)), signature="susso")
                           for s in self.sessions], signature="(susso)")

    @dbus.service.method(PROPERTIES, in_signature="ss", out_signature="v")
    def Get(self, interface, name):
        if interface == MANAGER and name == "PreparingForSleep":
            return dbus.Boolean(self.preparing)
        raise dbus.exceptions.DBusException("no property %s" % name, name="org.freedesktop.DBus.Error.UnknownProperty")

    @dbus.service.method(TEST, in_signature="sssbt", out_signature="")
    def AddSession(self, id, user, klass, idle, since):
        self.sessions.append(Session(self.bus, str(id), str(user), str(klass), bool(idle), int(since)))

    @dbus.service.method(TEST, in_signature="b", out_signature="")
    def SetPreparingForSleep(self, preparing):
        self.preparing = bool(preparing)

    @dbus.service.method(TEST, in_signature="b", out_signature="")
    def EmitPrepareForSleep(self, start):
        self.PrepareForSleep(bool(start))

    @dbus.service.method(TEST, in_signature="b", out_signature="")
    def DenyInhibits(self, deny):
        self.deny = bool(deny)

    @dbus.service.method(TEST, in_signature="u", out_signature="")
    def RefuseInhibits(self, n):
        self.refusals = int(n)

    @dbus.service.method(TEST, in_signature="", out_signature="as")
    def History(self):
        return dbus.Array(self.history, signature="s")


class Session(dbus.service.Object):
    def __init__(self, bus, id, user, klass, idle, since):
        self.id, self.user, self.klass, self.idle, self.since = id, user, klass, idle, since
        self.path = "/org/freedesktop/login1/session/_3" + id
        super().__init__(bus, self.path)

    @dbus.service.method(PROPERTIES, in_signature="ss", out_signature="v")
    def Get(self, interface, name):
        values = {"Class": dbus.String(self.klass), "IdleHint": dbus.Boolean(self.idle),
                  "IdleSinceHintMonotonic": dbus.UInt64(self.since)}
        if interface != SESSION or name not in values:
            raise dbus.exceptions.DBusException("no property %s" % name, name="org.freedesktop.DBus.Error.UnknownProperty")
        return values[name]


def main():
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    bus = dbus.bus.BusConnection(sys.argv[1])
    name = dbus.service.BusName("org.freedesktop.login1", bus, do_not_queue=True)
    manager = Manager(bus)
    print("ready", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()
