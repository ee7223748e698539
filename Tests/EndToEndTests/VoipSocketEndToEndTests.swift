import Foundation
import Glibc
import Testing
import VigilHost
import VigilTestSupport

/// vigild running a voip-socket strategy against a real pong server (its own
/// process): the connection's lease and its live Status on D-Bus.
extension EndToEnd {
    @Suite struct VoipSocketEndToEndTests {
        @Test func leaseAndStatusAreOnTheBus() async throws {
            let server = ProcessRunner.process("/usr/bin/python3")
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

        /// A subscriber on the will topic sees no will when vigild stops
        /// cleanly or a reload removes the strategy (DISCONNECT went first),
        /// and sees it when vigild is killed with SIGKILL.
        @Test(arguments: ["3.1.1", "5"]) func mqttWillOnlyWhenVigildDies(version: String) async throws {
            let dir = try makeTemporaryDirectory("voip-mqtt-will")
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let broker = try TestMosquitto.start(in: dir)
            defer { broker.server.stop() }
            let seen = dir + "/subscriber.out"
            let subscriber = try spawnQuietly("/usr/bin/mosquitto_sub", [
                "-h", "127.0.0.1", "-p", String(broker.port), "-t", "status/vigil", "-v", "-i", "will-watcher",
            ], environment: ["PATH": "/usr/bin:/bin"], stdout: seen)
            defer {
                kill(subscriber, SIGKILL)
                waitpid(subscriber, nil, 0)
            }
            #expect(await broker.server.waitForLog("Sending SUBACK to will-watcher"), "\(broker.server.log)")
            let strategy = """
                [[strategy]]
                name = "mqtt"
                kind = "voip-socket"
                connect = "127.0.0.1:\(broker.port)"
                protocol = "mqtt"
                keepalive_interval = "30s"
                [strategy.mqtt]
                version = "\(version)"
                client_id = "vigil-will"
                [strategy.mqtt.will]
                topic = "status/vigil"
                message = "offline"
                """
            // What the subscriber got up to a marker published after the
            // event: a will would have come before it.
            var markers = 0
            func seenUpToMarker() async throws -> String {
                markers += 1
                try await TestMosquitto.publish(port: broker.port, topic: "status/vigil", message: "marker-\(markers)")
                let text = try await Self.waitForFile(seen, containing: "marker-\(markers)")
                return text
            }
            try await BusHost.with(strategies: strategy) { host in
                #expect(await broker.server.waitForLog("Sending CONNACK to vigil-will"), "\(broker.server.log)")
                // A reload that removes the strategy.
                try host.dir.write("vigil.toml", hostConfig(stateDir: host.stateDir, interval: "60s", extra: "bus = \"\(host.address)\"\n"))
                let reload = try host.vigilctl("reload")
                #expect(reload.status == 0, "\(reload.stdout)\(reload.stderr)")
                #expect(await broker.server.waitForLog("Received DISCONNECT from vigil-will"), "\(broker.server.log)")
                #expect(!(try await seenUpToMarker()).contains("offline"))
                // Back, then a clean stop of vigild.
                try host.dir.write("vigil.toml", hostConfig(stateDir: host.stateDir, interval: "60s", extra: "bus = \"\(host.address)\"\n\n" + strategy))
                _ = try host.vigilctl("reload")
                #expect(await broker.server.waitForLog("Sending CONNACK to vigil-will", count: 2), "\(broker.server.log)")
                host.daemon.signal(SIGTERM)
                #expect(await host.daemon.waitForExit() == 0, "\(host.daemon.output.suffix(20))")
                #expect(await broker.server.waitForLog("Received DISCONNECT from vigil-will", count: 2), "\(broker.server.log)")
                #expect(!(try await seenUpToMarker()).contains("offline"))
                #expect(host.daemon.output.contains { $0.contains("stopping: sent DISCONNECT to the broker") }, "\(host.daemon.output)")
                #expect(durationsOverTwoUnits(in: host.daemon.output).isEmpty, "\(host.daemon.output)")
            }
            // A vigild killed with SIGKILL says no goodbye: the will is published.
            try await BusHost.with(strategies: strategy) { host in
                #expect(await broker.server.waitForLog("Sending CONNACK to vigil-will", count: 3), "\(broker.server.log)")
                host.daemon.signal(SIGKILL)
                _ = await host.daemon.waitForExit()
                let text = try await Self.waitForFile(seen, containing: "status/vigil offline")
                #expect(text.contains("status/vigil offline"), "\(text)\n\(broker.server.log)")
                #expect(broker.server.lines(containing: "Received DISCONNECT from vigil-will").count == 2, "\(broker.server.log)")
            }
        }

        /// vigild registered with kamailio beside another device's binding
        /// for the same address of record: when vigild stops (SIGTERM), its
        /// binding, and only it, is gone from the registrar within 2 s.
        @Test func sipBindingIsGoneWithin2sOfVigildStopping() async throws {
            let dir = try makeTemporaryDirectory("voip-sip-stop")
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let registrar = try TestKamailio.start(in: dir)
            defer { registrar.server.stop() }
            try TestKamailio.registerAnotherDevice(port: registrar.port, contact: "<sip:alice@192.0.2.9:5060;transport=tcp>", expires: 300)
            try await BusHost.with(strategies: """
                [[strategy]]
                name = "sip"
                kind = "voip-socket"
                connect = "127.0.0.1:\(registrar.port)"
                protocol = "sip"
                [strategy.sip]
                aor = "sip:alice@example.org"
                expires = "120s"
                """) { host in
                let registered = try await host.daemon.waitForLine(containing: "registered sip:alice@example.org for")
                #expect(registered.contains("for 2m "), "\(registered)")
                let ours = try TestKamailio.bindings(of: registrar.server).filter { $0.contains("127.0.0.1") }
                #expect(ours.count == 1, "\(ours)")
                let stopping = ContinuousClock.now
                host.daemon.signal(SIGTERM)
                #expect(await host.daemon.waitForExit() == 0)
                var bindings = try TestKamailio.bindings(of: registrar.server)
                while bindings.contains(where: { $0.contains("127.0.0.1") }), ContinuousClock.now - stopping < .seconds(2) {
                    try await Task.sleep(for: .milliseconds(20))
                    bindings = try TestKamailio.bindings(of: registrar.server)
                }
                let gone = ContinuousClock.now - stopping
                #expect(!bindings.contains { $0.contains("127.0.0.1") }, "\(bindings) after \(gone)")
                #expect(bindings.contains { $0.contains("192.0.2.9") }, "\(bindings)")
            }
        }

        /// Waits (bounded) until `file` (another process writes it) contains `text`; returns its content.
        static func waitForFile(_ file: String, containing text: String, timeout: Duration = .seconds(15)) async throws -> String {
            let end = ContinuousClock.now + timeout
            var content = ""
            while ContinuousClock.now < end {
                content = (try? String(contentsOfFile: file, encoding: .utf8)) ?? ""
                if content.contains(text) { return content }
                try await Task.sleep(for: .milliseconds(50))
            }
            return content
        }

        static func uint(_ key: String, in text: String) -> UInt64? {
            guard let range = text.range(of: "\"\(key)\" t ") else { return nil }
            return UInt64(text[range.upperBound...].prefix { $0.isNumber })
        }
    }
}
