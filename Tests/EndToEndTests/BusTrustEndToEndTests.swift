import Foundation
import Glibc
import Testing
import VigilDBus
import VigilHost
import VigilTestSupport
import VigilKit

/// The D-Bus trust boundary seen from outside: vigild on a bus with the
/// shipped system policy, a hostile peer running as uid 65534 with a
/// third-party client (python3-dbus).
extension EndToEnd {
    @Suite struct BusTrustEndToEndTests {
        /// Sends vigild unicast copies of the bus driver's signals, as if the
        /// victim had left and vigild had lost and regained its name, then
        /// calls vigild on the same connection: once answered, vigild has
        /// read the forgeries.
        static let forger = """
            import sys, dbus, dbus.lowlevel
            bus = dbus.bus.BusConnection(sys.argv[1])
            victim = sys.argv[2]
            def forge(member, signature, args):
                m = dbus.lowlevel.SignalMessage("/org/freedesktop/DBus", "org.freedesktop.DBus", member)
                m.set_destination("org.vigil.Vigil1")
                m.append(*args, signature=signature)
                bus.send_message(m)
            forge("NameOwnerChanged", "sss", [victim, victim, ""])
            forge("NameLost", "s", ["org.vigil.Vigil1"])
            forge("NameAcquired", "s", ["org.vigil.Vigil1"])
            bus.call_blocking("org.vigil.Vigil1", "/org/vigil/Vigil1", "org.freedesktop.DBus.Properties", "Get", "ss",
                              ("org.vigil.Vigil1.Host", "Version"))
            print("forged")
            # Nor may it end the victim's lease by asking.
            try:
                bus.call_blocking("org.vigil.Vigil1", sys.argv[3], "org.vigil.Vigil1.ClientLease", "End", "", ())
                print("ended")
            except dbus.DBusException as e:
                print(e.get_dbus_name())
            """

        static func begin(_ connection: DBusConnection, name: String) async throws -> (path: String, fd: BusFileDescriptor) {
            let reply = try await connection.call(
                destination: VigilAPI.busName, path: VigilAPI.rootPath, interface: VigilAPI.hostInterface,
                member: "BeginBackgroundTask", arguments: [.string(name), .string("trust test"), .uint64(3600 * 1_000_000)],
                timeout: .seconds(30))
            guard reply.body.count == 2, case .objectPath(let path) = reply.body[0], case .unixFD(let fd) = reply.body[1] else {
                throw DaemonError("unexpected BeginBackgroundTask reply \(reply.body)")
            }
            return (path, fd)
        }

        /// The paths of the leases vigild lists.
        static func listed(_ connection: DBusConnection) async throws -> [String] {
            let reply = try await connection.call(
                destination: VigilAPI.busName, path: VigilAPI.rootPath, interface: VigilAPI.hostInterface,
                member: "ListLeases", timeout: .seconds(30))
            guard case .array(_, let rows)? = reply.body.first else { return [] }
            return rows.compactMap { row in
                if case .structure(let fields) = row, case .objectPath(let path)? = fields.first { return path }
                return nil
            }
        }

        /// Reads LeaseReleased signals until `path`'s (60 s at most); returns
        /// the paths seen.
        static func released(until path: String, from stream: AsyncStream<DBusMessage>) async -> [String] {
            await withTaskGroup(of: [String]?.self) { group in
                group.addTask {
                    var seen: [String] = []
                    for await message in stream {
                        guard case .objectPath(let released)? = message.body.first else { continue }
                        seen.append(released)
                        if released == path { break }
                    }
                    return seen
                }
                group.addTask {
                    try? await Task.sleep(for: .seconds(60))
                    return nil
                }
                let first = await group.next() ?? nil
                group.cancelAll()
                return first ?? ["(no release of \(path) within 60 s)"]
            }
        }

