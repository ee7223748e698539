/// What the event thread makes of incoming bytes: the pong, a protocol
/// message for the strategy itself (CONNACK, SUBACK, a SIP response), or
/// application data for the `on_data` hook. Every byte that is not the pong
/// or a control message reaches `on_data` exactly once, in order.
enum Frame: Sendable, Equatable {
    case pong
    case control([UInt8])
    case data(DataFrame)
}

/// One unit of application data: raw bytes as they came, one MQTT PUBLISH
/// (its payload, with the topic in `variables`) or one whole SIP message.
struct DataFrame: Sendable, Equatable {
    var bytes: [UInt8]
    /// Extra hook variables (`topic`, `method`, ...); empty for raw bytes.
    var variables: [String: String] = [:]
    /// Raw bytes may be merged with the next raw chunk into one hook run;
    /// protocol messages are delivered one per run.
    var mergeable: Bool { variables.isEmpty }
}

/// A peer broke its protocol's framing: the link ends with this reason.
struct FramingError: Error, CustomStringConvertible {
    var description: String
}

/// Splits one connection's incoming bytes into frames for its protocol.
/// Lives in the link's state and runs on the event thread under its lock.
enum Framer: Sendable {
    case raw(RawFramer)
    case mqtt(MQTTFramer)
    case sip(SIPFramer)

    /// `awaitingPong`: a ping went out and its pong has not come; the framer
    /// clears it when it recognises the pong.
    mutating func feed(_ bytes: UnsafeRawBufferPointer, awaitingPong: inout Bool, into out: inout [Frame]) throws(FramingError) {
        switch self {
        case .raw(var f):
            f.feed(bytes, awaitingPong: &awaitingPong, into: &out)
            self = .raw(f)
        case .mqtt(var f):
            self = .raw(RawFramer(expect: [], delimiter: []))  // no copy-on-write while `f` is mutated
            defer { self = .mqtt(f) }
            try f.feed(bytes, awaitingPong: &awaitingPong, into: &out)
        case .sip(var f):
            self = .raw(RawFramer(expect: [], delimiter: []))
            defer { self = .sip(f) }
            try f.feed(bytes, awaitingPong: &awaitingPong, into: &out)
        }
    }

    /// Takes `bytes` as the pong when they are exactly the awaited raw pong
    /// at a message boundary (what a keep-alive round almost always reads):
    /// the same outcome as ``feed(_:awaitingPong:into:)``, without building
    /// frames. False, with nothing changed, for anything else.
    mutating func takeWholePong(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard case .raw(var f) = self, f.takeWholePong(bytes) else { return false }
        self = .raw(f)
        return true
    }

    /// A ping is about to go out.
    mutating func pingSent() {
        if case .raw(var f) = self {
            f.pingSent()
            self = .raw(f)
        }
    }
}

/// `protocol = "raw"`: the pong is `expect`, recognised only at a message
/// boundary: right after the ping when there is no `delimiter`, or at the
/// start of any delimited message (one that follows a delimiter) when there
/// is. Everything else goes to `on_data` byte-exact and in order.
struct RawFramer: Sendable {
    /// The pong as it appears on the wire (with the delimiter, when one is set).
    let pong: [UInt8]
    let delimiter: [UInt8]
    /// Whether the next byte starts a message.
    private var atBoundary = false
    /// Bytes that may still be the pong.
    private var candidate: [UInt8] = []
    /// The last bytes passed on as data, to notice a delimiter that spans reads.
    private var tail: [UInt8] = []

    init(expect: [UInt8], delimiter: [UInt8]) {
        self.delimiter = delimiter
        if delimiter.isEmpty || expect.isEmpty || expect.count >= delimiter.count && Array(expect.suffix(delimiter.count)) == delimiter {
            pong = expect
        } else {
            pong = expect + delimiter
        }
        atBoundary = !delimiter.isEmpty
    }

    mutating func pingSent() {
        if delimiter.isEmpty {
            // Without a delimiter the only boundary is the ping: what was
            // half-received as a candidate before it is data.
            atBoundary = true
        }
    }

