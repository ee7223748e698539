import VigilKit

/// The plugin's entry point: the host calls it after dlopen.
@_cdecl("vigil_plugin_v1")
public func vigilPluginV1() -> UnsafeMutableRawPointer {
    VigilPlugin.export([VoipSocketKind()])
}

/// `voip-socket`: iOS `setKeepAliveTimeout:handler:` on Linux. Keeps one TCP
/// connection open with TCP keepalive and an application ping handler that
/// must finish (ping sent, pong received) within a deadline; a connection
/// that fails it, closes or errors is reconnected with exponential backoff
/// and full jitter. One lease per connection shows its live status.
public struct VoipSocketKind: StrategyKind {
    public init() {}
    public var name: String { "voip-socket" }
    public var summary: String { "keep a TCP connection open with TCP keepalive and a deadline-bound ping handler, reconnecting with backoff" }

    public func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
        var s = VoipSocketSettings()
        let connect = config.requireString("connect")
        if !connect.isEmpty {
            switch Endpoint.parse(connect) {
            case .success(let e): s.endpoint = e
            case .failure(let p): config.problem("connect", p.message)
            }
        }
        s.wire = Self.wire(config)
        s.interval = config.positiveDuration("keepalive_interval", default: s.wire == .mqtt ? .seconds(60) : .seconds(90))
        s.jitter = Self.jitter(config)
        config.declare("align")
        switch config.values["align"] {
        case nil, .boolean(false): s.align = nil
        case .boolean(true): s.align = s.interval
        case .string: s.align = config.positiveDuration("align")
        case let other?: config.problem("align", "expected true, false or a slot duration such as \"5m\", found \(other.typeName)")
        }
        s.handlerTimeout = config.positiveDuration("handler_timeout", default: min(.seconds(10), s.interval / 2))
        if s.handlerTimeout >= s.interval {
            config.problem("handler_timeout", "must be shorter than keepalive_interval (\(s.interval.vigilDescription)), found \(s.handlerTimeout.vigilDescription)")
        }
        switch s.wire {
        case .raw:
            s.ping = Self.bytes(config, "ping") ?? [0x0D, 0x0A, 0x0D, 0x0A]
            if s.ping.isEmpty { config.problem("ping", "must not be empty; the default is \"\\r\\n\\r\\n\" (RFC 5626)") }
            s.expect = Self.bytes(config, "expect") ?? []
            if config.values["expect"] != nil, s.expect.isEmpty, !config.hasProblems {
                config.problem("expect", "must not be empty; leave it out when the server sends no pong")
            }
            s.delimiter = Self.bytes(config, "delimiter") ?? []
            if config.values["delimiter"] != nil, s.delimiter.isEmpty, !config.hasProblems {
                config.problem("delimiter", "must not be empty; leave it out when the pong comes first after the ping")
            }
            s.sendOnConnect = Self.bytes(config, "send_on_connect") ?? []
        case .mqtt:
            Self.onlyForRaw(config, s.wire)
            s.ping = MQTTPacket.pingRequest
            s.expect = [0xD0, 0x00]
            let seconds = s.interval.components.seconds
            if s.interval.components.attoseconds != 0 || seconds > 65_535 {
                config.problem("keepalive_interval", "is MQTT's keep-alive with protocol = \"mqtt\": expected whole seconds from 1s to 65535s, found \(s.interval.vigilDescription)")
            }
            s.mqtt = Self.mqtt(config)
        case .sip:
            Self.onlyForRaw(config, s.wire)
            s.ping = [0x0D, 0x0A, 0x0D, 0x0A]
            s.expect = [0x0D, 0x0A]
            s.sip = Self.sip(config)
        }
        s.tls = Self.tls(config, endpoint: s.endpoint)
        s.skipPingOnTraffic = config.bool("skip_ping_on_traffic", default: true)
        s.tcpKeepalive = Self.tcpKeepalive(config)
        let userTimeout = config.duration("user_timeout", default: .seconds(30))
        if userTimeout > .seconds(3_600) || (userTimeout > .zero && userTimeout < .milliseconds(1)) {
            config.problem("user_timeout", "expected \"0s\" (kernel default) or a duration from 1ms to 1h, found \(userTimeout.vigilDescription)")
        }
        s.userTimeout = userTimeout
        s.reconnect = Self.reconnect(config)
        s.connectTimeout = config.positiveDuration("connect_timeout", default: .seconds(10))
        s.onData = config.argv("on_data")
        s.onDataTimeout = config.positiveDuration("on_data_timeout", default: .seconds(10))
        s.onConnect = config.argv("on_connect")
        s.onDisconnect = config.argv("on_disconnect")
        s.hookTimeout = config.positiveDuration("hook_timeout", default: .seconds(10))
        s.reason = config.string("reason", default: "keep \(connect) open")
        return VoipSocket(settings: s)
    }

    /// `jitter`: the share of the interval the ping may come early, as a
    /// fraction (0.2) or a percentage ("20%"); 0.2 gives RFC 5626's 80–100 %.
    static func jitter(_ config: ConfigReader) -> Double {
        config.declare("jitter")
        let fraction: Double
        switch config.values["jitter"] {
        case nil: return 0.2
        case .float(let f)?: fraction = f
        case .integer(let i)?: fraction = Double(i)
        case .string(let text)? where text.hasSuffix("%"):
            guard let p = Double(text.dropLast()) else {
                config.problem("jitter", "expected a percentage such as \"20%\", found \"\(text)\"")
                return 0.2
            }
            fraction = p / 100
        case let other?:
            config.problem("jitter", "expected a fraction of the interval (0.2) or a percentage (\"20%\"), found \(other.typeName)")
            return 0.2
        }
        guard fraction >= 0, fraction < 1 else {
            config.problem("jitter", "expected a fraction from 0 up to (not including) 1, found \(fraction)")
            return 0.2
        }
        return fraction
    }

    static func wire(_ config: ConfigReader) -> WireProtocol {
        let text = config.string("protocol", default: "raw")
        guard let wire = WireProtocol(rawValue: text) else {
            let names = WireProtocol.allCases.map { "\"\($0.rawValue)\"" }.joined(separator: ", ")
            let hint = Spelling.suggestion(for: text, among: WireProtocol.allCases.map(\.rawValue)).map { " (did you mean \"\($0)\"?)" } ?? ""
            config.problem("protocol", "unknown protocol \"\(text)\"\(hint); expected one of \(names)")
            return .raw
        }
        return wire
    }

    /// Keys that describe a raw protocol's bytes make no sense with mqtt or sip.
    static func onlyForRaw(_ config: ConfigReader, _ wire: WireProtocol) {
        for key in ["ping", "expect", "delimiter", "send_on_connect"] where config.values[key] != nil {
            config.declare(key)
            config.problem(key, "is only for protocol = \"raw\"; with protocol = \"\(wire.rawValue)\" the strategy builds its own \(wire == .mqtt ? "PINGREQ and CONNECT" : "CRLF keep-alive and REGISTER")")
        }
    }

    /// `[strategy.mqtt]`: client_id, clean_session, username, password or
    /// password_file, will = { topic, message, qos, retain }, subscribe.
    static func mqtt(_ config: ConfigReader) -> MQTTSettings {
        var m = MQTTSettings(clientID: "vigil-\(config.strategyName)")
        guard let sub = SubTable(config, "mqtt") else { return m }
        let r = sub.reader
        switch r.string("version", default: "3.1.1") {
        case "3.1.1": m.version = .v311
        case "5": m.version = .v5
        case let other: r.problem("version", "expected \"3.1.1\" or \"5\", found \"\(other)\"")
        }
        m.clientID = r.string("client_id", default: m.clientID)
        if m.clientID.utf8.count > 65_535 || m.clientID.isEmpty && !r.bool("clean_session", default: true) {
            r.problem("client_id", "must be 1 to 65535 bytes (an empty id needs clean_session = true)")
        }
        m.cleanSession = r.bool("clean_session", default: true)
        m.username = r.string("username")
        m.password = r.string("password")
        m.passwordFile = r.string("password_file")
        if m.password != nil, m.passwordFile != nil { r.problem("password_file", "give password or password_file, not both") }
        if (m.password != nil || m.passwordFile != nil), m.username == nil, m.version == .v311 {
            r.problem("username", "MQTT 3.1.1 sends a password only with a user name (MQTT 5, version = \"5\", sends one alone)")
        }
        if let file = m.passwordFile, case .failure(let e) = readSecret(file) { r.problem("password_file", e.description) }
        m.subscriptions = r.stringArray("subscribe") ?? []
        for topic in m.subscriptions where topic.isEmpty || topic.utf8.count > 65_535 {
            r.problem("subscribe", "topic filters must be 1 to 65535 bytes, found \"\(topic)\"")
        }
        if let willTable = SubTable(r, "will") {
            let w = willTable.reader
            let topic = w.requireString("topic")
            let message = w.string("message", default: "")
            let qos = w.integer("qos", default: 0, range: 0...2)
            let retain = w.bool("retain", default: false)
            willTable.finish(known: ["topic", "message", "qos", "retain"])
            m.will = .init(topic: topic, message: message, qos: UInt8(qos), retain: retain)
        }
        sub.finish(known: ["version", "client_id", "clean_session", "username", "password", "password_file", "subscribe", "will"])
        return m
    }

    /// `[strategy.sip]`: aor, registrar, expires, username, password or
    /// password_file, outbound, instance_id.
    static func sip(_ config: ConfigReader) -> SIPSettings {
        var s = SIPSettings()
        s.instanceID = Self.uuid(from: config.strategyName)
        guard let sub = SubTable(config, "sip") else { return s }
        let r = sub.reader
        s.aor = r.string("aor")
        if let aor = s.aor, SIPSettings.parts(of: aor).map({ !$0.user.isEmpty }) != true {
            r.problem("aor", "expected an address of record such as \"sip:alice@example.org\", found \"\(aor)\"")
        }
        let host = s.aor.flatMap { SIPSettings.parts(of: $0)?.host } ?? ""
        s.registrar = r.string("registrar", default: "sip:\(host)")
        // (A registrar derived from a bad aor is not reported twice.)
        if SIPSettings.parts(of: s.registrar) == nil, r.values["registrar"] != nil || !host.isEmpty {
            r.problem("registrar", "expected a SIP URI such as \"sip:example.org\", found \"\(s.registrar)\"")
        }
        s.expires = r.positiveDuration("expires", default: .seconds(600))
        if s.expires.components.attoseconds != 0 || s.expires > .seconds(4_294_967) {
            r.problem("expires", "expected whole seconds (SIP counts in seconds), found \(s.expires.vigilDescription)")
        }
        s.username = r.string("username")
        s.password = r.string("password")
        s.passwordFile = r.string("password_file")
        if s.password != nil, s.passwordFile != nil { r.problem("password_file", "give password or password_file, not both") }
        if let file = s.passwordFile, case .failure(let e) = readSecret(file) { r.problem("password_file", e.description) }
        s.outbound = r.bool("outbound", default: true)
        if let id = r.string("instance_id") { s.instanceID = id }
        for (key, value) in [("aor", s.aor ?? ""), ("registrar", s.registrar), ("username", s.username ?? ""), ("instance_id", s.instanceID)]
        where value.contains(where: { $0 == "\r" || $0 == "\n" || $0 == "\"" || $0 == "<" || $0 == ">" }) {
            r.problem(key, "must not contain line breaks, quotes or angle brackets")
        }
        if s.aor == nil, s.username != nil || s.password != nil || s.passwordFile != nil {
            r.problem("aor", "missing: a registration (username, password) needs the address of record to register")
        }
        sub.finish(known: ["aor", "registrar", "expires", "username", "password", "password_file", "outbound", "instance_id"])
        return s
    }

    /// A stable RFC 4122-shaped id for `+sip.instance`, from the instance name
    /// and the machine id, so a restart registers the same instance again.
    static func uuid(from name: String) -> String {
        var machine = ""
        if case .success(let id) = readSecret("/etc/machine-id") { machine = id }
        let h = md5Hex(machine + ":" + name)
        let c = Array(h)
        return "\(String(c[0..<8]))-\(String(c[8..<12]))-3\(String(c[13..<16]))-a\(String(c[17..<20]))-\(String(c[20..<32]))"
    }

    /// `tls = true` with `ca_file`, `server_name`, `cert_file`, `key_file`;
    /// the OpenSSL context is made here, so a bad file is a config error.
    static func tls(_ config: ConfigReader, endpoint: Endpoint) -> TLSSettings? {
        let on = config.bool("tls", default: false)
        let ca = config.string("ca_file"), name = config.string("server_name")
        let cert = config.string("cert_file"), key = config.string("key_file")
        guard on else {
            for (k, v) in [("ca_file", ca), ("server_name", name), ("cert_file", cert), ("key_file", key)] where v != nil {
                config.problem(k, "only applies with tls = true")
            }
            return nil
        }
        if (cert == nil) != (key == nil) { config.problem(cert == nil ? "cert_file" : "key_file", "give cert_file and key_file together") }
        let serverName = name ?? endpoint.host
        if serverName.isEmpty || serverName.utf8.count > 253 || serverName.contains(where: { $0.isWhitespace }) {
            config.problem("server_name", "expected a host name or address, found \"\(serverName)\"")
        }
        guard !config.hasProblems else { return nil }
        switch TLSContext.shared(caFile: ca, certFile: cert, keyFile: key) {
        case .success(let context): return TLSSettings(context: context, serverName: serverName)
        case .failure(let e):
            config.problem(cert != nil && e.description.contains(cert ?? "") ? "cert_file" : "ca_file", e.description)
            return nil
        }
    }

    static func bytes(_ config: ConfigReader, _ key: String) -> [UInt8]? {
        guard let text = config.string(key) else { return nil }
        switch ByteEscapes.parse(text) {
        case .success(let b): return b
        case .failure(let p): config.problem(key, p.message); return nil
        }
    }

    /// `tcp_keepalive = { idle = "60s", interval = "10s", count = 3 }`, or
    /// `false` to leave SO_KEEPALIVE off.
    static func tcpKeepalive(_ config: ConfigReader) -> (idle: Int32, interval: Int32, count: Int32)? {
        let fallback: (idle: Int32, interval: Int32, count: Int32) = (60, 10, 3)
        if case .boolean(let on)? = config.values["tcp_keepalive"] {
            config.declare("tcp_keepalive")
            return on ? fallback : nil
        }
        guard let sub = SubTable(config, "tcp_keepalive") else { return fallback }
        func seconds(_ key: String, _ d: Int32) -> Int32 {
            let v = sub.reader.positiveDuration(key, default: .seconds(Int64(d)))
            guard v >= .seconds(1), v <= .seconds(32_767), v.nanoseconds % 1_000_000_000 == 0 else {
                sub.reader.problem(key, "expected whole seconds from 1s to 32767s (the kernel counts in seconds), found \(v.vigilDescription)")
                return d
            }
            return Int32(v.nanoseconds / 1_000_000_000)
        }
        let result = (
            idle: seconds("idle", fallback.idle), interval: seconds("interval", fallback.interval),
            count: Int32(sub.reader.integer("count", default: Int64(fallback.count), range: 1...127)))
        sub.finish(known: ["idle", "interval", "count"])
        return result
    }

    /// `reconnect = { initial = "1s", max = "5m", jitter = true }`.
    static func reconnect(_ config: ConfigReader) -> Backoff {
        guard let sub = SubTable(config, "reconnect") else { return Backoff(initial: .seconds(1), maximum: .seconds(300)) }
        let initial = sub.reader.positiveDuration("initial", default: .seconds(1))
        let maximum = sub.reader.positiveDuration("max", default: max(initial, .seconds(300)))
        if maximum < initial {
            sub.reader.problem("max", "must not be shorter than initial (\(initial.vigilDescription)), found \(maximum.vigilDescription)")
        }
        let jitter = sub.reader.bool("jitter", default: true)
        sub.finish(known: ["initial", "max", "jitter"])
        return Backoff(initial: initial, maximum: maximum, jitter: jitter)
    }
}

