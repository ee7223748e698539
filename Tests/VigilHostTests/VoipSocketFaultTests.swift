import Foundation
import Glibc
import Testing
import VigilHost
import VigilKit
import VigilTestSupport

/// One protocol over plain TCP or TLS, with the real server that speaks it:
/// the pong server for raw, mosquitto for mqtt, kamailio for sip.
struct VoipPeer: Sendable, CustomTestStringConvertible {
    let wire: String
    let tls: Bool

    var testDescription: String { tls ? "\(wire)+tls" : wire }

    static let all = ["raw", "mqtt", "sip"].flatMap { wire in [false, true].map { VoipPeer(wire: wire, tls: $0) } }

    /// The running server and what the strategy needs to reach it.
    struct Running {
        let server: TestServerProcess
        let port: Int
        let certificates: TestCertificates?

        func remove() {
            server.freeze(false)
            server.stop()
            certificates?.remove()
        }
    }

    func start(in directory: String, network: TestNetwork? = nil) throws -> Running {
        let certificates = tls ? try TestCertificates() : nil
        do {
            switch wire {
            case "mqtt":
                let broker = try TestMosquitto.start(in: directory, certificates: certificates, network: network)
                return Running(server: broker.server, port: broker.tlsPort ?? broker.port, certificates: certificates)
            case "sip":
                let registrar = try TestKamailio.start(in: directory, certificates: certificates, network: network)
                return Running(server: registrar.server, port: registrar.tlsPort ?? registrar.port, certificates: certificates)
            default:
                let pong = try TestPongServer.start(in: directory, certificates: certificates, network: network)
                return Running(server: pong.server, port: pong.port, certificates: certificates)
            }
        } catch {
            certificates?.remove()
            throw error
        }
    }

    /// The strategy's options: pings every `interval` (whole seconds: MQTT's keep-alive),
    /// `handlerTimeout` for the pong, quick reconnects, and the protocol's own
    /// keys (a SIP registration; raw's ping and pong).
    func options(_ server: Running, interval: String = "1s", handlerTimeout: String = "400ms") -> [String: ConfigValue] {
        var values: [String: ConfigValue] = [
            "connect": .string("\(server.server.host):\(server.port)"), "protocol": .string(wire), "keepalive_interval": .string(interval),
            "handler_timeout": .string(handlerTimeout), "reconnect": .table(["initial": .string("100ms"), "max": .string("300ms")]),
        ]
        switch wire {
        case "sip": values["sip"] = .table(["aor": .string("sip:alice@example.org"), "expires": .string("60s")])
        case "raw": values["ping"] = .string("\\r\\n\\r\\n"); values["expect"] = .string("\r\n"); values["skip_ping_on_traffic"] = .boolean(false)
        default: break
        }
        if let certificates = server.certificates {
            values["tls"] = .boolean(true)
            values["ca_file"] = .string(certificates.caCertificate)
            // The test certificate names 127.0.0.1 only: a server in a test network is still verified against it.
            values["server_name"] = .string("127.0.0.1")
        }
        return values
    }
}

/// What must survive for every protocol and over TLS: a frozen server
/// (SIGSTOP), an unreachable one (TCP_USER_TIMEOUT), and a restarted one.
/// Each ends with the strategy connected again, pinging, and for SIP
/// registered again. Serialized for the same reason as
/// ``VoipSocketProtocolTests``: each test starts real servers.
@Suite(.serialized) struct VoipSocketFaultTests {
    /// Starts the strategy and waits (bounded) for its first answered ping.
    static func startPinging(_ options: [String: ConfigValue]) async throws -> (VoipHarness, [String: StatusValue]) {
        let h = try VoipHarness()
        try await h.start(options)
        let up = await h.waitForStatus(timeout: .seconds(20)) { $0["Pings"]?.uintValue ?? 0 >= 1 }
        #expect(up["Pings"]?.uintValue ?? 0 >= 1, "the live server answered no ping: \(up)")
        return (h, up)
    }

    /// Waits until the strategy is up again after a fault: reconnected, and
    /// pinging (and registered) on the new connection.
    static func waitUntilBack(_ h: VoipHarness, after before: [String: StatusValue], wire: String) async -> [String: StatusValue] {
        let pings = before["Pings"]?.uintValue ?? 0
        let registrations = before["Registrations"]?.uintValue ?? 0
        return await h.waitForStatus(timeout: .seconds(30)) {
            $0["State"]?.stringValue == "up" && $0["Reconnects"]?.uintValue ?? 0 >= 1 && $0["Pings"]?.uintValue ?? 0 > pings
                && (wire != "sip" || $0["Registrations"]?.uintValue ?? 0 > registrations)
        }
    }