    /// See ``Framer/takeWholePong(_:)``; call only while a pong is awaited.
    mutating func takeWholePong(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard atBoundary, candidate.isEmpty, !pong.isEmpty, bytes.count == pong.count, bytes.elementsEqual(pong) else { return false }
        atBoundary = !delimiter.isEmpty
        return true
    }

    mutating func feed(_ bytes: UnsafeRawBufferPointer, awaitingPong: inout Bool, into out: inout [Frame]) {
        var data: [UInt8] = []
        var i = bytes.startIndex
        while i < bytes.endIndex {
            if awaitingPong && !pong.isEmpty && (atBoundary || !candidate.isEmpty) {
                let b = bytes[i]
                i += 1
                candidate.append(b)
                if candidate.count <= pong.count && pong[candidate.count - 1] == b {
                    if candidate.count == pong.count {
                        if !data.isEmpty { out.append(.data(DataFrame(bytes: data))); data = [] }
                        out.append(.pong)
                        awaitingPong = false
                        candidate = []
                        atBoundary = !delimiter.isEmpty
                    }
                    continue
                }
                // Not the pong: the candidate is data, and the boundary is gone.
                atBoundary = false
                let moved = candidate
                candidate = []
                append(moved, to: &data)
                continue
            }
            // Pass a run of bytes on as data at once.
            let start = i
            if delimiter.isEmpty || !awaitingPong {
                i = bytes.endIndex
                append(Array(bytes[start..<i]), to: &data)
            } else {
                // Stop after the next delimiter, where a pong may start.
                var run: [UInt8] = []
                while i < bytes.endIndex {
                    run.append(bytes[i])
                    i += 1
                    if endsWithDelimiter(tail: tail, run) { break }
                }
                append(run, to: &data)
            }
        }
        if !data.isEmpty { out.append(.data(DataFrame(bytes: data))) }
    }

    private mutating func append(_ run: [UInt8], to data: inout [UInt8]) {
        data += run
        guard !delimiter.isEmpty else { return }
        atBoundary = endsWithDelimiter(tail: tail, run)
        tail = Array((tail + run.suffix(delimiter.count)).suffix(delimiter.count))
    }

    /// Whether `tail` followed by `run` ends with the delimiter. Reads only
    /// the last `delimiter.count` bytes: it runs after every byte of a run
    /// scanned for a delimiter, where joining the two (as it once did) made
    /// a long message without one cost quadratic time.
    private func endsWithDelimiter(tail: [UInt8], _ run: [UInt8]) -> Bool {
        let count = delimiter.count
        guard count > 0, tail.count + run.count >= count else { return false }
        for k in 1...count {
            let byte = k <= run.count ? run[run.count - k] : tail[tail.count - (k - run.count)]
            guard byte == delimiter[count - k] else { return false }
        }
        return true
    }
}

/// Limits on what a peer may make the plugin hold for one message.
enum FrameLimits {
    /// The largest MQTT packet or SIP message accepted (larger ones end the link).
    static let message = 1 << 20
    /// The largest SIP header block.
    static let sipHeader = 64 * 1024
}

/// `protocol = "mqtt"` (3.1.1 or 5): packets framed by the fixed header
/// (type byte, remaining length). PINGRESP is the pong, PUBLISH is data (its
/// payload, topic as a variable), an MQTT 5 broker's DISCONNECT ends the
/// link with its reason, everything else is control.
struct MQTTFramer: Sendable {
    private var buffer: [UInt8] = []
    let version: MQTTSettings.Version

    init(version: MQTTSettings.Version) { self.version = version }

