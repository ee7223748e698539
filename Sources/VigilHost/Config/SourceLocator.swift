import VigilKit

/// One step of a path into a TOML document: a table key or an array index.
enum TOMLPathComponent: Hashable, Sendable {
    case key(String)
    case index(Int)
}

/// Finds where keys, tables and array elements sit in a TOML text.
///
/// TOMLKit reports line and column only for parse errors, so problems about
/// values would otherwise carry no position. This scanner reads the text a
/// second time, after TOMLKit accepted it, and records the position of every
/// table header (`[host]`, the n-th `[[strategy]]`), every key (bare, quoted
/// and dotted, also inside inline tables) and every array element. It skips
/// over strings, multi-line strings, multi-line arrays and comments so that
/// their contents are never mistaken for keys. The input is known to be valid
/// TOML, so the scanner is lenient: on anything unexpected it moves on rather
/// than failing, and the worst outcome is a missing location.
///
/// A key's location is that of its first character; a table's is that of the
/// `[` of its header; an array element's is that of its first character.
struct SourceLocator {
    private(set) var locations: [[TOMLPathComponent]: ConfigLocation] = [:]

    init(text: String, file: String) {
        var scanner = Scanner(text: text, file: file)
        scanner.scanDocument()
        locations = scanner.locations
    }

    /// The location of `path`, or of its nearest ancestor that has one.
    func location(of path: [TOMLPathComponent]) -> ConfigLocation? {
        var path = path
        while !path.isEmpty {
            if let found = locations[path] { return found }
            path.removeLast()
        }
        return nil
    }

    /// The location of exactly `path`, without falling back to an ancestor.
    func exactLocation(of path: [TOMLPathComponent]) -> ConfigLocation? { locations[path] }
}

private struct Scanner {
    let chars: [Unicode.Scalar]
    let file: String
    var position = 0
    var line = 1
    var column = 1
    var locations: [[TOMLPathComponent]: ConfigLocation] = [:]
    /// Element counts of arrays of tables, keyed by their resolved path
    /// (which includes the index of any enclosing array-of-tables element).
    var arrayTableCounts: [[TOMLPathComponent]: Int] = [:]
    /// The table that key/value lines currently belong to.
    var currentTable: [TOMLPathComponent] = []

    init(text: String, file: String) {
        chars = Array(text.unicodeScalars)
        self.file = file
    }

    var atEnd: Bool { position >= chars.count }
    var current: Unicode.Scalar? { atEnd ? nil : chars[position] }

    func peek(_ offset: Int) -> Unicode.Scalar? {
        position + offset < chars.count ? chars[position + offset] : nil
    }

    var here: ConfigLocation { ConfigLocation(file: file, line: line, column: column) }

    mutating func advance() {
        guard !atEnd else { return }
        if chars[position] == "\n" {
            line += 1
            column = 1
        } else {
            column += 1
        }
        position += 1
    }

    mutating func advance(_ n: Int) { for _ in 0..<n { advance() } }

    func starts(with s: String) -> Bool {
        var i = position
        for c in s.unicodeScalars {
            guard i < chars.count, chars[i] == c else { return false }
            i += 1
        }
        return true
    }

    mutating func record(_ path: [TOMLPathComponent], _ location: ConfigLocation) {
        if locations[path] == nil { locations[path] = location }
    }

    // MARK: whitespace and comments

    mutating func skipSpaces() {
        while let c = current, c == " " || c == "\t" { advance() }
    }

    mutating func skipComment() {
        guard current == "#" else { return }
        while let c = current, c != "\n" { advance() }
    }

    /// Skips spaces, tabs, newlines and comments (inside arrays and between lines).
    mutating func skipBlank() {
        while let c = current {
            if c == " " || c == "\t" || c == "\r" || c == "\n" {
                advance()
            } else if c == "#" {
                skipComment()
            } else {
                return
            }
        }
    }

    mutating func skipRestOfLine() {
        while let c = current, c != "\n" {
            // A stray string here would be invalid TOML; still skip it whole.
            if c == "\"" || c == "'" { skipString() } else { advance() }
        }
        advance()
    }

    // MARK: document

    mutating func scanDocument() {
        // A byte-order mark is not part of the first line's text (and takes
        // no column), so skip it without counting.
        if current == "\u{FEFF}" { position += 1 }
        while !atEnd {
            skipBlank()
            guard let c = current else { break }
            if c == "[" {
                scanHeader()
            } else {
                scanKeyValue(in: currentTable)
            }
            skipSpaces()
            skipComment()
            if current == "\n" { advance() } else if !atEnd, current != "\r" { skipRestOfLine() }
        }
    }

    mutating func scanHeader() {
        let start = here
        let isArray = peek(1) == "["
        advance(isArray ? 2 : 1)
        skipSpaces()
        let keys = scanKey().map(\.key)
        skipSpaces()
        advance(isArray ? 2 : 1)  // "]" or "]]"

        // Resolve through enclosing arrays of tables: `[strategy.env]` after
        // the third `[[strategy]]` means strategy[2].env.
        var resolved: [TOMLPathComponent] = []
        for (i, key) in keys.enumerated() {
            resolved.append(.key(key))
            let isLast = i == keys.count - 1
            if isLast, isArray {
                let count = arrayTableCounts[resolved, default: 0]
                arrayTableCounts[resolved] = count + 1
                record(resolved, start)
                resolved.append(.index(count))
            } else if let count = arrayTableCounts[resolved] {
                resolved.append(.index(count - 1))
            }
        }
        record(resolved, start)
        currentTable = resolved
    }

