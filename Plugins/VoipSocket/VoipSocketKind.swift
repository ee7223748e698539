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
        s.interval = config.positiveDuration("keepalive_interval", default: .seconds(90))
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
        s.ping = Self.bytes(config, "ping") ?? [0x0D, 0x0A, 0x0D, 0x0A]
        if s.ping.isEmpty { config.problem("ping", "must not be empty; the default is \"\\r\\n\\r\\n\" (RFC 5626)") }
        s.expect = Self.bytes(config, "expect") ?? []
        if config.values["expect"] != nil, s.expect.isEmpty, !config.hasProblems {
            config.problem("expect", "must not be empty; leave it out when the server sends no pong")
        }
        s.skipPingOnTraffic = config.bool("skip_ping_on_traffic", default: true)
        s.tcpKeepalive = Self.tcpKeepalive(config)
        let userTimeout = config.duration("user_timeout", default: .seconds(30))
        if userTimeout > .seconds(3_600) || (userTimeout > .zero && userTimeout < .milliseconds(1)) {
            config.problem("user_timeout", "expected \"0s\" (kernel default) or a duration from 1ms to 1h, found \(userTimeout.vigilDescription)")
        }
        s.userTimeout = userTimeout
        s.reconnect = Self.reconnect(config)
        s.connectTimeout = config.positiveDuration("connect_timeout", default: .seconds(10))
        s.sendOnConnect = Self.bytes(config, "send_on_connect") ?? []
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
            expect: expect, collectsData: onData != nil)
    }
}
