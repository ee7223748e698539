import Foundation

/// The status and header fields of the response being received, built from
/// libcurl's header callback one line at a time, and what download-session
/// reads from them. Pure (no file, no handle), so Fuzz/ feeds it server text.
struct ResponseHead: Sendable {
    /// The status of the latest status line (0 for a malformed one).
    private(set) var status = 0
    /// Header fields of the latest response, names lower-cased; a repeated
    /// field keeps its last value.
    private(set) var fields: [String: String] = [:]

    subscript(_ name: String) -> String? { fields[name] }

    /// Takes one header line as libcurl hands it over (with its CRLF).
    mutating func take(line bytes: UnsafeRawBufferPointer) {
        let line = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if line.hasPrefix("HTTP/") {
            // A new response (after a redirect or a 100 Continue): start over.
            fields = [:]
            let parts = line.split(separator: " ", maxSplits: 2)
            status = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
            return
        }
        guard let colon = line.firstIndex(of: ":") else { return }
        let name = line[..<colon].lowercased()
        let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        fields[name] = value
    }

    /// For a 206 to a request for bytes `resumeFrom`- (to the end): nil when
    /// its Content-Range is that range, else why it is not. The range must be
    /// whole, `bytes first-last/total` or `bytes first-last/*` (RFC 9110).
    func partialContentProblem(resumeFrom: Int64, expectedTotal: Int64?) -> String? {
        let range = fields["content-range"] ?? ""
        guard let start = Self.rangeStart(range), start == resumeFrom, Self.rangeEnd(range) != nil, range.contains("/") else {
            return "asked for bytes \(resumeFrom)- and the server sent Content-Range \"\(range)\""
        }
        let complete = Self.completeLength(range)
        // `complete - 1`, not `end + 1`: the end is the server's number and
        // may be Int64.max; a length is never negative (see `length`).
        if let complete, let end = Self.rangeEnd(range), end != complete - 1 {
            return "asked for bytes \(resumeFrom)- (to the end) and the server sent Content-Range \"\(range)\", which ends before the total"
        }
        if let expectedTotal, let complete, complete != expectedTotal {
            return "the server's Content-Range \"\(range)\" gives a total of \(complete) bytes, but the response the part began with said \(expectedTotal)"
        }
        return nil
    }

    /// The resource's full length, from Content-Range or, for a body that
    /// starts at `resumeFrom`, Content-Length; nil when the server did not say.
    /// A Content-Length that, added to `resumeFrom`, passes Int64.max is
    /// not a length either.
    func totalLength(resumeFrom: Int64) -> Int64? {
        if let complete = fields["content-range"].flatMap(Self.completeLength) { return complete }
        guard let length = fields["content-length"].flatMap({ Self.length($0[...]) }) else { return nil }
        let (total, overflow) = length.addingReportingOverflow(resumeFrom)
        return overflow ? nil : total
    }

    /// A length or a position as HTTP writes it: ASCII digits only (no sign,
    /// no space inside), within Int64; nil for anything else.
    static func length(_ text: Substring) -> Int64? {
        let digits = text.trimmingCharacters(in: .whitespaces)
        guard !digits.isEmpty, digits.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) else { return nil }
        return Int64(digits)
    }

    /// `bytes 100-199/1000` → 100.
    static func rangeStart(_ header: String) -> Int64? {
        guard header.lowercased().hasPrefix("bytes ") else { return nil }
        let spec = header.dropFirst(6)
        guard let dash = spec.firstIndex(of: "-") else { return nil }
        return length(spec[..<dash])
    }

    /// `bytes 100-199/1000` → 199; nil for `bytes */1000` or garbage.
    static func rangeEnd(_ header: String) -> Int64? {
        guard header.lowercased().hasPrefix("bytes "), let dash = header.firstIndex(of: "-") else { return nil }
        let rest = header[header.index(after: dash)...]
        let end = rest.firstIndex(of: "/").map { rest[..<$0] } ?? rest
        return length(end)
    }

    /// `bytes 100-199/1000` or `bytes */1000` → 1000; nil for `*` or garbage.
    static func completeLength(_ header: String?) -> Int64? {
        guard let header, let slash = header.lastIndex(of: "/") else { return nil }
        return length(header[header.index(after: slash)...])
    }
}
