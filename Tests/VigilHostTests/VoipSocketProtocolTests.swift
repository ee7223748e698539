import Foundation
import Glibc
import Testing
import VigilHost
import VigilKit
import VigilTestSupport

/// voip-socket's protocols (raw framing, MQTT, SIP) and TLS, against the
/// loopback server and real mosquitto and kamailio processes the tests start.
/// Serialized: each test starts real servers (mosquitto, kamailio, openssl);
/// one at a time keeps that load from disturbing the timing tests of the
/// other voip-socket suites that run beside it.
@Suite(.serialized) struct VoipSocketProtocolTests {
    /// An on_data hook that appends each run's stdin and a separator line to a file.
    static func recorder(_ file: String) -> ConfigValue {
        strings(["sh", "-c", "cat >> \(file); printf '|%s|%s|%s\\n' \"$VIGIL_BYTES\" \"$VIGIL_TOPIC\" \"$VIGIL_METHOD\" >> \(file)"])
    }

    static func read(_ file: String) -> String { (try? String(contentsOfFile: file, encoding: .utf8)) ?? "" }

    @Test func protocolOptionsAreCheckedClearly() throws {
        let text = try VoipSocketPlugin.problems([
            "connect": .string("127.0.0.1:1883"), "protocol": .string("mqt"), "ca_file": .string("/nonexistent"),
        ]).joined(separator: "\n")
        #expect(text.contains("strategy[0].protocol: unknown protocol \"mqt\" (did you mean \"mqtt\"?)"), "\(text)")
        #expect(text.contains("strategy[0].ca_file: only applies with tls = true"), "\(text)")
        let mqtt = try VoipSocketPlugin.problems([
            "connect": .string("127.0.0.1:1883"), "protocol": .string("mqtt"), "ping": .string("x"), "keepalive_interval": .string("1.5s"),
            "mqtt": .table(["password": .string("p"), "will": .table(["qos": .integer(3)]), "sbuscribe": .array([])]),
        ]).joined(separator: "\n")
        #expect(mqtt.contains("strategy[0].ping: is only for protocol = \"raw\""), "\(mqtt)")
        #expect(mqtt.contains("strategy[0].keepalive_interval: is MQTT's keep-alive"), "\(mqtt)")
        #expect(mqtt.contains("strategy[0].mqtt.username: MQTT 3.1.1 sends a password only with a user name"), "\(mqtt)")
        #expect(mqtt.contains("strategy[0].mqtt.will.topic: missing required key"), "\(mqtt)")
        #expect(mqtt.contains("strategy[0].mqtt.will.qos: expected an integer in 0...2, found 3"), "\(mqtt)")
        #expect(mqtt.contains("strategy[0].mqtt.sbuscribe: unknown key \"sbuscribe\" (did you mean \"subscribe\"?)"), "\(mqtt)")
        let versions = try VoipSocketPlugin.problems([
            "connect": .string("127.0.0.1:1883"), "protocol": .string("mqtt"), "mqtt": .table(["version": .string("4")]),
        ]).joined(separator: "\n")
        #expect(versions.contains("strategy[0].mqtt.version: expected \"3.1.1\" or \"5\", found \"4\""), "\(versions)")
        // MQTT 5 may send a password without a user name.
        #expect(try VoipSocketPlugin.problems([
            "connect": .string("127.0.0.1:1883"), "protocol": .string("mqtt"), "mqtt": .table(["version": .string("5"), "password": .string("p")]),
        ]).isEmpty)
        let sip = try VoipSocketPlugin.problems([
            "connect": .string("127.0.0.1:5060"), "protocol": .string("sip"), "tls": .boolean(true), "ca_file": .string("/nonexistent/ca.pem"),
            "sip": .table(["aor": .string("alice@example.org"), "expires": .string("1.5s")]),
        ]).joined(separator: "\n")
        #expect(sip.contains("strategy[0].sip.aor: expected an address of record such as \"sip:alice@example.org\""), "\(sip)")
        #expect(sip.contains("strategy[0].sip.expires: expected whole seconds"), "\(sip)")
        let tls = try VoipSocketPlugin.problems([
            "connect": .string("127.0.0.1:5061"), "tls": .boolean(true), "ca_file": .string("/nonexistent/ca.pem"),
        ]).joined(separator: "\n")
        #expect(tls.contains("strategy[0].ca_file: cannot load the CA certificates from /nonexistent/ca.pem"), "\(tls)")
    }

    // MARK: raw

    /// With a delimiter, a line that arrives before the pong is data, byte
    /// for byte, and the pong is still recognised after it.
    @Test func rawPongAfterInterleavedDataWithADelimiter() async throws {
        let dir = try makeTemporaryDirectory("voip-raw")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let out = dir + "/data"
        let server = try LoopbackServer(ping: Array("PING\n".utf8), pong: Array("note: PONG later\nPONG\n".utf8))
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("300ms"), "jitter": .integer(0),
            "handler_timeout": .string("250ms"), "ping": .string("PING\n"), "expect": .string("PONG"), "delimiter": .string("\n"),
            "skip_ping_on_traffic": .boolean(false), "on_data": Self.recorder(out),
        ])
        let status = await h.waitForStatus { $0["Pings"]?.uintValue ?? 0 >= 3 }
        #expect(await h.waitForEvent("data", count: 2))
        await h.supervisor.stopAll()
        #expect(status["Overruns"]?.uintValue == 0, "\(status)")
        #expect(status["Reconnects"]?.uintValue == 0, "\(status)")
        let runs = Self.read(out).split(separator: "\n", omittingEmptySubsequences: false)
        let payload = runs.filter { !$0.hasPrefix("|") && !$0.isEmpty }
        #expect(!payload.isEmpty && payload.allSatisfy { $0 == "note: PONG later" }, "\(runs)")
    }

    /// Without a delimiter the pong counts only as the first bytes after the
    /// ping: data first means no pong this round (the handler overruns), and
    /// the pong bytes inside the data reach on_data untouched.
    @Test func rawPongIsNeverFoundInsideOtherData() async throws {
        let dir = try makeTemporaryDirectory("voip-raw")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let out = dir + "/data"
        let server = try LoopbackServer(ping: Array("PING".utf8), pong: Array("xPONG".utf8))
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "keepalive_interval": .string("300ms"), "jitter": .integer(0),
            "handler_timeout": .string("200ms"), "ping": .string("PING"), "expect": .string("PONG"),
            "skip_ping_on_traffic": .boolean(false), "on_data": Self.recorder(out),
            "reconnect": .table(["initial": .string("50ms"), "max": .string("100ms")]),
        ])
        #expect(await h.waitForEvent("handler-overrun"))
        #expect(await h.waitForEvent("data"))
        await h.supervisor.stopAll()
        #expect(Self.read(out).hasPrefix("xPONG|5|"), "\(Self.read(out).debugDescription)")
    }

    // MARK: SIP framing

    /// A SIP request that arrives just before the CRLF pong reaches on_data
    /// whole (request line, headers, body), and the pong is still the pong.
    @Test func sipRequestBeforeThePongIsDeliveredWhole() async throws {
        let dir = try makeTemporaryDirectory("voip-sip")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let out = dir + "/data"
        let message = "MESSAGE sip:alice@example.org SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.1:5060;branch=z9hG4bK1\r\nl: 5\r\n\r\nhello"
        let server = try LoopbackServer(pong: Array((message + "\r\n").utf8))
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "protocol": .string("sip"), "keepalive_interval": .string("300ms"), "jitter": .integer(0),
            "handler_timeout": .string("250ms"), "skip_ping_on_traffic": .boolean(false), "on_data": Self.recorder(out),
        ])
        let status = await h.waitForStatus { $0["Pings"]?.uintValue ?? 0 >= 2 }
        #expect(await h.waitForEvent("data", count: 2))
        await h.supervisor.stopAll()
        #expect(status["Overruns"]?.uintValue == 0, "\(status)")
        #expect(status["LastRttUsec"]?.intValue ?? -1 >= 0, "\(status)")
        let text = Self.read(out)
        #expect(text.hasPrefix(message + "|\(message.utf8.count)||MESSAGE\n" + message + "|"), "\(text.debugDescription)")
    }

    // MARK: MQTT against mosquitto

    /// The broker sees the configured keep-alive; PINGREQ/PINGRESP keep the
    /// session through several intervals while the broker publishes every
    /// second (which must not postpone the ping), and each message reaches
    /// on_data whole. The keep-alive is 5 s: mosquitto cuts a client after
    /// 1.5 intervals of silence, and CI once stalled this process for 4 s,
    /// which a 2 s keep-alive (cut after 3 s) did not survive.
    @Test(arguments: [false, true]) func mqttKeepsASessionWithMosquitto(tls: Bool) async throws {
        let dir = try makeTemporaryDirectory("voip-mqtt")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let certificates = tls ? try TestCertificates() : nil
        defer { certificates?.remove() }
        let broker = try TestMosquitto.start(in: dir, certificates: certificates)
        defer { broker.server.stop() }
        let out = dir + "/data"
        var values: [String: ConfigValue] = [
            "connect": .string("127.0.0.1:\(tls ? broker.tlsPort ?? 0 : broker.port)"), "protocol": .string("mqtt"),
            "keepalive_interval": .string("5s"), "handler_timeout": .string("1s"), "on_data": Self.recorder(out),
            "mqtt": .table(["client_id": .string("vigil-test"), "subscribe": strings(["vigil/test/#"])]),
        ]
        if let certificates { values["tls"] = .boolean(true); values["ca_file"] = .string(certificates.caCertificate) }
        let h = try VoipHarness()
        try await h.start(values)
        #expect(await broker.server.waitForLog("as vigil-test (p2, c1, k5)"), "\(broker.server.log)")
        #expect(await broker.server.waitForLog("Received SUBSCRIBE from vigil-test"))
        let publisher = Task {
            for i in 1...11 {
                try await TestMosquitto.publish(port: broker.port, topic: "vigil/test/\(i)", message: "message \(i) with spaces\nand a line")
                try await Task.sleep(for: .seconds(1))
            }
        }
        try await publisher.value
        #expect(await broker.server.waitForLog("Received PINGREQ from vigil-test", count: 2))
        #expect(await h.waitForEvent("data", count: 11))
        // The broker logs a PINGREQ before it answers; the status counts
        // the ping once the answer came and the plugin published it.
        _ = await h.waitForStatus { $0["Pings"]?.uintValue ?? 0 >= 2 }
        let status = await Self.expectSessionKept(h, broker.server, messages: (1...11).map { "message \($0) with spaces\nand a line" }, in: out)
        #expect(status["Pings"]?.uintValue ?? 0 >= 2, "\(status)")
        #expect(status["Protocol"]?.stringValue == (tls ? "mqtt+tls" : "mqtt"), "\(status)")
    }

    /// Stops `h` and checks that its MQTT session lasted (no broker timeout,
    /// no reconnect) and that message i reached on_data whole from topic
    /// vigil/test/i (`out`: the recorder's file); the last status.
    static func expectSessionKept(_ h: VoipHarness, _ broker: TestServerProcess, messages: [String], in out: String) async -> [String: StatusValue] {
        let status = await h.status()
        await h.supervisor.stopAll()
        #expect(broker.lines(containing: "exceeded timeout").isEmpty, "\(broker.log)")
        #expect(status["Reconnects"]?.uintValue == 0, "\(status)")
        let text = read(out)
        for (i, body) in zip(1..., messages) {
            #expect(text.contains(body + "|\(body.utf8.count)|vigil/test/\(i)|\n"), "\(i): \(text.debugDescription)")
        }
        return status
    }

    /// A wrong password: CONNACK's refusal is the LastError, and the retry
    /// waits the longest backoff instead of hammering the broker.
    @Test func mqttWrongPasswordIsAClearErrorAndRetriesSlowly() async throws {
        let dir = try makeTemporaryDirectory("voip-mqtt")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let broker = try TestMosquitto.start(in: dir, user: ("alice", "right"))
        defer { broker.server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string("127.0.0.1:\(broker.port)"), "protocol": .string("mqtt"), "keepalive_interval": .string("5s"),
            "mqtt": .table(["username": .string("alice"), "password": .string("wrong")]),
            "reconnect": .table(["initial": .string("50ms"), "max": .string("1500ms"), "jitter": .boolean(false)]),
        ])
        #expect(await h.waitForEvent("connect-failed", count: 2, timeout: .seconds(20)))
        let status = await h.waitForStatus { !($0["LastError"]?.stringValue.isEmpty ?? true) }
        await h.supervisor.stopAll()
        // mosquitto 2 answers a wrong password with code 5 (not authorized).
        #expect(status["LastError"]?.stringValue == "the broker refused the connection: not authorized (username, password, or the broker's access rules)", "\(status)")
        // The second attempt came after the longest backoff (1.5 s), not 50 ms.
        let attempts = broker.server.lines(containing: "Sending CONNACK to 127.0.0.1 (0, 5)")
        #expect(attempts.count >= 2, "\(broker.server.log)")
        let stamps = attempts.compactMap { Double($0.split(separator: ":").first ?? "") }
        if stamps.count >= 2 { #expect(stamps[1] - stamps[0] >= 1, "\(attempts)") }
    }

    /// MQTT 5: the broker sees protocol 5; a broker that caps the
    /// keep-alive says so in CONNACK (Server Keep Alive) and the pings
    /// follow it, not the configured 60 s; messages whose PUBLISH carries
    /// properties reach on_data whole.
    @Test func mqtt5FollowsTheBrokersKeepAliveAndDeliversMessages() async throws {
        let dir = try makeTemporaryDirectory("voip-mqtt5")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        // mosquitto's least max_keepalive; an MQTT 5 client is told in CONNACK.
        let broker = try TestMosquitto.start(in: dir, options: ["max_keepalive 10"])
        defer { broker.server.stop() }
        let out = dir + "/data"
        let h = try VoipHarness()
        try await h.start([
            "connect": .string("127.0.0.1:\(broker.port)"), "protocol": .string("mqtt"),
            "keepalive_interval": .string("60s"), "handler_timeout": .string("1s"), "on_data": Self.recorder(out),
            "mqtt": .table(["version": .string("5"), "client_id": .string("vigil-test5"), "subscribe": strings(["vigil/test/#"])]),
        ])
        #expect(await broker.server.waitForLog("as vigil-test5 (p5, c1, k60)"), "\(broker.server.log)")  // what the client asked for
        #expect(await broker.server.waitForLog("Received SUBSCRIBE from vigil-test5"))
        for i in 1...3 {
            try await TestMosquitto.publish(port: broker.port, topic: "vigil/test/\(i)", message: "message \(i)\nwith a line", options: [
                "-V", "mqttv5", "-D", "publish", "message-expiry-interval", "600", "-D", "publish", "user-property", "origin", "test",
            ])
        }
        // A ping within the broker's 10 s: with the 60 s asked for, the first
        // would come after 48 s at the earliest (jitter: 80-100 %).
        #expect(await broker.server.waitForLog("Received PINGREQ from vigil-test5", timeout: .seconds(12)), "\(broker.server.log)")
        #expect(await broker.server.waitForLog("Sending PINGRESP to vigil-test5"))
        #expect(await h.waitForEvent("data", count: 3))
        _ = await Self.expectSessionKept(h, broker.server, messages: (1...3).map { "message \($0)\nwith a line" }, in: out)
    }

    /// MQTT 5 answers carry reason codes: a wrong password is refused with
    /// its reason, and a broker's DISCONNECT (mosquitto's for a packet over
    /// its max_packet_size) is the LastError, not a bare "closed".
    @Test func mqtt5RefusalsAndDisconnectsNameTheirReason() async throws {
        let dir = try makeTemporaryDirectory("voip-mqtt5")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let broker = try TestMosquitto.start(in: dir, user: ("alice", "right"), options: ["max_packet_size 64"])
        defer { broker.server.stop() }
        func start(_ mqtt: [String: ConfigValue]) async throws -> VoipHarness {
            let h = try VoipHarness()
            try await h.start([
                "connect": .string("127.0.0.1:\(broker.port)"), "protocol": .string("mqtt"), "keepalive_interval": .string("5s"),
                "mqtt": .table(mqtt.merging(["version": .string("5"), "username": .string("alice")]) { a, _ in a }),
                "reconnect": .table(["initial": .string("1h")]),
            ])
            return h
        }
        let refused = try await start(["password": .string("wrong")])
        let refusal = await refused.waitForStatus { !($0["LastError"]?.stringValue.isEmpty ?? true) }
        await refused.supervisor.stopAll()
        // mosquitto 2.0 answers a wrong password with 0x87 (not authorized).
        #expect(broker.server.lines(containing: "Sending CONNACK to 127.0.0.1 (0, 135)").count == 1, "\(broker.server.log)")
        #expect(refusal["LastError"]?.stringValue
            == "the broker refused the connection: not authorized (username, password, or the broker's access rules)", "\(refusal)")

        // Accepted, then a SUBSCRIBE over the broker's 64-byte limit.
        let h = try await start(["password": .string("right"), "client_id": .string("vigil-big"),
                                 "subscribe": strings([String(repeating: "t", count: 80)])])
        let status = await h.waitForStatus { !($0["LastError"]?.stringValue.isEmpty ?? true) }
        await h.supervisor.stopAll()
        #expect(await broker.server.waitForLog("as vigil-big (p5, c1, k5, u'alice')"), "\(broker.server.log)")
        #expect(status["LastError"]?.stringValue == "the broker disconnected: packet too large", "\(status)")
    }

    // MARK: SIP against kamailio

    /// REGISTER with digest authentication is accepted (200), renewed before
    /// it expires, the Flow-Timer sets the ping interval, and CRLF
    /// keep-alives get their pong.
    @Test(arguments: [false, true]) func sipRegistersAndKeepsTheFlowWithKamailio(tls: Bool) async throws {
        let dir = try makeTemporaryDirectory("voip-sip")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let certificates = tls ? try TestCertificates() : nil
        defer { certificates?.remove() }
        let registrar = try TestKamailio.start(in: dir, password: "secret", flowTimer: 1, certificates: certificates)
        defer { registrar.server.stop() }
        var values: [String: ConfigValue] = [
            "connect": .string("127.0.0.1:\(tls ? registrar.tlsPort ?? 0 : registrar.port)"), "protocol": .string("sip"),
            "keepalive_interval": .string("30s"), "handler_timeout": .string("500ms"),
            "sip": .table(["aor": .string("sip:alice@example.org"), "password": .string("secret"), "expires": .string("2s")]),
        ]
        if let certificates { values["tls"] = .boolean(true); values["ca_file"] = .string(certificates.caCertificate) }
        let out = dir + "/data"
        values["on_data"] = Self.recorder(out)
        let h = try VoipHarness()
        try await h.start(values)
        // A MESSAGE from another client, relayed by kamailio to the
        // registered contact over this flow, reaches on_data whole.
        _ = await h.waitForStatus(timeout: .seconds(20)) { $0["Registrations"]?.uintValue ?? 0 >= 1 }
        let message = try Self.sendMessage(to: registrar.port, body: "hello over \(tls ? "tls" : "tcp")")
        #expect(await h.waitForEvent("data"))
        let delivered = Self.read(out)
        #expect(delivered.hasPrefix("MESSAGE sip:alice@127.0.0.1:") && delivered.contains("Call-ID: \(message)\r\n")
            && delivered.contains("\r\n\r\nhello over \(tls ? "tls" : "tcp")|") && delivered.hasSuffix("||MESSAGE\n"), "\(delivered.debugDescription)")
        // Registered, then renewed twice (every second for a 2 s expiry).
        let status = await h.waitForStatus(timeout: .seconds(20)) { $0["Registrations"]?.uintValue ?? 0 >= 3 && $0["Pings"]?.uintValue ?? 0 >= 3 }
        await h.supervisor.stopAll()
        #expect(status["Registrations"]?.uintValue ?? 0 >= 3, "\(status)\n\(registrar.server.log)")
        // Pings every ~1 s (Flow-Timer: 1), not every 30 s, each answered.
        #expect(status["Pings"]?.uintValue ?? 0 >= 3, "\(status)")
        #expect(status["Overruns"]?.uintValue == 0, "\(status)")
        #expect(status["Reconnects"]?.uintValue == 0, "\(status)")
        #expect(!registrar.server.lines(containing: "registered sip:alice@example.org contact <sip:alice@127.0.0.1:").isEmpty, "\(registrar.server.log)")
        #expect(registrar.server.lines(containing: "over \(tls ? "tls" : "tcp") cseq").count >= 4, "\(registrar.server.log)")
    }

    /// Another device registered for the same AOR before us: kamailio lists
    /// its binding first, in one comma-separated Contact header with ours.
    /// With a longer binding first, our own granted time is used; with a
    /// stale one first, we do not re-register before half our own time
    /// (the old code took the first binding's expiry: 1m50s, or a
    /// re-registration loop as the stale one ran out). On a clean stop our
    /// binding, and only ours, is gone from the registrar within 2 s.
    @Test(arguments: [300, 3]) func sipUsesOnlyItsOwnBindingAndRemovesItAtStop(otherExpires: Int) async throws {
        let dir = try makeTemporaryDirectory("voip-sip-bindings")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let registrar = try TestKamailio.start(in: dir)
        defer { registrar.server.stop() }
        let other = "<sip:alice@192.0.2.9:5060;transport=tcp>"
        let answer = try TestKamailio.registerAnotherDevice(port: registrar.port, contact: other, expires: otherExpires)
        #expect(answer.hasPrefix("SIP/2.0 200"), "\(answer)")
        let h = try VoipHarness()
        try await h.start([
            "connect": .string("127.0.0.1:\(registrar.port)"), "protocol": .string("sip"),
            "keepalive_interval": .string("30s"), "handler_timeout": .string("500ms"),
            "sip": .table(["aor": .string("sip:alice@example.org"), "expires": .string("8s")]),
        ])
        let registered = await h.waitForStatus(timeout: .seconds(20)) { $0["Registrations"]?.uintValue ?? 0 >= 1 && $0["State"]?.stringValue == "up" }
        #expect(registered["Registrations"]?.uintValue == 1, "\(registered)")
        let line = h.logs.entries.first { $0.contains("registered sip:alice@example.org for") } ?? ""
        #expect(line.contains("for 8s"), "\(h.logs.entries)\n\(registrar.server.log)")
        let local = registered["Local"]?.stringValue ?? ""
        #expect(try TestKamailio.bindings(of: registrar.server).contains { $0.contains(local) }, "\(local)")
        // Our refresh is due at half of 8 s: none before 3.5 s (the stale
        // binding's 3 s drove re-registrations every second or faster).
        let started = ContinuousClock.now
        let renewed = await h.waitForStatus(timeout: .seconds(10)) { $0["Registrations"]?.uintValue ?? 0 >= 2 }
        #expect(renewed["Registrations"]?.uintValue == 2 && ContinuousClock.now - started >= .milliseconds(3_500),
                "\(renewed) after \(ContinuousClock.now - started)\n\(h.logs.entries)")
        #expect(renewed["Reconnects"]?.uintValue == 0 && renewed["LastError"]?.stringValue == "", "\(renewed)")
        let stopped = ContinuousClock.now
        await h.supervisor.stopAll()
        var bindings = try TestKamailio.bindings(of: registrar.server)
        while bindings.contains(where: { $0.contains(local) }), ContinuousClock.now - stopped < .seconds(2) {
            try await Task.sleep(for: .milliseconds(50))
            bindings = try TestKamailio.bindings(of: registrar.server)
        }
        #expect(!bindings.contains { $0.contains(local) }, "\(bindings)\n\(h.logs.entries)")
        // The other device's binding stays (while it has not expired).
        if otherExpires > 100 { #expect(bindings.contains { $0.contains("192.0.2.9") }, "\(bindings)") }
        #expect(h.logs.entries.contains { $0.contains("stopping: removed our registration of sip:alice@example.org (Expires: 0)") }, "\(h.logs.entries)")
        #expect(durationsOverTwoUnits(in: h.logs.entries).isEmpty, "\(h.logs.entries)")
    }

    /// Our binding among others as registrars list them: in a later Contact
    /// header after a display name with a comma and a URI with one; by
    /// +sip.instance and reg-id when the registrar rewrote our URI, in the
    /// middle of one comma-separated header; and absent, which is an error
    /// that says so.
    @Test func sipFindsItsOwnBindingHoweverTheRegistrarListsIt() async throws {
        let other = "\"Desk, phone\" <sip:alice@192.0.2.9:5060;transport=tcp;x=a,b>;expires=110"
        for (contacts, expected) in [
            ([other, "{ours};expires=30"], "registered sip:alice@example.org for 30s"),
            (["<sip:alice@192.0.2.9:5060>;expires=110, <sip:alice@198.51.100.1:4444;transport=tcp>;+sip.instance=\"{instance}\";reg-id=1;expires=40, <sip:alice@192.0.2.10>;expires=5"],
             "registered sip:alice@example.org for 40s"),
            ([other], "lists 1 binding for sip:alice@example.org, none of them ours (contact <sip:alice@127.0.0.1:"),
        ] {
            let dir = try makeTemporaryDirectory("voip-sip-stub")
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let registrar = try TestPongServer.start(in: dir, contacts: contacts)
            defer { registrar.server.stop() }
            let h = try VoipHarness()
            try await h.start([
                "connect": .string("127.0.0.1:\(registrar.port)"), "protocol": .string("sip"),
                "sip": .table(["aor": .string("sip:alice@example.org"), "expires": .string("60s")]),
            ])
            // The line itself is awaited: a first status can show the
            // registration counted before the binding check's error (a
            // stress run saw it), and both are logged.
            _ = await h.logs.wait(forLineContaining: expected)
            let status = await h.status("voip")
            await h.supervisor.stopAll()
            let said = h.logs.entries + [status["LastError"]?.stringValue ?? ""]
            #expect(said.contains { $0.contains(expected) }, "\(contacts): \(said)\n\(registrar.server.log)")
        }
    }

    /// Sends a MESSAGE for sip:alice@example.org to kamailio over a TCP
    /// connection of its own (python3's socket module: another client);
    /// returns its Call-ID.
    static func sendMessage(to port: Int, body: String) throws -> String {
        let callID = "msg-\(UInt32.random(in: 0...UInt32.max))"
        let script = """
            import socket, sys
            s = socket.create_connection(("127.0.0.1", \(port)))
            local = "%s:%d" % s.getsockname()
            body = sys.argv[2]
            request = ("MESSAGE sip:alice@example.org SIP/2.0\\r\\nVia: SIP/2.0/TCP " + local + ";branch=z9hG4bK" + sys.argv[1] + "\\r\\n"
                "Max-Forwards: 70\\r\\nFrom: <sip:bob@example.org>;tag=b1\\r\\nTo: <sip:alice@example.org>\\r\\n"
                "Call-ID: " + sys.argv[1] + "\\r\\nCSeq: 1 MESSAGE\\r\\nContent-Type: text/plain\\r\\n"
                "Content-Length: %d\\r\\n\\r\\n" % len(body)) + body
            s.sendall(request.encode())
            s.close()
            """
        try ProcessRunner.checkedOutput("/usr/bin/python3", ["-c", script, callID, body])
        return callID
    }

    /// A wrong SIP password is a clear LastError.
    @Test func sipWrongPasswordIsAClearError() async throws {
        let dir = try makeTemporaryDirectory("voip-sip")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let registrar = try TestKamailio.start(in: dir, password: "secret")
        defer { registrar.server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string("127.0.0.1:\(registrar.port)"), "protocol": .string("sip"),
            "sip": .table(["aor": .string("sip:alice@example.org"), "password": .string("wrong")]),
        ])
        // The event is recorded before the backoff publishes LastError: wait for the status.
        let status = await h.waitForStatus { !($0["LastError"]?.stringValue.isEmpty ?? true) }
        await h.supervisor.stopAll()
        #expect(status["LastError"]?.stringValue.hasPrefix("the registrar refused REGISTER: 401 Unauthorized (wrong sip.username or password)") == true, "\(status)")
    }

    // MARK: shipped examples

    /// The strategies of a shipped example, with `replacements` applied to its text.
    static func example(_ name: String, _ replacements: [(String, String)]) throws -> [String: [String: ConfigValue]] {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("Configs/examples/\(name)").path
        var text = try String(contentsOfFile: path, encoding: .utf8)
        for (from, to) in replacements { text = text.replacingOccurrences(of: from, with: to) }
        let document = try ConfigLoader.parseDocument(text: text, path: path)
        var out: [String: [String: ConfigValue]] = [:]
        for table in document.strategies { out[table.name ?? ""] = table.values }
        return out
    }

    /// Configs/examples/sip-keepalive.toml, both strategies, against kamailio
    /// (only the registrar's address and the test CA changed): registered, up.
    @Test func shippedSIPExampleRegistersWithKamailio() async throws {
        let dir = try makeTemporaryDirectory("voip-example")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let certificates = try TestCertificates()
        defer { certificates.remove() }
        let registrar = try TestKamailio.start(in: dir, password: "change-me", certificates: certificates)
        defer { registrar.server.stop() }
        let strategies = try Self.example("sip-keepalive.toml", [
            ("sip.example.org:5060", "127.0.0.1:\(registrar.port)"), ("sip.example.org:5061", "127.0.0.1:\(registrar.tlsPort ?? 0)"),
            ("# ca_file = \"/etc/vigil/sip-ca.pem\"", "ca_file = \"\(certificates.caCertificate)\""),
        ])
        #expect(strategies.keys.sorted() == ["sip", "sip-tls"])
        let h = try VoipHarness()
        for (name, values) in strategies { try await h.start(values, name: name) }
        for name in strategies.keys {
            let status = await h.waitForStatus(name, timeout: .seconds(20)) { $0["Registrations"]?.uintValue ?? 0 >= 1 && $0["State"]?.stringValue == "up" }
            #expect(status["Registrations"]?.uintValue ?? 0 >= 1, "\(name): \(status)\n\(registrar.server.log)")
        }
        // kamailio writes its log line after it answered: on a loaded
        // machine the status can be there first.
        #expect(await registrar.server.waitForLog("registered sip:alice@example.org", count: 2), "\(registrar.server.log)")
        await h.supervisor.stopAll()
    }

    /// Configs/examples/mqtt-keepalive.toml, both strategies, against
    /// mosquitto (only the broker's address and the test CA changed):
    /// connected with the configured keep-alive, subscribed.
    @Test func shippedMQTTExampleConnectsToMosquitto() async throws {
        let dir = try makeTemporaryDirectory("voip-example")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let certificates = try TestCertificates()
        defer { certificates.remove() }
        let broker = try TestMosquitto.start(in: dir, user: ("vigil", "change-me"), anonymous: true, certificates: certificates)
        defer { broker.server.stop() }
        let strategies = try Self.example("mqtt-keepalive.toml", [
            ("broker.example.org:1883", "127.0.0.1:\(broker.port)"), ("broker.example.org:8883", "127.0.0.1:\(broker.tlsPort ?? 0)"),
            ("# ca_file = \"/etc/vigil/broker-ca.pem\"", "ca_file = \"\(certificates.caCertificate)\""),
        ])
        #expect(strategies.keys.sorted() == ["mqtt", "mqtt-tls"])
        let h = try VoipHarness()
        for (name, values) in strategies { try await h.start(values, name: name) }
        #expect(await broker.server.waitForLog("as vigil-home (p2, c1, k60)."), "\(broker.server.log)")
        #expect(await broker.server.waitForLog("as vigil-home-tls (p5, c1, k60, u'vigil')"), "\(broker.server.log)")
        #expect(await broker.server.waitForLog("Received SUBSCRIBE from vigil-home-tls"))
        #expect(await broker.server.waitForLog("Received SUBSCRIBE from vigil-home"))
        for name in strategies.keys {
            let status = await h.waitForStatus(name) { $0["State"]?.stringValue == "up" }
            #expect(status["State"]?.stringValue == "up", "\(name): \(status)")
        }
        await h.supervisor.stopAll()
    }

    // MARK: TLS failures

    /// A certificate from another CA, and a certificate for another name:
    /// each a clear error on the first attempt.
    @Test func tlsVerificationFailuresAreClearAtOnce() async throws {
        let dir = try makeTemporaryDirectory("voip-tls")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let certificates = try TestCertificates()
        let stranger = try TestCertificates()
        defer { certificates.remove(); stranger.remove() }
        let broker = try TestMosquitto.start(in: dir, certificates: certificates)
        defer { broker.server.stop() }
        for (name, extra, expected) in [
            ("untrusted", ["ca_file": ConfigValue.string(stranger.caCertificate)], "TLS certificate verification failed: self-signed certificate in certificate chain"),
            ("wrong-name", ["ca_file": .string(certificates.caCertificate), "server_name": .string("broker.example.org")],
             "TLS certificate verification failed: hostname mismatch"),
        ] {
            let h = try VoipHarness()
            try await h.start([
                "connect": .string("127.0.0.1:\(broker.tlsPort ?? 0)"), "protocol": .string("mqtt"), "tls": .boolean(true),
                "reconnect": .table(["initial": .string("50ms"), "max": .string("30s")]),
            ].merging(extra) { $1 }, name: name)
            #expect(await h.waitForEvent("connect-failed"), "\(name)")
            let status = await h.waitForStatus(name) { $0["State"]?.stringValue == "backoff" }
            await h.supervisor.stopAll()
            #expect(status["LastError"]?.stringValue.hasSuffix(expected) == true, "\(name): \(status)")
            #expect(h.recorded("connect-failed").count == 1, "\(name): retried at once")
            // The first reconnect of the outage is attempt 1, whatever
            // backoff a refusal that will not pass waits; its delay reads
            // in at most two units.
            let reconnecting = h.logs.entries.filter { $0.contains("reconnecting to 127.0.0.1:") }
            #expect(reconnecting.count == 1 && reconnecting[0].contains(" (attempt 1)"), "\(name): \(reconnecting)")
            #expect(durationsOverTwoUnits(in: h.logs.entries).isEmpty, "\(h.logs.entries)")
        }
    }

    /// A server that accepts TCP and never answers the handshake is cut off
    /// at connect_timeout.
    @Test func tlsHandshakeThatStallsIsCutAtConnectTimeout() async throws {
        let server = try LoopbackServer(answering: false)
        defer { server.stop() }
        let h = try VoipHarness()
        try await h.start([
            "connect": .string(server.address), "tls": .boolean(true), "connect_timeout": .string("500ms"),
            "reconnect": .table(["initial": .string("10s")]),
        ])
        let status = await h.waitForStatus { !($0["LastError"]?.stringValue.isEmpty ?? true) }
        await h.supervisor.stopAll()
        #expect(await server.count(.accepted, atLeast: 1))
        #expect(status["LastError"]?.stringValue.hasSuffix("timed out after 500ms (connect_timeout)") == true, "\(status)")
    }
}