        @Test func forgedBusDriverSignalsEndNoLease() async throws {
            try await withPolicyHost { bus, daemon in
                let observer = try await DBusConnection.connect(to: .address(bus.address))
                let releases = try await observer.signals(matching: DBusMatchRule(
                    sender: VigilAPI.busName, path: VigilAPI.rootPath, interface: VigilAPI.hostInterface, member: "LeaseReleased"))
                let victim = try await DBusConnection.connect(to: .address(bus.address))
                let witness = try await DBusConnection.connect(to: .address(bus.address))
                let victimLease = try await Self.begin(victim, name: "victim")
                let witnessLease = try await Self.begin(witness, name: "witness")
                defer { victimLease.fd.close(); witnessLease.fd.close() }

                let forged = try asNobody("/usr/bin/python3", ["-c", Self.forger, bus.address, await victim.uniqueName, victimLease.path])
                #expect(forged.status == 0 && forged.stdout.contains("forged"), "\(forged.stdout)\(forged.stderr)")
                #expect(forged.stdout.contains("org.freedesktop.DBus.Error.AccessDenied"), "\(forged.stdout)")
                // The witness's real departure comes after the forgeries; vigild
                // follows NameOwnerChanged in order, so once the witness's lease
                // is released the forgeries were handled (and must have ended nothing).
                await witness.close()
                let first = await Self.released(until: witnessLease.path, from: releases)
                #expect(first == [witnessLease.path], "released before the witness: \(first)")
                #expect(try await Self.listed(observer).contains(victimLease.path))

                // The victim's real disconnect still ends its lease (its fd is still open here).
                await victim.close()
                let then = await Self.released(until: victimLease.path, from: releases)
                #expect(then == [victimLease.path])
                #expect(try await !Self.listed(observer).contains(victimLease.path))
                await observer.close()
            }
        }
    }
}

/// Huge calls of the wrong signature, from uid 65534.
extension EndToEnd.BusTrustEndToEndTests {
    /// Sends ListLeases an `ay` of each size (MiB) while a second connection
    /// keeps reading Properties.Get; prints one line per call and the
    /// reader's figures.
    static let burst = """
        import sys, time, threading, dbus
        NAME = "org.vigil.Vigil1"; ROOT = "/org/vigil/Vigil1"; HOST = "org.vigil.Vigil1.Host"
        address = sys.argv[1]
        bus = dbus.bus.BusConnection(address)
        reader = dbus.bus.BusConnection(address)
        state = {"stop": False, "answered": 0, "worst": 0.0, "failed": ""}
        def read():
            while not state["stop"]:
                start = time.monotonic()
                try:
                    reader.call_blocking(NAME, ROOT, "org.freedesktop.DBus.Properties", "Get", "ss", (HOST, "Version"), timeout=60)
                except dbus.DBusException as e:
                    state["failed"] = e.get_dbus_name()
                state["worst"] = max(state["worst"], time.monotonic() - start)
                state["answered"] += 1
        thread = threading.Thread(target=read)
        thread.start()
        for mib in sys.argv[2:]:
            body = dbus.ByteArray(b"\\x1b" * (int(mib) * 1024 * 1024))
            before = state["answered"]
            start = time.monotonic()
            try:
                bus.call_blocking(NAME, ROOT, HOST, "ListLeases", "ay", (body,), timeout=120)
                outcome = "answered"
            except dbus.DBusException as e:
                outcome = e.get_dbus_name() + " " + str(len(e.get_dbus_message()))
            print("call", mib, outcome, "%.3f" % (time.monotonic() - start), state["answered"] - before, flush=True)
        state["stop"] = True
        thread.join()
        print("reader", state["answered"], "%.3f" % state["worst"], state["failed"] or "ok", flush=True)
        """

