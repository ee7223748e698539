import Foundation
import Testing
import VigilDBus
import VigilHost
import VigilKit

/// vigild's API from python3-dbus (libdbus underneath, but its own
/// marshalling): every property and method, then malformed and random calls.
extension EndToEnd {
    @Suite(.serialized) struct DBusClientsPythonTests {
        static let prelude = """
            import sys, dbus
            NAME = "\(VigilAPI.busName)"; ROOT = "\(VigilAPI.rootPath)"
            HOST = "\(VigilAPI.hostInterface)"; STRATEGY = "\(VigilAPI.strategyInterface)"; LEASE = "\(VigilAPI.leaseInterface)"
            PROPS = "\(VigilAPI.propertiesInterface)"
            bus = dbus.bus.BusConnection(sys.argv[1])

            def sig(v):
                # The D-Bus signature of a value as dbus-python decoded it.
                simple = [(dbus.Boolean, "b"), (dbus.Byte, "y"), (dbus.Int16, "n"), (dbus.UInt16, "q"),
                          (dbus.Int32, "i"), (dbus.UInt32, "u"), (dbus.Int64, "x"), (dbus.UInt64, "t"),
                          (dbus.Double, "d"), (dbus.ObjectPath, "o"), (dbus.Signature, "g"), (dbus.String, "s")]
                for t, s in simple:
                    if isinstance(v, t): return s
                if isinstance(v, dbus.Dictionary): return "a{" + v.signature + "}"
                if isinstance(v, dbus.Array): return "a" + v.signature
                if isinstance(v, dbus.Struct): return "(" + "".join(sig(x) for x in v) + ")"
                return "?" + type(v).__name__

            def props_of(path, iface):
                obj = bus.get_object(NAME, path, introspect=False)
                return dbus.Interface(obj, PROPS)

            def error_name(f):
                try:
                    f()
                    return "no error"
                except dbus.DBusException as e:
                    return e.get_dbus_name()

            """

        /// Reads every property of the Host, Strategy and Lease interfaces
        /// (Get one by one and GetAll) and calls every method.
        static let everything = prelude + """
            host = props_of(ROOT, HOST)
            names = sys.argv[2].split(",")
            values = {}
            for name in names:
                value = host.Get(HOST, name)
                values[name] = value
                print("host", name, sig(value))
            all_host = host.GetAll(HOST)
            print("host GetAll", sorted(all_host.keys()) == sorted(names),
                  all(all_host[n] == values[n] for n in names if n != "SurvivalSeconds"))

            # Counters read when asked (held time of an active lease) move between two reads.
            live = set(sys.argv[5].split(","))
            for path in values["Strategies"]:
                p = props_of(path, STRATEGY)
                got = p.GetAll(STRATEGY)
                for name in sys.argv[3].split(","):
                    v = p.Get(STRATEGY, name)
                    assert v == got[name] or name in live, (path, name)
                    print("strategy", str(got["Name"]), name, sig(v))

            hold = None
            for path in values["Leases"]:
                try:
                    got = props_of(path, LEASE).GetAll(LEASE)
                except dbus.DBusException as e:
                    continue  # a `tick` lease released since the listing
                if got["Strategy"] == "mail-sync":
                    hold = (path, got)
            path, got = hold
            p = props_of(path, LEASE)
            for name in sys.argv[4].split(","):
                print("lease", name, sig(p.Get(LEASE, name)))

            api = dbus.Interface(bus.get_object(NAME, ROOT, introspect=False), HOST)
            leases = api.ListLeases()
            print("ListLeases", sig(leases))
            mine = [l for l in leases if str(l[0]) == path][0]
            print("ListLeases matches lease object",
                  list(mine[1:]) == [got["Id"], got["Strategy"], got["Kind"], got["Holds"], got["Reason"],
                                     got["AcquiredAt"], got["Deadline"], got["Renewals"], got["State"]])
            strategies = api.ListStrategies()
            print("ListStrategies", sig(strategies), sorted(str(s[1]) for s in strategies))
            runs = api.Survival(dbus.UInt64(0))
            print("Survival", sig(runs), len(runs), runs[0][0] == values["RunId"], str(runs[0][3]))
            print("Survival future", len(api.Survival(dbus.UInt64(2**63))))
            applied, messages = api.Reload()
            print("Reload", sig(applied), sig(messages), bool(applied))

            obj = bus.get_object(NAME, ROOT, introspect=False)
            xml = obj.Introspect(dbus_interface="org.freedesktop.DBus.Introspectable")
            print("Introspect", '<interface name="' + HOST + '">' in xml)
            managed = obj.GetManagedObjects(dbus_interface="org.freedesktop.DBus.ObjectManager")
            print("GetManagedObjects", sig(managed), ROOT + "/Strategy/mail_2dsync" in managed, path in managed)
            obj.Ping(dbus_interface="org.freedesktop.DBus.Peer")
            print("Ping ok")
            print("GetMachineId", len(obj.GetMachineId(dbus_interface="org.freedesktop.DBus.Peer")) == 32)
            """

