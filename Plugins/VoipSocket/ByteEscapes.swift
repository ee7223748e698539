/// The byte notation of `ping`, `expect` and `send_on_connect`: text with
/// the escapes `\r`, `\n`, `\t`, `\0`, `\\` and `\xHH` (any byte).
///
/// TOML basic strings ("...") already turn `\r\n` into bytes; this also lets a
/// user write `'\r\n\r\n'` in a literal string, and `\x00` (which TOML does not
/// know). A raw character is taken as its UTF-8 bytes.
enum ByteEscapes {
    struct Problem: Error, Equatable {
        var message: String
    }

    static func parse(_ text: String) -> Result<[UInt8], Problem> {
        var out: [UInt8] = []
        var scalars = Array(text.unicodeScalars)[...]
        while let c = scalars.popFirst() {
            guard c == "\\" else {
                out.append(contentsOf: Array(String(c).utf8))
                continue
            }
            guard let e = scalars.popFirst() else {
                return .failure(Problem(message: "ends with a lone backslash in \"\(text)\"; write \\\\ for a backslash"))
            }
            switch e {
            case "r": out.append(0x0D)
            case "n": out.append(0x0A)
            case "t": out.append(0x09)
            case "0": out.append(0x00)
            case "\\": out.append(0x5C)
            case "x":
                let digits = String(String.UnicodeScalarView(scalars.prefix(2)))
                guard digits.count == 2, let byte = UInt8(digits, radix: 16) else {
                    return .failure(Problem(message: "expected two hex digits after \\x in \"\(text)\", e.g. \\x00"))
                }
                scalars = scalars.dropFirst(2)
                out.append(byte)
            default:
                return .failure(Problem(message: "unknown escape \\\(e) in \"\(text)\" (escapes: \\r \\n \\t \\0 \\\\ \\xHH)"))
            }
        }
        return .success(out)
    }

    /// Bytes as the notation `parse` reads back, for logs and status.
    static func format(_ bytes: [UInt8]) -> String {
        var s = ""
        for b in bytes {
            switch b {
            case 0x0D: s += "\\r"
            case 0x0A: s += "\\n"
            case 0x09: s += "\\t"
            case 0x5C: s += "\\\\"
            case 0x20...0x7E: s.unicodeScalars.append(Unicode.Scalar(b))
            default:
                let hex = String(b, radix: 16)
                s += "\\x" + (hex.count == 1 ? "0" + hex : hex)
            }
        }
        return s
    }
}

/// Words a server sent (a SIP reason phrase, an MQTT reason string), made
/// fit for a LastError, a log line or a terminal: printable ASCII only, at
/// most `limit` characters of it.
func serverText(_ text: String, limit: Int) -> String {
    String(String.UnicodeScalarView(text.unicodeScalars.prefix(limit).filter { $0.value >= 0x20 && $0.value < 0x7F }))
}