    /// vigild's resident set in KiB (VmRSS).
    static func residentKiB(_ pid: Int32) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
    }

    @Test func hugeWrongSignatureCallsAreRefusedCheaply() async throws {
        // The system bus refuses messages over 32 MiB; this bus lets 64 MiB through.
        try await withPolicyHost(limits: #"<limit name="max_message_size">134217728</limit>"#) { bus, daemon in
            let pid = daemon.process.processIdentifier
            // A small round first, so the figure before counts vigild's warm state.
            let warm = try asNobody("/usr/bin/python3", ["-c", Self.burst, bus.address, "1"])
            #expect(warm.status == 0, "\(warm.stderr)")
            let before = try Self.residentKiB(pid)

            let burst = try asNobody("/usr/bin/python3", ["-c", Self.burst, bus.address, "1", "16", "64"])
            let after = try Self.residentKiB(pid)
            #expect(burst.status == 0, "\(burst.stderr)")
            print("vigild RSS before \(before) KiB, after \(after) KiB; \(burst.stdout)")
            let calls = burst.stdout.split(separator: "\n").filter { $0.hasPrefix("call ") }.map { $0.split(separator: " ") }
            #expect(calls.count == 3, "\(burst.stdout)")
            for call in calls {
                #expect(call.count == 6 && call[2] == "org.freedesktop.DBus.Error.InvalidArgs", "\(call)")
                // The error quotes no client data: a short message.
                #expect(call.count == 6 && (Int(call[3]) ?? .max) < 200, "\(call)")
            }
            let reader = burst.stdout.split(separator: "\n").first { $0.hasPrefix("reader ") }?.split(separator: " ") ?? []
            #expect(reader.count == 4 && (Int(reader[1]) ?? 0) > 0 && reader[3] == "ok", "\(burst.stdout)")
            // Generous (a loaded machine): the reader never waited for the whole burst (12 s and more before the fix).
            #expect(reader.count == 4 && (Double(reader[2]) ?? .infinity) < 8, "\(burst.stdout)")
            // Generous: no lasting growth (2.1 GB stayed before the fix).
            #expect(after - before < 16 * 1024, "vigild RSS grew from \(before) KiB to \(after) KiB")
        }
    }
}

/// Client strings over their limits, from uid 65534.
extension EndToEnd.BusTrustEndToEndTests {
    static let oversized = """
        import sys, dbus
        bus = dbus.bus.BusConnection(sys.argv[1])
        host = dbus.Interface(bus.get_object("org.vigil.Vigil1", "/org/vigil/Vigil1", introspect=False), "org.vigil.Vigil1.Host")
        for name, reason in [("\\x1b" * (16 << 20), "why"), ("n" * 257, ""), ("n", "r" * 1025)]:
            try:
                host.BeginBackgroundTask(name, reason, dbus.UInt64(10 ** 6))
                print("begun")
            except dbus.DBusException as e:
                print(e.get_dbus_name(), e.get_dbus_message())
        # A 4 MiB object path: the error quotes a short prefix of it.
        try:
            bus.call_blocking("org.vigil.Vigil1", "/" + "a" * (4 << 20), "org.vigil.Vigil1.Host", "ListLeases", "", ())
        except dbus.DBusException as e:
            print(e.get_dbus_name(), len(e.get_dbus_message()))
        """

    @Test func oversizedLeaseStringsAreRefusedNamingTheLimit() async throws {
        try await withPolicyHost { bus, daemon in
            let observer = try await DBusConnection.connect(to: .address(bus.address))
            let signals = try await observer.signals(matching: DBusMatchRule(sender: VigilAPI.busName))

            let refused = try asNobody("/usr/bin/python3", ["-c", Self.oversized, bus.address])
            #expect(refused.status == 0, "\(refused.stderr)")
            let lines = refused.stdout.split(separator: "\n").map(String.init)
            #expect(lines == [
                "org.freedesktop.DBus.Error.InvalidArgs the lease name has 16777216 bytes, over the limit of 256 bytes",
                "org.freedesktop.DBus.Error.InvalidArgs the lease name has 257 bytes, over the limit of 256 bytes",
                "org.freedesktop.DBus.Error.InvalidArgs the lease reason has 1025 bytes, over the limit of 1024 bytes",
                "org.freedesktop.DBus.Error.UnknownObject 78",
            ], "\(refused.stdout)")

            // A lease within the limits; every signal up to its LeaseAcquired is small.
            let lease = try await Self.begin(observer, name: String(repeating: "n", count: 256))
            defer { lease.fd.close() }
            var seen: [DBusMessage] = []
            for await message in signals {
                seen.append(message)
                if message.member == "LeaseAcquired" { break }
            }
            #expect(seen.last?.body.first == .objectPath(lease.path))
            let largest = seen.map { String(describing: $0.body).utf8.count }.max() ?? 0
            #expect(largest < 4096, "a signal of \(largest) bytes")
            await observer.close()
        }
    }
}

