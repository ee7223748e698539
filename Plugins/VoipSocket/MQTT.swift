import Glibc

/// `[strategy.mqtt]`: the MQTT session (3.1.1 or 5) the connection opens.
struct MQTTSettings: Sendable, Hashable {
    /// `version`: the protocol level CONNECT names.
    enum Version: UInt8, Sendable, Hashable {
        case v311 = 4
        case v5 = 5
    }
    var version = Version.v311
    var clientID: String
    var cleanSession = true
    var username: String?
    /// The password itself, or read from `passwordFile` at each connect.
    var password: String?
    var passwordFile: String?
    var will: Will?
    var subscriptions: [String] = []

    struct Will: Sendable, Hashable {
        var topic: String
        var message: String
        var qos: UInt8
        var retain: Bool
    }
}

/// MQTT packets the client sends, and the broker's answers it checks:
/// 3.1.1, and 5 (whose packets carry properties, and whose answers carry
/// reason codes).
enum MQTTPacket {
    static let pingRequest: [UInt8] = [0xC0, 0x00]

    /// CONNECT with the keep-alive in seconds (1...65535). MQTT 5 sends no
    /// properties: the broker's defaults (session expiry 0, as 3.1.1's clean
    /// session) are what the strategy wants.
    static func connect(_ s: MQTTSettings, keepAliveSeconds: UInt16, password: String?) -> [UInt8] {
        let v5 = s.version == .v5
        var flags: UInt8 = s.cleanSession ? 0x02 : 0
        var payload = string(s.clientID)
        if let will = s.will {
            flags |= 0x04 | (will.qos << 3) | (will.retain ? 0x20 : 0)
            payload += (v5 ? [0] : []) + string(will.topic) + string(will.message)
        }
        if let username = s.username {
            flags |= 0x80
            payload += string(username)
        }
        if let password, s.username != nil || v5 {
            flags |= 0x40
            payload += string(password)
        }
        let variable: [UInt8] = string("MQTT") + [s.version.rawValue, flags, UInt8(keepAliveSeconds >> 8), UInt8(keepAliveSeconds & 0xFF)]
        return packet(0x10, variable + (v5 ? [0] : []) + payload)
    }

    /// DISCONNECT, the clean end of a session: the broker then discards
    /// the will. MQTT 5 names reason code 0 (normal disconnection) and no
    /// properties.
    static func disconnect(version: MQTTSettings.Version) -> [UInt8] {
        version == .v5 ? packet(0xE0, [0x00, 0x00]) : packet(0xE0, [])
    }

    /// SUBSCRIBE to `topics` at QoS 0 (messages need no acknowledgement).
    static func subscribe(_ topics: [String], packetID: UInt16, version: MQTTSettings.Version) -> [UInt8] {
        var body: [UInt8] = [UInt8(packetID >> 8), UInt8(packetID & 0xFF)]
        if version == .v5 { body.append(0) }  // no properties
        for topic in topics { body += string(topic) + [0] }
        return packet(0x82, body)
    }

    /// What a CONNACK said: the refusal (why, and whether trying again at
    /// once could help), or the session with the keep-alive an MQTT 5
    /// broker imposes (Server Keep Alive), which the client must use.
    struct Acknowledgement {
        var refusal: (message: String, permanent: Bool)?
        var serverKeepAliveSeconds: UInt16?
    }

    /// Checks a CONNACK (`packet`: type byte and body).
    static func connack(_ packet: [UInt8], version: MQTTSettings.Version) -> Acknowledgement {
        guard version == .v5 else { return Acknowledgement(refusal: connackRefusal(packet)) }
        guard packet.count >= 4, packet[0] == 0x20, let properties = MQTTProperties(packet[3...]) else {
            return Acknowledgement(refusal: ("the broker answered CONNECT with \(describe(packet)) instead of a CONNACK", false))
        }
        let code = packet[2]
        guard code < 0x80 else {
            let (meaning, permanent) = reasons[code] ?? ("reason code \(code)", true)
            let said = properties.string(0x1F).map { ": \"\(excerpt($0))\"" } ?? ""
            let server = properties.string(0x1C).map { " (server reference \"\(excerpt($0))\")" } ?? ""
            return Acknowledgement(refusal: ("the broker refused the connection: \(meaning)\(server)\(said)", permanent))
        }
        return Acknowledgement(serverKeepAliveSeconds: properties.twoByteInteger(0x13))
    }