    /// Reads `key = value` and records the key (every dotted prefix) and what
    /// the value contains.
    mutating func scanKeyValue(in table: [TOMLPathComponent]) {
        let keys = scanKey()
        guard !keys.isEmpty else {
            skipRestOfLine()
            return
        }
        var path = table
        for part in keys {
            path.append(.key(part.key))
            record(path, part.location)
        }
        skipSpaces()
        guard current == "=" else { return }
        advance()
        skipSpaces()
        scanValue(at: path)
    }

    // MARK: keys

    /// A possibly dotted key; each part with the location of its first character.
    mutating func scanKey() -> [(key: String, location: ConfigLocation)] {
        var parts: [(key: String, location: ConfigLocation)] = []
        while let c = current {
            let location = here
            if c == "\"" {
                parts.append((readBasicString(), location))
            } else if c == "'" {
                parts.append((readLiteralString(), location))
            } else if isBareKeyCharacter(c) {
                var key = ""
                while let k = current, isBareKeyCharacter(k) {
                    key.unicodeScalars.append(k)
                    advance()
                }
                parts.append((key, location))
            } else {
                break
            }
            skipSpaces()
            guard current == "." else { break }
            advance()
            skipSpaces()
        }
        return parts
    }

    func isBareKeyCharacter(_ c: Unicode.Scalar) -> Bool {
        ("a"..."z").contains(c) || ("A"..."Z").contains(c) || ("0"..."9").contains(c) || c == "_" || c == "-"
    }

    // MARK: values

    mutating func scanValue(at path: [TOMLPathComponent]) {
        guard let c = current else { return }
        switch c {
        case "\"", "'":
            skipString()
        case "[":
            advance()
            var index = 0
            while true {
                skipBlank()
                guard let e = current else { return }
                if e == "]" { advance(); return }
                if e == "," { advance(); continue }
                let elementPath = path + [.index(index)]
                record(elementPath, here)
                let before = position
                scanValue(at: elementPath)
                if position == before { advance() }  // never loop on unexpected input
                index += 1
            }
        case "{":
            advance()
            while true {
                skipSpaces()
                guard let e = current else { return }
                if e == "}" { advance(); return }
                if e == "," { advance(); continue }
                if e == "\n" { advance(); continue }  // TOML 1.1 allows newlines here
                let before = position
                scanKeyValue(in: path)
                if position == before { advance() }
            }
        default:
            // Numbers, booleans, dates: up to a delimiter. A date-time may
            // contain one space, which is harmless here.
            while let v = current, v != ",", v != "]", v != "}", v != "#", v != "\n" { advance() }
        }
    }

    mutating func skipString() {
        if current == "\"" { _ = readBasicString() } else { _ = readLiteralString() }
    }

    /// Reads a `"..."` or `"""..."""` string, decoding the common escapes
    /// (enough to match quoted keys against TOMLKit's decoded keys).
    mutating func readBasicString() -> String {
        let multiline = starts(with: "\"\"\"")
        advance(multiline ? 3 : 1)
        var out = ""
        while let c = current {
            if multiline ? starts(with: "\"\"\"") : c == "\"" {
                advance(multiline ? 3 : 1)
                // A multi-line string may end with up to two extra quotes.
                while multiline, current == "\"" { out.unicodeScalars.append("\""); advance() }
                return out
            }
            if !multiline, c == "\n" { return out }  // invalid; stop at the line end
            if c == "\\" {
                advance()
                guard let e = current else { return out }
                switch e {
                case "n": out += "\n"; advance()
                case "t": out += "\t"; advance()
                case "r": out += "\r"; advance()
                case "b": out += "\u{8}"; advance()
                case "f": out += "\u{C}"; advance()
                case "e": out += "\u{1B}"; advance()
                case "\"", "\\": out.unicodeScalars.append(e); advance()
                case "u", "U":
                    let width = e == "u" ? 4 : 8
                    advance()
                    var hex = ""
                    for _ in 0..<width {
                        guard let h = current, h.properties.isASCIIHexDigit else { break }
                        hex.unicodeScalars.append(h)
                        advance()
                    }
                    if let value = UInt32(hex, radix: 16), let scalar = Unicode.Scalar(value) {
                        out.unicodeScalars.append(scalar)
                    }
                default:
                    // Line-ending backslash in a multi-line string, or invalid.
                    advance()
                }
                continue
            }
            out.unicodeScalars.append(c)
            advance()
        }
        return out
    }

    /// Reads a `'...'` or `'''...'''` string (no escapes).
    mutating func readLiteralString() -> String {
        let multiline = starts(with: "'''")
        advance(multiline ? 3 : 1)
        var out = ""
        while let c = current {
            if multiline ? starts(with: "'''") : c == "'" {
                advance(multiline ? 3 : 1)
                while multiline, current == "'" { out.unicodeScalars.append("'"); advance() }
                return out
            }
            if !multiline, c == "\n" { return out }
            out.unicodeScalars.append(c)
            advance()
        }
        return out
    }
}