        @Test func pythonReadsEveryPropertyAndCallsEveryMethod() async throws {
            try await BusHost.with { host in
                let result = try runPythonScript(Self.everything, [
                    host.address, APIContract.hostProperties.joined(separator: ","),
                    APIContract.strategyProperties.joined(separator: ","), APIContract.leaseProperties.joined(separator: ","),
                    VigilAPI.strategy.properties.filter { $0.emitsChange == .false }.map(\.name).joined(separator: ","),
                ])
                #expect(result.status == 0, "\(result.stderr)")
                let lines = Set(result.stdout.split(separator: "\n").map(String.init))
                // The types python sees are the declared ones.
                var expected = VigilAPI.host.properties.map { "host \($0.name) \($0.signature)" }
                expected += ["mail-sync", "tick"].flatMap { name in VigilAPI.strategy.properties.map { "strategy \(name) \($0.name) \($0.signature)" } }
                expected += VigilAPI.lease.properties.map { "lease \($0.name) \($0.signature)" }
                expected += [
                    "host GetAll True True",
                    "ListLeases \(LeaseRow.arraySignature)",
                    "ListLeases matches lease object True",
                    "ListStrategies \(StrategyRow.arraySignature) ['mail-sync', 'tick']",
                    "Survival \(RunRow.arraySignature) 1 True running",
                    "Survival future 0",
                    "Reload \(VigilAPI.Host.reload.declaration.outArguments.map(\.signature).joined(separator: " ")) True",
                    "Introspect True",
                    "GetManagedObjects a{oa{sa{sv}}} True True",
                    "Ping ok",
                    "GetMachineId True",
                ]
                for line in expected {
                    #expect(lines.contains(line), "python client did not print \"\(line)\":\n\(result.stdout)\n\(result.stderr)")
                }
            }
        }