    /// A server frozen with SIGSTOP still has a kernel that acknowledges: only
    /// the missing pong (CRLF, PINGRESP, over TLS or not) shows it. The
    /// handler overruns within one interval plus handler_timeout, the
    /// connection is dropped, and once the server is thawed the strategy
    /// reconnects.
    @Test(arguments: VoipPeer.all) func frozenServerIsDetectedAndReconnected(peer: VoipPeer) async throws {
        let dir = try makeTemporaryDirectory("voip-frozen")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let server = try peer.start(in: dir)
        defer { server.remove() }
        let (h, up) = try await Self.startPinging(peer.options(server))
        await server.server.freezeUntilStopped()
        let frozenAt = ContinuousClock.now
        #expect(await h.waitForEvent("handler-overrun"))
        let detected = ContinuousClock.now - frozenAt
        server.server.freeze(false)
        let back = await Self.waitUntilBack(h, after: up, wire: peer.wire)
        await h.supervisor.stopAll()
        // At most one interval (1 s) until the next ping, then handler_timeout
        // (400 ms); the rest is room for a loaded machine (CI met 3.7 s, then
        // 5.5 s, over TLS while the suite and other builds loaded both
        // cores). The bound only says "soon": what proves the handler is the
        // overrun event and the reason below, since a frozen server's kernel
        // still acknowledges and TCP alone never ends the connection.
        #expect(detected < .milliseconds(1_000 + 400 + 8_600), "detected after \(detected)")
        let reasons = h.recorded("disconnected").map { $0["reason"] ?? "" }
        #expect(reasons.first?.contains("overran handler_timeout (400ms)") == true, "\(reasons)")
        #expect(back["State"]?.stringValue == "up" && back["Reconnects"]?.uintValue ?? 0 >= 1, "\(back)")
        #expect(back["Overruns"]?.uintValue ?? 0 >= 1, "\(back)")
        if peer.wire == "sip" { #expect(back["Registrations"]?.uintValue ?? 0 >= 2, "\(back)") }
    }

    /// A server whose network goes away (its link down in a test network
    /// namespace: nothing acknowledged, nothing reset): TCP_USER_TIMEOUT ends
    /// the connection with "Connection timed out" before the pong's deadline,
    /// and the strategy reconnects once the server is reachable again.
    @Test(arguments: VoipPeer.all) func unreachableServerIsCutByTCPUserTimeout(peer: VoipPeer) async throws {
        let dir = try makeTemporaryDirectory("voip-unreachable")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let network = try TestNetwork()
        defer { network.remove() }
        let server = try peer.start(in: dir, network: network)
        defer { server.remove() }
        // The pong's deadline far behind TCP_USER_TIMEOUT's, so a loaded
        // machine cannot let it win.
        var options = peer.options(server, interval: "2s", handlerTimeout: "1800ms")
        options["user_timeout"] = .string("200ms")
        options["connect_timeout"] = .string("1s")
        let (h, up) = try await Self.startPinging(options)
        try network.setReachable(false)
        let cutAt = ContinuousClock.now
        #expect(await h.waitForEvent("disconnected", timeout: .seconds(15)))
        let detected = ContinuousClock.now - cutAt
        let reasons = h.recorded("disconnected").map { $0["reason"] ?? "" }
        try network.setReachable(true)
        let back = await Self.waitUntilBack(h, after: up, wire: peer.wire)
        await h.supervisor.stopAll()
        #expect(reasons.first?.contains("Connection timed out") == true, "not TCP_USER_TIMEOUT: \(reasons)")
        #expect(h.recorded("handler-overrun").isEmpty, "the pong's deadline, not TCP_USER_TIMEOUT, ended it: \(reasons)")
        // The next ping within 2 s, then 200 ms of retransmissions; the rest is room for a loaded machine.
        #expect(detected < .milliseconds(2_000 + 200 + 1_500), "detected after \(detected)")
        #expect(back["State"]?.stringValue == "up" && back["Reconnects"]?.uintValue ?? 0 >= 1, "\(back)")
    }

    /// A server that restarts (SIGTERM, then started again on the same
    /// port): the strategy sees the connection end and resumes on the new
    /// server, with a new TLS session and for SIP a new registration.
    @Test(arguments: VoipPeer.all) func restartedServerIsReconnected(peer: VoipPeer) async throws {
        let dir = try makeTemporaryDirectory("voip-restart")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let server = try peer.start(in: dir)
        defer { server.remove() }
        let (h, up) = try await Self.startPinging(peer.options(server))
        server.server.stop()
        #expect(await h.waitForEvent("disconnected"))
        try server.server.start()
        let back = await Self.waitUntilBack(h, after: up, wire: peer.wire)
        await h.supervisor.stopAll()
        #expect(back["State"]?.stringValue == "up" && back["Reconnects"]?.uintValue ?? 0 >= 1, "\(back)")
        #expect(back["Overruns"]?.uintValue == 0, "\(back)")
    }
}