    /// MQTT 5 reason codes a broker refuses a CONNECT with (or disconnects
    /// with), and whether trying again soon cannot help.
    static let reasons: [UInt8: (String, Bool)] = [
        0x80: ("unspecified error", false), 0x81: ("malformed packet", true), 0x82: ("protocol error", true),
        0x83: ("implementation specific error", false), 0x84: ("unsupported protocol version (version = \"5\" is spoken)", true),
        0x85: ("client identifier not valid (client_id)", true), 0x86: ("bad user name or password (username, password)", true),
        0x87: ("not authorized (username, password, or the broker's access rules)", true), 0x88: ("server unavailable", false),
        0x89: ("server busy", false), 0x8A: ("banned", true), 0x8B: ("server shutting down", false),
        0x8C: ("bad authentication method", true), 0x8D: ("keep alive timeout", false), 0x8E: ("session taken over by another client with the same client_id", false),
        0x90: ("topic name invalid", true), 0x95: ("packet too large", true), 0x97: ("quota exceeded", false),
        0x98: ("administrative action", false), 0x99: ("payload format invalid", true), 0x9A: ("retain not supported", true),
        0x9B: ("QoS not supported", true), 0x9C: ("use another server", true), 0x9D: ("server moved", true),
        0x9F: ("connection rate exceeded", false), 0xA2: ("wildcard subscriptions not supported", true),
    ]

    /// Why an MQTT 5 broker's DISCONNECT ended the session (`body`: after
    /// the fixed header).
    static func disconnectReason(_ body: ArraySlice<UInt8>) -> String {
        guard let code = body.first else { return "the broker disconnected (normal disconnection)" }
        let meaning = code == 0 ? "normal disconnection" : reasons[code]?.0 ?? "reason code \(code)"
        let said = MQTTProperties(body.dropFirst())?.string(0x1F).map { ": \"\(excerpt($0))\"" } ?? ""
        return "the broker disconnected: \(meaning)\(said)"
    }

    /// A broker's own words (a reason string, a server reference), for an error.
    static func excerpt(_ text: String) -> String { serverText(text, limit: 200) }

    /// Checks a 3.1.1 CONNACK; nil when the broker accepted the session, else why not.
    static func connackRefusal(_ packet: [UInt8]) -> (message: String, permanent: Bool)? {
        guard packet.count == 3, packet[0] == 0x20 else {
            return ("the broker answered CONNECT with \(describe(packet)) instead of CONNACK", false)
        }
        switch packet[2] {
        case 0: return nil
        case 1: return ("the broker refused the connection: unacceptable protocol version (MQTT 3.1.1 is spoken)", true)
        case 2: return ("the broker refused the connection: client identifier rejected (client_id)", true)
        case 3: return ("the broker refused the connection: server unavailable", false)
        case 4: return ("the broker refused the connection: bad user name or password (username, password)", true)
        case 5: return ("the broker refused the connection: not authorized (username, password, or the broker's access rules)", true)
        case let code: return ("the broker refused the connection: return code \(code)", true)
        }
    }

    /// Checks a SUBACK for `topics`; nil when every topic was granted.
    static func subackRefusal(_ packet: [UInt8], topics: [String], packetID: UInt16, version: MQTTSettings.Version) -> String? {
        var codes = packet.dropFirst(3)
        if version == .v5, let properties = MQTTPacket.variableInteger(codes) {
            codes = codes.dropFirst(properties.size + properties.value)
        }
        guard codes.count == topics.count, packet.count >= 3, packet[0] == 0x90,
            UInt16(packet[1]) << 8 | UInt16(packet[2]) == packetID
        else { return "the broker answered SUBSCRIBE with \(describe(packet)) instead of its SUBACK" }
        // 3.1.1 refuses with 0x80; MQTT 5 with any reason code from 0x80 up.
        let refused = zip(topics, codes).filter { $0.1 >= 0x80 }
        guard !refused.isEmpty else { return nil }
        let named = refused.map { topic, code in
            "\"\(topic)\"" + (version == .v5 ? " (\(reasons[code]?.0 ?? "reason code \(code)"))" : "")
        }
        return "the broker refused the subscription to \(named.joined(separator: ", "))"
    }