        /// Malformed calls of each kind get the standard error name.
        static let malformed = prelude + """
            def call(path, iface, member, signature, args, timeout=10):
                return bus.call_blocking(NAME, path, iface, member, signature, args, timeout=timeout)

            checks = [
                ("wrong signature", lambda: call(ROOT, HOST, "Survival", "s", ["yesterday"])),
                ("missing argument", lambda: call(ROOT, HOST, "Survival", "", [])),
                ("extra argument", lambda: call(ROOT, HOST, "ListLeases", "u", [1])),
                ("unknown method", lambda: call(ROOT, HOST, "Frobnicate", "", [])),
                ("unknown interface", lambda: call(ROOT, "org.vigil.Vigil1.Nope", "ListLeases", "", [])),
                ("Get unknown interface", lambda: call(ROOT, PROPS, "Get", "ss", [ "org.vigil.Vigil1.Nope", "Version"])),
                ("Get unknown property", lambda: call(ROOT, PROPS, "Get", "ss", [HOST, "Versoin"])),
                ("Set read-only host property", lambda: call(ROOT, PROPS, "Set", "ssv", [HOST, "Version", dbus.String("9.9")])),
                ("Set read-only strategy property", lambda: call(ROOT + "/Strategy/tick", PROPS, "Set", "ssv", [STRATEGY, "State", dbus.String("stopped")])),
                ("Set unknown property", lambda: call(ROOT, PROPS, "Set", "ssv", [HOST, "Nope", dbus.String("x")])),
                ("huge array of integers", lambda: call(ROOT, HOST, "Survival", "at", [dbus.Array(range(1000000), signature="t")], timeout=60)),
                ("huge array of strings", lambda: call(ROOT, HOST, "ListLeases", "as", [["x" * 100] * 100000], timeout=60)),
                ("huge Get argument", lambda: call(ROOT, PROPS, "Get", "ss", [HOST, "V" * 1000000], timeout=60)),
                ("unknown lease object", lambda: call(ROOT + "/Lease/999999999", PROPS, "GetAll", "s", [LEASE])),
                ("non-numeric lease object", lambda: call(ROOT + "/Lease/abc", PROPS, "Get", "ss", [LEASE, "Id"])),
                ("unknown strategy object", lambda: call(ROOT + "/Strategy/nope", PROPS, "Get", "ss", [STRATEGY, "Name"])),
                ("method on another object's interface", lambda: call(ROOT + "/Strategy/tick", HOST, "ListLeases", "", [])),
                ("unrelated path", lambda: call("/com/example/Thing", HOST, "ListLeases", "", [])),
            ]
            for label, f in checks:
                print(label + ":", error_name(f))
            # Still answering.
            print("after:", str(call(ROOT, PROPS, "Get", "ss", [HOST, "Version"])))
            """

        @Test func malformedCallsGetStandardErrors() async throws {
            try await BusHost.with { host in
                let result = try runPythonScript(Self.malformed, [host.address])
                #expect(result.status == 0, "\(result.stderr)")
                let e = "org.freedesktop.DBus.Error."
                let expected = [
                    "wrong signature: \(e)InvalidArgs",
                    "missing argument: \(e)InvalidArgs",
                    "extra argument: \(e)InvalidArgs",
                    "unknown method: \(e)UnknownMethod",
                    "unknown interface: \(e)UnknownInterface",
                    "Get unknown interface: \(e)UnknownInterface",
                    "Get unknown property: \(e)UnknownProperty",
                    "Set read-only host property: \(e)PropertyReadOnly",
                    "Set read-only strategy property: \(e)PropertyReadOnly",
                    "Set unknown property: \(e)UnknownProperty",
                    "huge array of integers: \(e)InvalidArgs",
                    "huge array of strings: \(e)InvalidArgs",
                    "huge Get argument: \(e)UnknownProperty",
                    "unknown lease object: \(e)UnknownObject",
                    "non-numeric lease object: \(e)UnknownObject",
                    "unknown strategy object: \(e)UnknownObject",
                    "method on another object's interface: \(e)UnknownInterface",
                    "unrelated path: \(e)UnknownObject",
                    "after: \(VigilVersion.string)",
                ]
                #expect(result.stdout.split(separator: "\n").map(String.init) == expected, "\(result.stdout)\n\(result.stderr)")
                #expect(host.daemon.process.isRunning)
            }
        }

        /// Thousands of random bad calls: every one answered with an error
        /// (never NoReply or a disconnect), and vigild carries on.
        @Test func thousandsOfRandomBadCallsLeaveVigildServing() async throws {
            try await BusHost.with { host in
                let seed = UInt32.random(in: 0...UInt32.max)
                let result = try runPythonScript(Self.randomCalls, [host.address, String(seed), "3000"])
                #expect(result.status == 0, "seed \(seed): \(result.stderr)")
                let summary = result.stdout.split(separator: "\n").map(String.init)
                #expect(summary.contains("answered 3000"), "seed \(seed): \(result.stdout)")
                #expect(!result.stdout.contains("NoReply") && !result.stdout.contains("Disconnected"), "seed \(seed): \(result.stdout)")
                #expect(summary.last == "after: \(VigilVersion.string)", "seed \(seed): \(result.stdout)")
                #expect(host.daemon.process.isRunning)
                // And the real client still works.
                let status = try host.vigilctl("status", ["--json"])
                #expect(status.status == 0, "\(status.stderr)")
            }
        }