/// vigilctl prints client-given strings escaped, and exactly in --json.
extension EndToEnd.BusTrustEndToEndTests {
    @Test func vigilctlEscapesControlCharactersAndKeepsJSONExact() async throws {
        try await BusHost.with { host in
            let client = try await DBusConnection.connect(to: .address(host.address))
            let name = "evil\u{1B}[2J\r\n\u{07}fake row"
            let lease = try await Self.begin(client, name: name)
            defer { lease.fd.close() }
            let controls: Set<Unicode.Scalar> = ["\u{1B}", "\r", "\u{07}"]
            func hasControls(_ text: String) -> Bool { text.unicodeScalars.contains { controls.contains($0) } }

            let table = try host.vigilctl("leases")
            #expect(table.status == 0, "\(table.stderr)")
            #expect(!hasControls(table.stdout), "\(table.stdout.debugDescription)")
            #expect(table.stdout.contains(#"evil\e[2J\r\n\u{7}fake row"#), "\(table.stdout)")
            // The newline forged no row: "fake row" is on the evil lease's
            // own line, the only line that has it. (Counting rows against a
            // second listing would race with leases that come and go.)
            let forged = table.stdout.split(separator: "\n").filter { $0.contains("fake row") }
            #expect(forged.count == 1 && forged.allSatisfy { $0.contains("evil\\e[2J") }, "\(table.stdout)")

            let json = try host.vigilctl("leases", ["--json"])
            let rows = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
            let row = try #require(rows.first { $0["path"] as? String == lease.path }, "\(json.stdout)")
            #expect((row["holds"] as? String)?.contains("\"\(name)\"") == true, "\(row)")

            let status = try host.vigilctl("status")
            #expect(status.status == 0 && !hasControls(status.stdout), "\(status.stdout.debugDescription)")
            let downloads = try host.vigilctl("downloads")
            #expect(!hasControls(downloads.stdout + downloads.stderr), "\(downloads.stdout.debugDescription)")
            await client.close()
        }
    }
}

/// Thousands of random calls from uid 65534 (Tests/Fixtures/dbus-fuzz.py).
extension EndToEnd.BusTrustEndToEndTests {
    static func openFDs(_ pid: Int32) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    @Test func randomCallsLeaveVigildAnsweringWithItsFDsAndMemory() async throws {
        try await withPolicyHost { bus, daemon in
            let pid = daemon.process.processIdentifier
            let script = Build.packageRoot.appendingPathComponent("Tests/Fixtures/dbus-fuzz.py").path
            let seed = UInt32.random(in: 1...UInt32.max)
            // A short round first, so the figures before count vigild's warm state.
            let warm = try asNobody("/usr/bin/python3", [script, bus.address, String(seed &+ 1), "200"])
            #expect(warm.status == 0, "\(warm.stderr)")
            let fdsBefore = Self.openFDs(pid)
            let rssBefore = try Self.residentKiB(pid)

            let fuzz = try asNobody("/usr/bin/python3", [script, bus.address, String(seed), "3000"])
            #expect(fuzz.status == 0 && fuzz.stdout.contains("done 3000"), "seed \(seed): \(fuzz.stdout)\(fuzz.stderr.suffix(2000))")
            print("fuzz seed \(seed):\n\(fuzz.stdout)")

            let client = try await DBusConnection.connect(to: .address(bus.address))
            let version = try await client.call(
                destination: VigilAPI.busName, path: VigilAPI.rootPath, interface: "org.freedesktop.DBus.Properties",
                member: "Get", arguments: [.string(VigilAPI.hostInterface), .string("Version")], timeout: .seconds(30))
            #expect(version.signature == "v")
            await client.close()
            let fdsAfter = Self.openFDs(pid)
            let rssAfter = try Self.residentKiB(pid)
            print("vigild fds \(fdsBefore) -> \(fdsAfter), RSS \(rssBefore) -> \(rssAfter) KiB")
            #expect(fdsAfter == fdsBefore, "seed \(seed): vigild had \(fdsBefore) fds, now \(fdsAfter)")
            // Generous: bounded, not a leak per call.
            #expect(rssAfter - rssBefore < 32 * 1024, "seed \(seed): vigild RSS grew from \(rssBefore) to \(rssAfter) KiB")
        }
    }
}

