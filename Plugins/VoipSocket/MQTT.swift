import Glibc

/// `[strategy.mqtt]`: the MQTT 3.1.1 session the connection opens.
struct MQTTSettings: Sendable, Hashable {
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

/// MQTT 3.1.1 packets the client sends, and the broker's answers it checks.
enum MQTTPacket {
    static let pingRequest: [UInt8] = [0xC0, 0x00]

    /// CONNECT with the keep-alive in seconds (1...65535).
    static func connect(_ s: MQTTSettings, keepAliveSeconds: UInt16, password: String?) -> [UInt8] {
        var flags: UInt8 = s.cleanSession ? 0x02 : 0
        var payload = string(s.clientID)
        if let will = s.will {
            flags |= 0x04 | (will.qos << 3) | (will.retain ? 0x20 : 0)
            payload += string(will.topic) + string(will.message)
        }
        if let username = s.username {
            flags |= 0x80
            payload += string(username)
            if let password {
                flags |= 0x40
                payload += string(password)
            }
        }
        let variable: [UInt8] = string("MQTT") + [4, flags, UInt8(keepAliveSeconds >> 8), UInt8(keepAliveSeconds & 0xFF)]
        return packet(0x10, variable + payload)
    }

    /// SUBSCRIBE to `topics` at QoS 0 (messages need no acknowledgement).
    static func subscribe(_ topics: [String], packetID: UInt16) -> [UInt8] {
        var body: [UInt8] = [UInt8(packetID >> 8), UInt8(packetID & 0xFF)]
        for topic in topics { body += string(topic) + [0] }
        return packet(0x82, body)
    }

    /// Checks a CONNACK; nil when the broker accepted the session, else why not.
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
    static func subackRefusal(_ packet: [UInt8], topics: [String], packetID: UInt16) -> String? {
        guard packet.count == 3 + topics.count, packet[0] == 0x90,
            UInt16(packet[1]) << 8 | UInt16(packet[2]) == packetID
        else { return "the broker answered SUBSCRIBE with \(describe(packet)) instead of its SUBACK" }
        let refused = zip(topics, packet.dropFirst(3)).filter { $0.1 == 0x80 }.map(\.0)
        return refused.isEmpty ? nil : "the broker refused the subscription to \(refused.map { "\"\($0)\"" }.joined(separator: ", "))"
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