        /// Sends `count` random calls, at most 64 in flight, counting the
        /// reply kinds; then one normal call.
        static let randomCalls = prelude + """
            import random
            seed = int(sys.argv[2]); count = int(sys.argv[3])
            rng = random.Random(seed)
            paths = [ROOT, ROOT + "/Strategy/tick", ROOT + "/Strategy/mail_2dsync", ROOT + "/Strategy", ROOT + "/Lease",
                     ROOT + "/Lease/1", ROOT + "/Lease/18446744073709551615", "/", "/org", "/org/vigil", "/x/y/z"]
            interfaces = [HOST, STRATEGY, LEASE, PROPS, "org.freedesktop.DBus.Introspectable",
                          "org.freedesktop.DBus.ObjectManager", "org.freedesktop.DBus.Peer", "org.vigil.Vigil1.Nope", "a.b"]
            members = ["ListLeases", "ListStrategies", "Survival", "Get", "GetAll", "Set", "Introspect",
                       "GetManagedObjects", "Reload_", "X", "LeaseAcquired", "Version", "Ping"]
            def value():
                k = rng.randrange(13)
                if k == 0: return "s", rng.choice(["", "Version", HOST, STRATEGY, "\\u00e9\\u6f22", "x" * rng.randint(0, 5000)])
                if k == 1: return "u", dbus.UInt32(rng.randint(0, 2**32 - 1))
                if k == 2: return "t", dbus.UInt64(rng.randint(0, 2**64 - 1))
                if k == 3: return "i", dbus.Int32(rng.randint(-2**31, 2**31 - 1))
                if k == 4: return "b", dbus.Boolean(rng.random() < .5)
                if k == 5: return "d", dbus.Double(rng.random() * 1e300)
                if k == 6: return "o", dbus.ObjectPath(rng.choice(paths))
                if k == 7: return "g", dbus.Signature(rng.choice(["", "a{sv}", "(ii)"]))
                if k == 8: return "v", dbus.String("x", variant_level=1)
                if k == 9: return "as", dbus.Array([str(i) for i in range(rng.randint(0, 50))], signature="s")
                if k == 10: return "a{sv}", dbus.Dictionary({"k": dbus.UInt32(1, variant_level=1)}, signature="sv")
                if k == 11: return "(ts)", dbus.Struct((dbus.UInt64(1), "s"), signature="ts")
                return "ay", dbus.ByteArray(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 2000))))

            import dbus.mainloop.glib
            from gi.repository import GLib
            dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
            bus = dbus.bus.BusConnection(sys.argv[1])
            loop = GLib.MainLoop()
            kinds = {}
            state = {"sent": 0, "answered": 0, "in_flight": 0}

            def send_more():
                while state["sent"] < count and state["in_flight"] < 64:
                    message = dbus.lowlevel.MethodCallMessage(NAME, rng.choice(paths), rng.choice(interfaces), rng.choice(members))
                    for _ in range(rng.randint(0, 3)):
                        s, v = value()
                        message.append(v, signature=s)
                    state["sent"] += 1
                    state["in_flight"] += 1
                    bus.send_message_with_reply(message, on_reply, 30)

            def on_reply(reply):
                state["in_flight"] -= 1
                state["answered"] += 1
                name = reply.get_error_name() if isinstance(reply, dbus.lowlevel.ErrorMessage) else "ok"
                kinds[name] = kinds.get(name, 0) + 1
                if state["answered"] == count:
                    loop.quit()
                else:
                    send_more()

            GLib.idle_add(lambda: send_more() and False)
            GLib.timeout_add_seconds(120, loop.quit)
            loop.run()
            for name in sorted(kinds):
                print(name, kinds[name])
            print("answered", state["answered"])
            print("after:", str(bus.call_blocking(NAME, ROOT, PROPS, "Get", "ss", [HOST, "Version"])))
            """
    }
}