    mutating func feed(_ bytes: UnsafeRawBufferPointer, awaitingPong: inout Bool, into out: inout [Frame]) throws(FramingError) {
        buffer.append(contentsOf: bytes)
        var start = 0
        defer { buffer.removeFirst(start) }
        while buffer.count - start >= 2 {
            guard let (length, size) = MQTTPacket.variableInteger(buffer[(start + 1)...]) else {
                // Four bytes that all say "more" are malformed; fewer wait for the rest.
                if buffer.count - start - 1 >= 4 { throw FramingError(description: "the broker sent an MQTT packet with a malformed remaining length") }
                return
            }
            let index = start + 1 + size
            guard length <= FrameLimits.message else {
                throw FramingError(description: "the broker sent an MQTT packet of \(length) bytes, more than the \(FrameLimits.message)-byte limit")
            }
            guard buffer.count - index >= length else { return }
            let type = buffer[start]
            let body = Array(buffer[index..<(index + length)])
            start = index + length
            switch type >> 4 {
            case 13:  // PINGRESP
                if awaitingPong { awaitingPong = false; out.append(.pong) }
            case 3:  // PUBLISH
                out.append(.data(try Self.publish(flags: type & 0x0F, body: body, version: version)))
            case 14 where version == .v5:  // DISCONNECT, which only an MQTT 5 broker sends
                throw FramingError(description: MQTTPacket.disconnectReason(body[...]))
            default:
                out.append(.control([type] + body))
            }
        }
    }

    /// A PUBLISH body as a data frame: the payload, with topic, QoS and retain.
    static func publish(flags: UInt8, body: [UInt8], version: MQTTSettings.Version = .v311) throws(FramingError) -> DataFrame {
        guard body.count >= 2 else { throw FramingError(description: "the broker sent a PUBLISH too short for its topic") }
        let topicLength = Int(body[0]) << 8 | Int(body[1])
        let qos = Int(flags >> 1) & 3
        var offset = 2 + topicLength
        if qos > 0 { offset += 2 }
        if version == .v5, body.count >= offset {
            // The properties (message expiry, content type, ...) are skipped.
            guard let properties = MQTTPacket.variableInteger(body[offset...]) else {
                throw FramingError(description: "the broker sent a PUBLISH with malformed properties")
            }
            offset += properties.size + properties.value
        }
        guard qos < 3, body.count >= offset else { throw FramingError(description: "the broker sent a malformed PUBLISH (topic length \(topicLength), QoS \(qos))") }
        let topic = String(decoding: body[2..<(2 + topicLength)], as: UTF8.self)
        return DataFrame(
            bytes: Array(body[offset...]),
            variables: ["topic": topic, "qos": String(qos), "retain": flags & 1 == 1 ? "1" : "0"])
    }
}

/// `protocol = "sip"`: RFC 5626 CRLF keep-alive between SIP messages, which
/// are framed by their Content-Length. A lone CRLF between messages while a
/// ping is out is the pong; a response is control; a request is data.
struct SIPFramer: Sendable {
    private var buffer: [UInt8] = []
    /// The header block of the message at `buffer`'s start once it has come
    /// (where it ends, its Content-Length, the message), kept while the body
    /// arrives so it is parsed once, not once per read.
    private var head: (end: Int, length: Int, message: SIPMessage)?
    /// Where the search for that header block's end resumes: a server that
    /// sends it a byte at a time costs linear time, not quadratic (found by
    /// Fuzz/fuzz-sip: 8 KiB fed bytewise took seconds).
    private var searchFrom = 0

    mutating func feed(_ bytes: UnsafeRawBufferPointer, awaitingPong: inout Bool, into out: inout [Frame]) throws(FramingError) {
        buffer.append(contentsOf: bytes)
        var start = 0
        defer {
            buffer.removeFirst(start)
            searchFrom = max(0, searchFrom - start)
            if let pending = head { head = (pending.end - start, pending.length, pending.message) }
        }
        while start < buffer.count {
            if head == nil {
                // Between messages: CRLFs are keep-alive traffic (RFC 5626 §4.4.1).
                if buffer[start] == 0x0D || buffer[start] == 0x0A {
                    guard buffer.count - start >= 2 else { return }
                    if buffer[start] == 0x0D && buffer[start + 1] == 0x0A {
                        start += 2
                        if awaitingPong { awaitingPong = false; out.append(.pong) }
                    } else {
                        start += 1  // a stray LF or CR: ignored, as RFC 3261 §7.5 allows
                    }
                    continue
                }
                guard let headerEnd = Self.headerEnd(buffer, from: max(start, searchFrom)) else {
                    searchFrom = max(start, buffer.count - 3)
                    if buffer.count - start > FrameLimits.sipHeader {
                        throw FramingError(description: "the server sent a SIP header block longer than \(FrameLimits.sipHeader) bytes")
                    }
                    return
                }
                let message = SIPMessage(head: String(decoding: buffer[start..<headerEnd], as: UTF8.self))
                let length = try message.contentLength()
                guard length <= FrameLimits.message else {
                    throw FramingError(description: "the server sent a SIP body of \(length) bytes, more than the \(FrameLimits.message)-byte limit")
                }
                head = (headerEnd, length, message)
            }
            guard let (headerEnd, length, message) = head else { return }
            let end = headerEnd + 4 + length
            guard buffer.count >= end else { return }
            head = nil
            let whole = Array(buffer[start..<end])
            start = end
            searchFrom = end
            if message.isResponse {
                out.append(.control(whole))
            } else {
                out.append(.data(DataFrame(bytes: whole, variables: ["method": message.method])))
            }
        }
    }

