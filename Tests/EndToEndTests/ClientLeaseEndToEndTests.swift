import Foundation
import Glibc
import Testing
import VigilDBus
import VigilHost
import VigilTestSupport

/// Client leases against a real vigild on a private bus, in real time (short
/// budgets): a python3-dbus client (its own marshalling and fd handling),
/// and `vigilctl hold`.
extension EndToEnd {
    @Suite(.serialized) struct ClientLeaseEndToEndTests {
        /// `[host]` keys for these tests (BusHost puts them in `[host]`).
        static let hostKeys = """
            client_max_leases_per_uid = 2
            client_max_budget_per_uid = "1h"
            client_grace = "1s"
            """

        static let client = """
            import sys, os, time, dbus
            from gi.repository import GLib
            from dbus.mainloop.glib import DBusGMainLoop
            DBusGMainLoop(set_as_default=True)
            NAME = "org.vigil.Vigil1"; ROOT = "/org/vigil/Vigil1"
            HOST = "org.vigil.Vigil1.Host"; CLIENT = "org.vigil.Vigil1.ClientLease"
            bus = dbus.bus.BusConnection(sys.argv[1])
            host = dbus.Interface(bus.get_object(NAME, ROOT, introspect=False), HOST)
            seen = []
            def record(*args, **kw):
                seen.append((kw["member"], kw["path"], [str(a) for a in args]))
            bus.add_signal_receiver(record, bus_name=NAME, member_keyword="member", path_keyword="path")

            def wait_for(cond, timeout=15):
                # Runs the main loop (which delivers the signals) until cond() holds.
                loop = GLib.MainLoop()
                def check():
                    if cond(): loop.quit(); return False
                    return True
                GLib.timeout_add(10, check)
                GLib.timeout_add(int(timeout * 1000), loop.quit)
                loop.run()
                return cond()

            def begin(name, seconds, conn=bus):
                h = dbus.Interface(conn.get_object(NAME, ROOT, introspect=False), HOST)
                path, fd = h.BeginBackgroundTask(name, "why " + name, dbus.UInt64(int(seconds * 1000000)))
                return str(path), fd.take()

            def lease(path, conn=bus):
                return dbus.Interface(conn.get_object(NAME, path, introspect=False), CLIENT)

            def listed(path):
                return any(str(row[0]) == path for row in host.ListLeases())

            def released(path):
                for member, p, args in seen:
                    if member == "LeaseReleased" and args[0] == path: return args[1]
                return None

            def error_name(f):
                try:
                    f(); return "no error"
                except dbus.DBusException as e:
                    return e.get_dbus_name() + ": " + e.get_dbus_message()

            # 1. Not renewing: Expiring (with the grace time left), then Expired, on the lease object.
            path, fd = begin("expire", 0.5)
            print("begun", path, listed(path), fd >= 0)
            wait_for(lambda: any(m == "Expired" and p == path for m, p, a in seen))
            mine = [(m, a) for m, p, a in seen if p == path and m != "PropertiesChanged"]
            print("expire", [m for m, a in mine])
            print("expiring", [a for m, a in mine if m == "Expiring"])
            print("listed after expiry", listed(path))
            print("renew ended", error_name(lambda: lease(path).Renew(dbus.UInt64(1000000))))
            os.close(fd)

            # 2. Renewing keeps it: 1 s budget, renewed every 0.4 s for 2.4 s; then End.
            path, fd = begin("renew", 1.0)
            start = time.monotonic()
            while time.monotonic() - start < 2.4:
                time.sleep(0.4)
                lease(path).Renew(dbus.UInt64(1000000))
            print("renewed still listed", listed(path))
            lease(path).End()
            wait_for(lambda: released(path) is not None)
            print("renew released", released(path))
            print("renew expired", any(m in ("Expiring", "Expired") and p == path for m, p, a in seen))
            os.close(fd)

            # 3. Closing the fd ends it.
            path, fd = begin("close", 60)
            os.close(fd)
            wait_for(lambda: released(path) is not None)
            print("close released", released(path))

            # 4. Disconnecting ends it (the fd stays open here).
            other = dbus.bus.BusConnection(sys.argv[1])
            path, fd = begin("disconnect", 60, conn=other)
            other.close()
            wait_for(lambda: released(path) is not None)
            print("disconnect released", released(path))
            os.close(fd)

            # 5. Limits: two leases per uid.
            a, fa = begin("a", 60)
            b, fb = begin("b", 60)
            print("third", error_name(lambda: begin("c", 60)))
            print("too long", error_name(lambda: begin("d", 7200)))
            print("zero", error_name(lambda: begin("e", 0)))
            os.close(fa)
            wait_for(lambda: released(a) is not None)
            c, fc = begin("c", 60)
            print("after one ended", listed(c))
            print("host alive", host.ListLeases() is not None)
            """

