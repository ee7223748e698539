import Foundation
import VigilKit

/// The documented limits of a config file (docs/configuration.md, "Limits").
///
/// They keep hostile or broken files from crashing the host or the CLI:
/// TOMLKit's parser and the conversion above it recurse once per nesting
/// level, so a dotted key of a few hundred parts overflowed the stack of a
/// running host on reload. Every limit is checked before the work it guards.
public enum ConfigLimits {
    /// Largest config file read, in bytes (2 MiB).
    public static let maxFileBytes = 2 * 1024 * 1024
    /// Deepest nesting of a value: dotted key parts, table header parts,
    /// `[[array]]` elements, inline tables and arrays counted together.
    public static let maxDepth = 64
    /// Most `[[strategy]]` tables in one file.
    public static let maxStrategies = 10_000
    /// Most problems listed for one file; the rest are counted.
    public static let maxReportedProblems = 100
    /// Longest strategy name, in bytes of UTF-8.
    public static let maxStrategyNameBytes = 128
}

/// Reads a TOML text once before TOMLKit parses it, building nothing, and
/// finds what TOMLKit would crash on or silently get wrong:
/// - nesting past ``ConfigLimits/maxDepth``;
/// - a `\u0000` escape: TOMLKit hands strings over as C strings, so a NUL
///   would silently cut the string (a strategy name, an argv element) short;
/// - a raw control character (TOML allows only tab, LF and CR before LF): a
///   NUL byte would cut the whole document short the same way, and others
///   reach assertions of toml++ (`parse_key`: vigild aborts, release builds
///   too, as SwiftPM defines no NDEBUG for toml++). Found by Fuzz/fuzz-config;
/// - an array element starting with `}` or a Unicode line break, which
///   reaches another assertion of toml++ (`parse_value`).
///
/// It reads bytes in one pass and recurses only into inline tables and
/// arrays, at most `maxDepth` levels (it stops at the first level past the
/// limit). It does not validate TOML: on anything it does not understand it
/// resumes at the next line, counting conservatively, and TOMLKit reports the
/// syntax error afterwards.
struct TOMLPrecheck {
    private let bytes: [UInt8]
    private let file: String
    private let limit: Int
    private var position = 0
    private var line = 1
    private var lineStart = 0
    private var headerDepth = 0
    private(set) var problem: ConfigProblem?