    /// The index of the CRLFCRLF that ends the header block, if it came.
    static func headerEnd(_ bytes: [UInt8], from start: Int) -> Int? {
        var i = start
        while i + 3 < bytes.count {
            if bytes[i] == 0x0D && bytes[i + 1] == 0x0A && bytes[i + 2] == 0x0D && bytes[i + 3] == 0x0A { return i }
            i += 1
        }
        return nil
    }
}

/// The start line and headers of one SIP message.
struct SIPMessage: Sendable {
    let startLine: String
    /// Header names lower-cased (compact forms expanded), values trimmed, in order.
    let headers: [(name: String, value: String)]

    private static let compact: [String: String] = [
        "l": "content-length", "i": "call-id", "v": "via", "f": "from", "t": "to", "m": "contact", "c": "content-type",
    ]

    init(head: String) {
        var lines = head.split(separator: "\r\n", omittingEmptySubsequences: false).map(String.init)
        startLine = lines.isEmpty ? "" : lines.removeFirst()
        var parsed: [(String, String)] = []
        for line in lines {
            if let first = line.first, first == " " || first == "\t", !parsed.isEmpty {
                parsed[parsed.count - 1].1 += " " + line.trimmingSpaces  // folded continuation
                continue
            }
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = line[..<colon].trimmingSpaces.lowercased()
            parsed.append((Self.compact[name] ?? name, line[line.index(after: colon)...].trimmingSpaces))
        }
        headers = parsed
    }

    var isResponse: Bool { startLine.hasPrefix("SIP/2.0 ") }
    var method: String { isResponse ? "" : String(startLine.prefix { $0 != " " }) }
    /// The status code of a response, 0 for a request or a malformed line.
    var statusCode: Int {
        guard isResponse else { return 0 }
        return Int(startLine.dropFirst(8).prefix(3)) ?? 0
    }
    var reason: String { String(startLine.dropFirst(12)) }

    func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
    func all(_ name: String) -> [String] { headers.filter { $0.name == name }.map(\.value) }

    func contentLength() throws(FramingError) -> Int {
        guard let text = header("content-length") else { return 0 }
        guard let n = Int(text), n >= 0 else { throw FramingError(description: "the server sent a SIP message with Content-Length \"\(text)\"") }
        return n
    }
}

extension StringProtocol {
    var trimmingSpaces: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}

/// `protocol`: what the connection speaks.
enum WireProtocol: String, Sendable, Hashable, CaseIterable {
    case raw, mqtt, sip
}

/// How a link frames what it receives.
struct FramingOptions: Sendable, Hashable {
    var wire: WireProtocol = .raw
    /// `raw`: the pong (empty: none expected).
    var expect: [UInt8] = []
    /// `raw`: the message delimiter (empty: the pong must come first after the ping).
    var delimiter: [UInt8] = []
    /// `mqtt`: the protocol version (MQTT 5 packets carry properties).
    var mqttVersion = MQTTSettings.Version.v311

    func makeFramer() -> Framer {
        switch wire {
        case .raw: .raw(RawFramer(expect: expect, delimiter: delimiter))
        case .mqtt: .mqtt(MQTTFramer(version: mqttVersion))
        case .sip: .sip(SIPFramer())
        }
    }
}
