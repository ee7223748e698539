import Foundation
import Glibc
import Testing
import VigilDBus
import VigilHost

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
            """

        static func begin(_ connection: DBusConnection, name: String) async throws -> (path: String, fd: DBusFileDescriptor) {
            let reply = try await connection.call(
                destination: HostBusNames.busName, path: HostBusNames.rootPath, interface: HostBusNames.hostInterface,
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
                destination: HostBusNames.busName, path: HostBusNames.rootPath, interface: HostBusNames.hostInterface,
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
            let bus = try SystemLikeBus(includingPolicy: true)
            defer { bus.stop() }
            let dir = try TempDir("vigil-trust")
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\""))
            let daemon = try Daemon(arguments: ["--config", config])
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")

            let observer = try await DBusConnection.connect(to: .address(bus.address))
            let releases = try await observer.signals(matching: DBusMatchRule(
                sender: HostBusNames.busName, path: HostBusNames.rootPath, interface: HostBusNames.hostInterface, member: "LeaseReleased"))
            let victim = try await DBusConnection.connect(to: .address(bus.address))
            let witness = try await DBusConnection.connect(to: .address(bus.address))
            let victimLease = try await Self.begin(victim, name: "victim")
            let witnessLease = try await Self.begin(witness, name: "witness")
            defer { victimLease.fd.close(); witnessLease.fd.close() }

            let forged = try asNobody("/usr/bin/python3", ["-c", Self.forger, bus.address, await victim.uniqueName])
            #expect(forged.status == 0 && forged.stdout.contains("forged"), "\(forged.stdout)\(forged.stderr)")
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
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}