        @Test func aPythonClientBeginsRenewsEndsAndIsLimited() async throws {
            try await BusHost.with(strategies: Self.hostKeys) { host in
                let result = try runPythonScript(Self.client, [host.address])
                #expect(result.status == 0, "\(result.stderr)")
                let lines = result.stdout.split(separator: "\n").map(String.init)
                func line(_ prefix: String) -> String? { lines.first { $0.hasPrefix(prefix + " ") } }
                #expect(line("begun")?.hasSuffix(" True True") == true, "\(lines)")
                #expect(line("expire") == "expire ['Expiring', 'Expired']")
                #expect(line("expiring") == "expiring [['1000000']]")
                #expect(line("listed after expiry") == "listed after expiry False")
                #expect(line("renew ended")?.contains("org.freedesktop.DBus.Error.UnknownObject") == true, "\(lines)")
                #expect(line("renewed still listed") == "renewed still listed True")
                #expect(line("renew released") == "renew released ended by the client")
                #expect(line("renew expired") == "renew expired False")
                #expect(line("close released") == "close released the client closed its lease fd")
                #expect(line("disconnect released") == "disconnect released the client left the bus")
                #expect(line("third")?.contains("org.freedesktop.DBus.Error.LimitsExceeded: uid 0 already holds 2 client leases") == true, "\(lines)")
                #expect(line("too long")?.contains("org.freedesktop.DBus.Error.LimitsExceeded") == true, "\(lines)")
                #expect(line("zero")?.contains("org.freedesktop.DBus.Error.InvalidArgs: budget_usec must be greater than 0") == true, "\(lines)")
                #expect(line("after one ended") == "after one ended True")
                #expect(line("host alive") == "host alive True")
                // vigild is still serving after all that.
                #expect(try host.busctl(["call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", "ListStrategies"]).status == 0)
            }
        }

        /// vigild under a small open-file limit (prlimit, as systemd's
        /// LimitNOFILE= would set it): leases past the limit are refused
        /// with an error that names it, vigild logs it once, and it keeps
        /// serving.
        @Test func runningOutOfDescriptorsIsNamedAndLoggedOnce() async throws {
            let script = """
                import sys, os, dbus
                bus = dbus.bus.BusConnection(sys.argv[1])
                host = dbus.Interface(bus.get_object("org.vigil.Vigil1", "/org/vigil/Vigil1", introspect=False), "org.vigil.Vigil1.Host")
                fds, errors = [], []
                for i in range(200):
                    try:
                        path, fd = host.BeginBackgroundTask("lease%d" % i, "fd test", dbus.UInt64(600000000))
                        fds.append(fd.take())
                    except dbus.DBusException as e:
                        errors.append(e.get_dbus_name() + ": " + e.get_dbus_message())
                print("granted", len(fds))
                print("refused", len(errors))
                print("error", errors[0] if errors else "none")
                for fd in fds: os.close(fd)
                print("alive", len(host.ListStrategies()) >= 0)
                """
            try await BusHost.with(strategies: "client_max_leases_per_uid = 1000\nclient_max_budget_per_uid = \"1000h\"", executable: ["/usr/bin/prlimit", "--nofile=96:96", "--"]) { host in
                let result = try runPythonScript(script, [host.address])
                #expect(result.status == 0, "\(result.stderr)")
                let lines = result.stdout.split(separator: "\n").map(String.init)
                let granted = lines.first { $0.hasPrefix("granted ") }.flatMap { Int($0.dropFirst(8)) } ?? 0
                #expect(granted > 10 && granted < 96, "\(lines)")
                #expect(lines.contains("refused \(200 - granted)"), "\(lines)")
                let error = lines.first { $0.hasPrefix("error ") } ?? ""
                #expect(error.contains("org.freedesktop.DBus.Error.LimitsExceeded"), "\(error)")
                #expect(error.contains("RLIMIT_NOFILE") && error.contains("96") && error.contains("LimitNOFILE="), "\(error)")
                #expect(lines.contains("alive True"), "\(lines)")
                _ = try await host.daemon.waitForLine(containing: "refusing client leases")
                #expect(host.daemon.output.filter { $0.contains("refusing client leases") }.count == 1, "\(host.daemon.output)")
            }
        }