    /// The first place in `text` that nests deeper than `limit` or holds a
    /// NUL escape, or nil.
    static func firstProblem(in text: String, file: String, limit: Int = ConfigLimits.maxDepth) -> ConfigProblem? {
        let bytes = Array(text.utf8)
        if let problem = controlCharacter(in: bytes, file: file) { return problem }
        var check = TOMLPrecheck(bytes: bytes, file: file, limit: limit)
        // A byte-order mark, as toml++ skips it (and as the source locator
        // does, so columns match): read as the start of a key, it hid a
        // header on the first line (`\u{FEFF}[ }` aborted vigild; found by
        // Fuzz/fuzz-config).
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) {
            check.position = 3
            check.lineStart = 3
        }
        check.scanDocument()
        return check.problem
    }

    /// The first control character TOML does not allow (all but tab, LF,
    /// and CR before LF), anywhere: strings and comments included.
    private static func controlCharacter(in bytes: [UInt8], file: String) -> ConfigProblem? {
        var line = 1, lineStart = 0
        for (i, c) in bytes.enumerated() {
            if c == UInt8(ascii: "\n") {
                line += 1
                lineStart = i + 1
                continue
            }
            let allowed = c == UInt8(ascii: "\t") || (c == UInt8(ascii: "\r") && i + 1 < bytes.count && bytes[i + 1] == UInt8(ascii: "\n"))
            guard c < 0x20 || c == 0x7F, !allowed else { continue }
            let hex = String(c, radix: 16, uppercase: true)
            let code = String(repeating: "0", count: 4 - hex.count) + hex
            return ConfigProblem(
                location: ConfigLocation(file: file, line: line, column: i - lineStart + 1), keyPath: "",
                message: "control character U+\(code) is not allowed in TOML (only tab and line ends are; "
                    + "in a string, write it as the escape \"\\u\(code)\")")
        }
        return nil
    }

    private init(bytes: [UInt8], file: String, limit: Int) {
        self.bytes = bytes
        self.file = file
        self.limit = limit
    }

    private var current: UInt8? { position < bytes.count ? bytes[position] : nil }
    private var failed: Bool { problem != nil }

    private mutating func advance() {
        guard position < bytes.count else { return }
        if bytes[position] == UInt8(ascii: "\n") {
            line += 1
            lineStart = position + 1
        }
        position += 1
    }

    private func starts(with s: StaticString) -> Bool {
        let count = s.utf8CodeUnitCount
        guard position + count <= bytes.count else { return false }
        return (0..<count).allSatisfy { bytes[position + $0] == s.utf8Start[$0] }
    }

    /// Records the problem when `depth` is past the limit; true if it is.
    private mutating func tooDeep(_ depth: Int, what: String, at start: (line: Int, column: Int)) -> Bool {
        guard depth > limit, problem == nil else { return failed }
        problem = ConfigProblem(
            location: ConfigLocation(file: file, line: start.line, column: start.column), keyPath: "",
            message: "\(what) nests more than \(limit) levels deep (dotted key parts, table header parts, "
                + "inline tables and arrays together); the limit is \(limit) levels"
        )
        return true
    }

    private var here: (line: Int, column: Int) { (line, position - lineStart + 1) }

    // MARK: document

    private mutating func scanDocument() {
        while current != nil, !failed {
            skipBlank()
            guard let c = current else { return }
            let start = position
            if c == UInt8(ascii: "[") {
                scanHeader()
            } else {
                scanKeyValue(base: headerDepth, what: "key")
            }
            // Resume at the next line whatever was left (comment, junk).
            if !failed { skipRestOfLine(movedFrom: start) }
        }
    }

    private mutating func scanHeader() {
        let start = here
        let isArray = starts(with: "[[")
        advance()
        if isArray { advance() }
        skipSpaces()
        // toml++ asserts that a header's first key starts with a bare-key
        // character or a quote (`[!]`, `[.]`, `[é]` abort vigild, release
        // builds too: SwiftPM defines no NDEBUG for toml++; found by
        // Fuzz/fuzz-config): say so first. TOML's bare keys are ASCII.
        if let c = current, !isASCIIKeyByte(c), c != UInt8(ascii: "\""), c != UInt8(ascii: "'"), c != UInt8(ascii: "]") {
            let end = bytes[position...].firstIndex { $0 == UInt8(ascii: "]") || $0 == UInt8(ascii: "\n") } ?? bytes.endIndex
            let found = String(decoding: bytes[position..<min(end, position + 16)], as: UTF8.self)
            problem = ConfigProblem(
                location: ConfigLocation(file: file, line: here.line, column: here.column), keyPath: "",
                message: "a table header must start with a key, bare (ASCII letters, digits, _ and -) or quoted; found \"\(found)\"")
            return
        }
        let parts = scanKey()
        headerDepth = parts + (isArray ? 1 : 0)
        _ = tooDeep(headerDepth, what: "table header", at: start)
    }

    private mutating func scanKeyValue(base: Int, what: String) {
        let start = here
        let parts = scanKey()
        guard parts > 0, !tooDeep(base + parts, what: what, at: start) else { return }
        skipSpaces()
        guard current == UInt8(ascii: "=") else { return }
        advance()
        skipSpaces()
        scanValue(depth: base + parts)
    }

    /// Counts the parts of a possibly dotted key, stopping early past the limit.
    private mutating func scanKey() -> Int {
        var parts = 0
        skipSpaces()
        while let c = current, parts <= limit + 1 {
            if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                skipString()
            } else if isKeyByte(c) {
                while let k = current, isKeyByte(k) { advance() }
            } else {
                break
            }
            parts += 1
            skipSpaces()
            guard current == UInt8(ascii: ".") else { break }
            advance()
            skipSpaces()
        }
        return parts
    }

    /// Bare-key bytes, and any non-ASCII byte (TOML 1.1 allows Unicode keys).
    private func isKeyByte(_ c: UInt8) -> Bool {
        isASCIIKeyByte(c) || c >= 0x80
    }

    /// TOML 1.0's bare-key bytes.
    private func isASCIIKeyByte(_ c: UInt8) -> Bool {
        (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "z")) || (c >= UInt8(ascii: "A") && c <= UInt8(ascii: "Z"))
            || (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9")) || c == UInt8(ascii: "_") || c == UInt8(ascii: "-")
    }

    // MARK: values

    private mutating func scanValue(depth: Int) {
        guard let c = current, !failed else { return }
        switch c {
        case UInt8(ascii: "\""), UInt8(ascii: "'"):
            skipString()
        case UInt8(ascii: "["):
            let start = here
            guard !tooDeep(depth + 1, what: "array", at: start) else { return }
            advance()
            while !failed {
                skipBlank()
                guard let e = current else { return }
                if e == UInt8(ascii: "]") { advance(); return }
                if e == UInt8(ascii: ",") { advance(); continue }
                if let found = valueTerminator() {
                    problem = ConfigProblem(
                        location: ConfigLocation(file: file, line: here.line, column: here.column), keyPath: "",
                        message: "an array holds \(found) where a value or \"]\" belongs")
                    return
                }
                let before = position
                scanValue(depth: depth + 1)
                if position == before { advance() }
            }
        case UInt8(ascii: "{"):
            let start = here
            guard !tooDeep(depth + 1, what: "inline table", at: start) else { return }
            advance()
            while !failed {
                skipBlank()
                guard let e = current else { return }
                if e == UInt8(ascii: "}") { advance(); return }
                if e == UInt8(ascii: ",") { advance(); continue }
                let before = position
                scanKeyValue(base: depth, what: "key")
                if position == before { advance() }
            }
        default:
            while let v = current, v != UInt8(ascii: ","), v != UInt8(ascii: "]"), v != UInt8(ascii: "}"),
                  v != UInt8(ascii: "#"), v != UInt8(ascii: "\n") {
                advance()
            }
        }
    }

    /// At an array element: what toml++ counts as ending a value but does
    /// not skip there: `}`, or a Unicode line break (U+0085, U+2028,
    /// U+2029), which it counts as whitespace. Its parse_value asserts that
    /// none is there: `a = [ }` aborted vigild, debug and release builds
    /// alike (found by Fuzz/fuzz-config). No TOML value starts so.
    private func valueTerminator() -> String? {
        if current == UInt8(ascii: "}") { return "\"}\"" }
        if starts(with: "\u{85}") { return "U+0085 (a Unicode line break, not whitespace TOML allows)" }
        if starts(with: "\u{2028}") { return "U+2028 (a Unicode line separator, not whitespace TOML allows)" }
        if starts(with: "\u{2029}") { return "U+2029 (a Unicode paragraph separator, not whitespace TOML allows)" }
        return nil
    }

    // MARK: strings, blanks

    private mutating func skipString() {
        let quote = bytes[position]
        let multiline = quote == UInt8(ascii: "\"") ? starts(with: "\"\"\"") : starts(with: "'''")
        for _ in 0..<(multiline ? 3 : 1) { advance() }
        while let c = current {
            if c == quote, !multiline || (position + 2 < bytes.count && bytes[position + 1] == quote && bytes[position + 2] == quote) {
                for _ in 0..<(multiline ? 3 : 1) { advance() }
                while multiline, current == quote { advance() }
                return
            }
            if !multiline, c == UInt8(ascii: "\n") { return }
            if quote == UInt8(ascii: "\""), c == UInt8(ascii: "\\") {
                if isNULEscape() { return }
                advance()
            }
            advance()
        }
    }

    /// At a backslash: records a problem for `\u0000` or `\U00000000`.
    private mutating func isNULEscape() -> Bool {
        guard starts(with: "\\u0000") || starts(with: "\\U00000000"), problem == nil else { return false }
        problem = ConfigProblem(
            location: ConfigLocation(file: file, line: here.line, column: here.column), keyPath: "",
            message: "a string holds a NUL character (\\u0000); config strings may not contain NUL"
        )
        return true
    }

    private mutating func skipSpaces() {
        while let c = current, c == UInt8(ascii: " ") || c == UInt8(ascii: "\t") { advance() }
    }

    private mutating func skipBlank() {
        while let c = current {
            if c == UInt8(ascii: " ") || c == UInt8(ascii: "\t") || c == UInt8(ascii: "\r") || c == UInt8(ascii: "\n") {
                advance()
            } else if c == UInt8(ascii: "#") {
                while let k = current, k != UInt8(ascii: "\n") { advance() }
            } else {
                return
            }
        }
    }

    /// Moves past the end of the current line; always makes progress.
    private mutating func skipRestOfLine(movedFrom start: Int) {
        if position == start { advance() }
        if position > 0, bytes[position - 1] == UInt8(ascii: "\n") { return }
        while let c = current, c != UInt8(ascii: "\n") {
            if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") { skipString() } else { advance() }
        }
        advance()
    }
}