    /// A Variable Byte Integer at the start of `bytes`: its value and size.
    static func variableInteger(_ bytes: ArraySlice<UInt8>) -> (value: Int, size: Int)? {
        var value = 0
        for (index, byte) in bytes.prefix(4).enumerated() {
            value |= Int(byte & 0x7F) << (7 * index)
            if byte & 0x80 == 0 { return (value, index + 1) }
        }
        return nil
    }

    static func describe(_ packet: [UInt8]) -> String {
        let names = [1: "CONNECT", 2: "CONNACK", 3: "PUBLISH", 4: "PUBACK", 9: "SUBACK", 11: "UNSUBACK", 13: "PINGRESP", 14: "DISCONNECT"]
        guard let first = packet.first else { return "nothing" }
        return "packet type \(first >> 4)" + (names[Int(first >> 4)].map { " (\($0))" } ?? "")
    }

    static func string(_ text: String) -> [UInt8] {
        let bytes = Array(text.utf8.prefix(65_535))
        return [UInt8(bytes.count >> 8), UInt8(bytes.count & 0xFF)] + bytes
    }

    static func packet(_ type: UInt8, _ body: [UInt8]) -> [UInt8] {
        var out: [UInt8] = [type]
        var n = body.count
        repeat {
            var b = UInt8(n % 128)
            n /= 128
            if n > 0 { b |= 0x80 }
            out.append(b)
        } while n > 0
        return out + body
    }
}

/// An MQTT 5 property list (its length, then identifier and value pairs):
/// the values the client reads, by identifier.
struct MQTTProperties {
    private var strings: [UInt8: String] = [:]
    private var integers: [UInt8: Int] = [:]

    /// Parses the list at the start of `bytes`; nil when it is malformed.
    init?(_ bytes: ArraySlice<UInt8>) {
        guard let length = MQTTPacket.variableInteger(bytes), bytes.count >= length.size + length.value else { return nil }
        var rest = bytes.dropFirst(length.size).prefix(length.value)
        func take(_ n: Int) -> ArraySlice<UInt8>? {
            guard rest.count >= n else { return nil }
            defer { rest = rest.dropFirst(n) }
            return rest.prefix(n)
        }
        func integer(_ n: Int) -> Int? { take(n)?.reduce(0) { $0 << 8 | Int($1) } }
        func string() -> String? {
            guard let n = integer(2), let bytes = take(n) else { return nil }
            return String(decoding: bytes, as: UTF8.self)
        }
        while let id = rest.first {
            rest = rest.dropFirst()
            switch id {
            case 0x01, 0x17, 0x19, 0x24, 0x25, 0x28, 0x29, 0x2A:
                guard let value = integer(1) else { return nil }
                integers[id] = value
            case 0x13, 0x21, 0x22, 0x23:
                guard let value = integer(2) else { return nil }
                integers[id] = value
            case 0x02, 0x11, 0x18, 0x27:
                guard let value = integer(4) else { return nil }
                integers[id] = value
            case 0x0B:
                guard let value = MQTTPacket.variableInteger(rest) else { return nil }
                rest = rest.dropFirst(value.size)
                integers[id] = value.value
            case 0x03, 0x08, 0x12, 0x15, 0x1A, 0x1C, 0x1F:
                guard let value = string() else { return nil }
                strings[id] = value
            case 0x09, 0x16:
                guard let n = integer(2), take(n) != nil else { return nil }
            case 0x26:  // user property: a name and a value
                guard string() != nil, string() != nil else { return nil }
            default:
                return nil
            }
        }
    }

    func string(_ id: UInt8) -> String? { strings[id] }
    func twoByteInteger(_ id: UInt8) -> UInt16? { integers[id].map { UInt16(truncatingIfNeeded: $0) } }
}

/// Reads a secret from a file (a password file), bounded and trimmed of its
/// final newline.
func readSecret(_ path: String) -> Result<String, LinkError> {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return .failure(LinkError("cannot read \(path): \(String(cString: strerror(errno)))")) }
    defer { close(fd) }
    var buffer = [UInt8](repeating: 0, count: 4097)
    let n = read(fd, &buffer, buffer.count)
    guard n >= 0 else { return .failure(LinkError("cannot read \(path): \(String(cString: strerror(errno)))")) }
    guard n < buffer.count else { return .failure(LinkError("\(path): longer than 4096 bytes; expected a password")) }
    var text = String(decoding: buffer[0..<n], as: UTF8.self)
    while text.hasSuffix("\n") || text.hasSuffix("\r") { text.removeLast() }
    return .success(text)
}
