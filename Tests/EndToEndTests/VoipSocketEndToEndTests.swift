import Foundation
import Glibc
import Testing
import VigilHost

/// vigild running a voip-socket strategy against a real pong server (its own
/// process): the connection's lease and its live Status on D-Bus.
extension EndToEnd {
    @Suite struct VoipSocketEndToEndTests {
        @Test func leaseAndStatusAreOnTheBus() async throws {
            let server = Process()
            server.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            server.arguments = [Build.packageRoot.appendingPathComponent("Tests/Fixtures/voip-pong-server.py").path]
            let out = Pipe()
            server.standardOutput = out
            try server.run()
            defer {
                kill(server.processIdentifier, SIGKILL)
                server.waitUntilExit()
            }
            let port = try #require(UInt16(String(decoding: out.fileHandleForReading.availableData, as: UTF8.self)
                .trimmingCharacters(in: .whitespacesAndNewlines)))
            try await BusHost.with(strategies: """
                [[strategy]]
                name = "sip"
                kind = "voip-socket"
                connect = "127.0.0.1:\(port)"
                keepalive_interval = "300ms"
                handler_timeout = "200ms"
                ping = '\\r\\n\\r\\n'
                expect = '\\r\\n'
                skip_ping_on_traffic = false
                """) { host in
                let path = try await host.leasePath(strategy: "sip")
                let holds = try host.busctl(["get-property", BusHost.name, path, "org.vigil.Vigil1.Lease", "Holds"])
                #expect(holds.stdout.contains("tcp connection to 127.0.0.1:\(port)"), "\(holds.stdout) \(holds.stderr)")
                // Pings every 240–300 ms; Status is announced at most once a second.
                var status = ""
                for _ in 0..<50 {
                    status = try host.busctl(["get-property", BusHost.name, path, "org.vigil.Vigil1.Lease", "Status"]).stdout
                    if status.contains("\"State\" s \"up\""), let pings = Self.uint("Pings", in: status), pings >= 2 { break }
                    try await Task.sleep(for: .milliseconds(200))
                }
                #expect(status.contains("\"State\" s \"up\""), "\(status)")
                #expect(status.contains("\"Remote\" s \"127.0.0.1:\(port)\""), "\(status)")
                #expect(status.contains("\"Local\" s \"127.0.0.1:"), "\(status)")
                #expect((Self.uint("Pings", in: status) ?? 0) >= 2, "\(status)")
                #expect(status.contains("\"Overruns\" t 0") && status.contains("\"Reconnects\" t 0"), "\(status)")
                #expect(status.contains("\"LastRttUsec\" x "), "\(status)")
                let leases = try host.vigilctl("leases")
                #expect(leases.stdout.contains("tcp connection to 127.0.0.1:\(port)") && leases.stdout.contains("State"), "\(leases.stdout)")
            }
        }

        static func uint(_ key: String, in text: String) -> UInt64? {
            guard let range = text.range(of: "\"\(key)\" t ") else { return nil }
            return UInt64(text[range.upperBound...].prefix { $0.isNumber })
        }
    }
}