/// A call of the declared signature whose body holds too many values.
extension EndToEnd.BusTrustEndToEndTests {
    @Test func hugeBodyOfTheDeclaredSignatureIsRefusedBeforeDecoding() async throws {
        try await BusHost.with { host in
            let pid = host.daemon.process.processIdentifier
            let before = try Self.residentKiB(pid)
            // Properties.Set (ssv) with a 16 MiB `ay` in the variant: the
            // signature is right, the body is over the bound.
            let set = try ProcessRunner.run("/usr/bin/python3", ["-c", """
                import sys, dbus
                bus = dbus.bus.BusConnection(sys.argv[1])
                value = dbus.ByteArray(b"\\x00" * (16 << 20), variant_level=1)
                try:
                    bus.call_blocking("org.vigil.Vigil1", "/org/vigil/Vigil1", "org.freedesktop.DBus.Properties", "Set", "ssv",
                                      ("org.vigil.Vigil1.Host", "Version", value), timeout=120)
                    print("accepted")
                except dbus.DBusException as e:
                    print(e.get_dbus_name(), e.get_dbus_message())
                """, host.address])
            let after = try Self.residentKiB(pid)
            #expect(set.stdout.hasPrefix("org.freedesktop.DBus.Error.InvalidArgs the call carries more than 65536 values"),
                    "\(set.stdout)\(set.stderr)")
            #expect(after - before < 16 * 1024, "vigild RSS grew from \(before) KiB to \(after) KiB")
        }
    }
}

/// Every error quoting a client's text quotes it through one function
/// (ClientText.excerpt): bounded and escaped, on every interface vigild
/// serves (Tests/Fixtures/oversized-arguments.py).
extension EndToEnd.BusTrustEndToEndTests {
    static let oversizedArguments = Build.packageRoot.appendingPathComponent("Tests/Fixtures/oversized-arguments.py").path

    @Test func everyMethodQuotesAnOversizedArgumentBoundedAndEscaped() async throws {
        let downloads = try TempDir("vigil-e2e-oversized")
        try await BusHost.with(strategies: BusHost.withDownloads(in: downloads.path)) { host in
            // The strategy registers its D-Bus methods before it says what it knows.
            try await host.daemon.waitForLine(containing: " known, ")
            let result = try ProcessRunner.run("/usr/bin/python3", [Self.oversizedArguments, host.address])
            try #require(result.status == 0, "\(result.stderr)")
            let calls = result.stdout.split(separator: "\n").filter { $0.hasPrefix("call ") }.map { $0.split(separator: " ").map(String.init) }
            #expect(!result.stdout.contains("escaped False"), "\(result.stdout)")
            // The host's, the strategy's, the freedesktop and the standard interfaces, on every object.
            for method in ["org.vigil.Vigil1.Host.BeginBackgroundTask", "org.vigil.Vigil1.DownloadSession.Enqueue",
                           "org.freedesktop.ScreenSaver.Inhibit", "org.freedesktop.PowerManagement.Inhibit.Inhibit",
                           "org.freedesktop.impl.portal.Inhibit.Inhibit", "org.freedesktop.DBus.Properties.Set"] {
                #expect(calls.contains { $0.count == 6 && $0[2] == method }, "\(method) was not called: \(result.stdout)")
            }
            for call in calls {
                #expect((Int(call.last ?? "") ?? .max) <= 400, "\(call.joined(separator: " "))")
            }
            let huge = calls.filter { $0.count == 5 && $0[1] == "huge" }.map { "\($0[2]) \($0[3])" }
            #expect(huge == ["Get org.freedesktop.DBus.Error.UnknownProperty", "GetAll org.freedesktop.DBus.Error.UnknownInterface",
                             "Set org.freedesktop.DBus.Error.UnknownProperty"], "\(result.stdout)")
        }
    }
}