/// A nested table of a strategy table, read with its own ``ConfigReader``
/// whose problems (and unknown keys) are reported on the parent with the
/// full key path.
struct SubTable {
    let parent: ConfigReader
    let key: String
    let values: [String: ConfigValue]
    let reader: ConfigReader

    init?(_ parent: ConfigReader, _ key: String) {
        guard let values = parent.table(key) else { return nil }
        self.parent = parent
        self.key = key
        self.values = values
        self.reader = ConfigReader(
            strategyName: parent.strategyName, keyPath: "\(parent.keyPath).\(key)", values: values,
            tableLocation: parent.location(of: key))
    }

    func finish(known: [String]) {
        for p in reader.problems {
            let relative = p.keyPath.hasPrefix(parent.keyPath + ".") ? String(p.keyPath.dropFirst(parent.keyPath.count + 1)) : key
            parent.problem(relative, p.message)
        }
        for unknown in values.keys.sorted() where !known.contains(unknown) {
            let hint = Spelling.suggestion(for: unknown, among: known).map { " (did you mean \"\($0)\"?)" } ?? ""
            parent.problem("\(key).\(unknown)", "unknown key \"\(unknown)\"\(hint); expected \(known.joined(separator: ", "))")
        }
    }
}

/// Everything a `voip-socket` instance was configured with.
struct VoipSocketSettings: Sendable {
    var endpoint = Endpoint(host: "localhost", port: 1)
    var interval: Duration = .seconds(90)
    var jitter = 0.2
    var align: Duration?
    var handlerTimeout: Duration = .seconds(10)
    var ping: [UInt8] = [0x0D, 0x0A, 0x0D, 0x0A]
    var expect: [UInt8] = []
    var delimiter: [UInt8] = []
    var wire = WireProtocol.raw
    var mqtt: MQTTSettings?
    var sip: SIPSettings?
    var tls: TLSSettings?
    var skipPingOnTraffic = true
    var tcpKeepalive: (idle: Int32, interval: Int32, count: Int32)? = (60, 10, 3)
    var userTimeout: Duration = .seconds(30)
    var reconnect = Backoff(initial: .seconds(1), maximum: .seconds(300))
    var connectTimeout: Duration = .seconds(10)
    var sendOnConnect: [UInt8] = []
    var onData: [String]?
    var onDataTimeout: Duration = .seconds(10)
    var onConnect: [String]?
    var onDisconnect: [String]?
    var hookTimeout: Duration = .seconds(10)
    var reason = ""

    var linkOptions: LinkOptions {
        LinkOptions(
            keepalive: tcpKeepalive, userTimeoutMilliseconds: UInt32(clamping: userTimeout.nanoseconds / 1_000_000),
            framing: FramingOptions(wire: wire, expect: expect, delimiter: delimiter, mqttVersion: mqtt?.version ?? .v311),
            collectsData: onData != nil)
    }
}