        /// jeepney without fd passing (its default): the bus refuses the
        /// reply's fd, and vigild answers NotSupported in its place at once;
        /// the lease it began ends.
        ///
        /// The client stays on the bus until the release is seen: when it
        /// left at once, vigild could see it leave the bus before the fd
        /// close, two true events in either order (CI failed on that).
        /// Connected, the fd the bus dropped is the only way the lease ends.
        @Test func aClientThatCannotReceiveFDsIsAnsweredAtOnce() async throws {
            let script = """
                import signal, sys, time
                from jeepney import DBusAddress, HeaderFields, MessageType, new_method_call
                from jeepney.io.blocking import open_dbus_connection
                conn = open_dbus_connection(sys.argv[1])
                host = DBusAddress("/org/vigil/Vigil1", bus_name="org.vigil.Vigil1", interface="org.vigil.Vigil1.Host")
                start = time.monotonic()
                reply = conn.send_and_get_reply(new_method_call(host, "BeginBackgroundTask", "sst", ("no-fds", "test", 60000000)), timeout=30)
                print(reply.header.fields.get(HeaderFields.error_name, "no error"), "%.3f" % (time.monotonic() - start), file=sys.stderr)
                print(repr(reply.body), file=sys.stderr)
                print("done", file=sys.stderr, flush=True)
                signal.pause()
                """
            try await BusHost.with(strategies: Self.hostKeys) { host in
                let client = try Daemon(arguments: [], executable: ["/usr/bin/python3", "-c", script, host.address])
                defer { client.signal(SIGKILL) }
                try await client.waitForLine(containing: "done")
                let words = client.output.first?.split(separator: " ").map(String.init) ?? []
                #expect(words.first == "org.freedesktop.DBus.Error.NotSupported", "\(client.output)")
                #expect((Double(words.last ?? "") ?? .infinity) < 1, "answered after \(words.last ?? "?") s")
                #expect(client.output.contains { $0.contains("negotiate fd passing") }, "\(client.output)")
                // The lease it began ended with its only fd, closed by the bus,
                // while the client is still connected.
                let path = try await host.leaseAcquired(strategy: "client")
                let released = try await host.signals.first { $0.member == "LeaseReleased" && $0.body.first == .objectPath(path) }
                #expect(released.body.dropFirst().first == .string("the client closed its lease fd"), "\(released.body)")
                let listed = try host.busctl(["call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", "ListLeases"])
                #expect(!listed.stdout.contains("no-fds"), "\(listed.stdout)")
            }
        }