/// What a strategy name may be: printable text of at most
/// ``ConfigLimits/maxStrategyNameBytes`` bytes. Names reach log lines,
/// terminals, D-Bus object paths and the survival log, so a newline or an
/// escape sequence in one could forge a log line or drive a terminal.
public enum StrategyName {
    /// The strategy names the host gives leases that no configured strategy
    /// holds: a strategy named so would share their bus objects, limits and
    /// metrics, and the D-Bus projection follows those leases apart.
    public static let reserved = [ClientLeases.strategyName, ForeignInhibits.strategyName]

    /// Why `name` is refused, or nil when it is acceptable.
    public static func problem(_ name: String) -> String? {
        if reserved.contains(name) {
            return "\"\(name)\" is reserved: vigild shows the leases D-Bus clients begin (BeginBackgroundTask) as strategy "
                + "\"\(ClientLeases.strategyName)\" and applications' inhibits as \"\(ForeignInhibits.strategyName)\"; choose another name"
        }
        let bytes = name.utf8.count
        if bytes > ConfigLimits.maxStrategyNameBytes {
            return "name is \(bytes) bytes long; the limit is \(ConfigLimits.maxStrategyNameBytes) bytes"
        }
        for (offset, scalar) in name.unicodeScalars.enumerated() where !isPrintable(scalar) {
            return "name holds \(describe(scalar)) at character \(offset + 1); names must be printable text "
                + "(no control characters, newlines, escape sequences or NUL)"
        }
        return nil
    }

    static func isPrintable(_ scalar: Unicode.Scalar) -> Bool { ClientText.isPrintable(scalar) }

    static func describe(_ scalar: Unicode.Scalar) -> String {
        let code = String(format: "U+%04X", scalar.value)
        switch scalar {
        case "\0": return "a NUL character (\(code))"
        case "\n": return "a newline (\(code))"
        case "\r": return "a carriage return (\(code))"
        case "\t": return "a tab (\(code))"
        case "\u{1B}": return "an escape character (\(code))"
        default: return "a non-printable character (\(code))"
        }
    }
}