        /// A C client generated by gdbus-codegen from docs/org.vigil.Vigil1.xml
        /// and built with gcc keeps the reply's fd (the XML's
        /// org.gtk.GDBus.C.UnixFD annotation) and so its lease, for 5 s and
        /// until the test lets it go.
        @Test func aGdbusCodegenCClientHoldsItsLease() async throws {
            let dir = try TempDir("vigil-gdbus-codegen")
            let xml = Build.packageRoot.appendingPathComponent("docs/org.vigil.Vigil1.xml").path
            let source = Build.packageRoot.appendingPathComponent("Tests/Fixtures/gdbus-client/client.c").path
            let generated = try ProcessRunner.run("/usr/bin/gdbus-codegen", ["--interface-prefix", "org.vigil.Vigil1.", "--c-namespace", "Vigil",
                                                                       "--generate-c-code", "vigil-generated", xml], cwd: dir.path)
            try #require(generated.status == 0, "\(generated.stderr)")
            let flags = try ProcessRunner.run("/usr/bin/pkg-config", ["--cflags", "--libs", "gio-unix-2.0"])
            try #require(flags.status == 0, "\(flags.stderr)")
            let built = try ProcessRunner.run("/usr/bin/gcc", ["-o", "client", "-I", dir.path, source, "vigil-generated.c"]
                                         + flags.stdout.split(whereSeparator: \.isWhitespace).map(String.init), cwd: dir.path)
            try #require(built.status == 0, "\(built.stderr)")
            try await BusHost.with(strategies: Self.hostKeys) { host in
                let client = try Daemon(arguments: [], executable: [dir.file("client"), host.address, "5"])
                defer { client.signal(SIGKILL) }
                let path = String(try await client.waitForLine(containing: "begun ").dropFirst("begun ".count))
                try await client.waitForLine(containing: "held")
                // The client holds its fd until told: no race with its end.
                let endedEarly = host.signals.all.contains { $0.member == "LeaseReleased" && $0.body.first == .objectPath(path) }
                #expect(!endedEarly, "the lease ended while the client held it: \(client.output)")
                client.signal(SIGUSR1)
                #expect(await client.waitForExit() == 0, "\(client.output)")
                let released = try await host.signals.first { $0.member == "LeaseReleased" && $0.body.first == .objectPath(path) }
                #expect(released.body.dropFirst().first == .string("the client closed its lease fd")
                        || released.body.dropFirst().first == .string("the client left the bus"), "\(released.body)")
            }
        }

        @Test func vigilctlHoldRunsTheCommandUnderARenewedLease() async throws {
            try await BusHost.with(strategies: Self.hostKeys) { host in
                let dir = try TempDir("vigil-hold")
                let during = dir.file("during")
                let later = dir.file("later")
                // The command lists the leases at once and after 3.5 s (the
                // 2 s budget, renewed every 1.5 s, needs two renewals by
                // then), then exits 7.
                let script = """
                    busctl --address=\(host.address) call org.vigil.Vigil1 /org/vigil/Vigil1 org.vigil.Vigil1.Host ListLeases > \(during)
                    sleep 3.5
                    busctl --address=\(host.address) call org.vigil.Vigil1 /org/vigil/Vigil1 org.vigil.Vigil1.Host ListLeases > \(later)
                    exit 7
                    """
                let result = try host.vigilctl("hold", ["--budget", "2s", "--why", "testing hold", "--", "sh", "-c", script])
                #expect(result.status == 7, "\(result.stderr)")
                let first = try String(contentsOfFile: during, encoding: .utf8)
                #expect(first.contains("\"client\" \"client\""), "\(first)")
                #expect(first.contains("\"testing hold\""), "\(first)")
                #expect(first.contains("background task \\\"sh\\\""), "\(first)")
                let second = try String(contentsOfFile: later, encoding: .utf8)
                #expect(second.contains("\"testing hold\"") && second.contains("\"active\""), "renewed, still held: \(second)")
                #expect(!second.contains(" 0 \"active\""), "renewed at least once: \(second)")
                // Ended when the command exited.
                let after = try host.busctl(["call", "org.vigil.Vigil1", "/org/vigil/Vigil1", "org.vigil.Vigil1.Host", "ListLeases"])
                #expect(!after.stdout.contains("testing hold"), "\(after.stdout)")

                // A command that cannot run: 127; a refused lease: 1, and the command does not run.
                let missing = try host.vigilctl("hold", ["--", "/nonexistent/program"])
                #expect(missing.status == 127)
                #expect(missing.stderr.contains("cannot run /nonexistent/program"))
                let refused = try host.vigilctl("hold", ["--budget", "2h", "--", "touch", dir.file("ran")])
                #expect(refused.status == 1)
                #expect(refused.stderr.contains("LimitsExceeded") || refused.stderr.contains("client_max_budget_per_uid"), "\(refused.stderr)")
                #expect(!FileManager.default.fileExists(atPath: dir.file("ran")))
            }
        }
    }
}
