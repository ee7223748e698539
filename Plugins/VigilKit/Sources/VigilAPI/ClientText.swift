/// Text from outside (a D-Bus client, a config file, a plugin, a server)
/// made safe to show: the one place that bounds and escapes it.
///
/// Every error message that quotes a client's input quotes it through
/// ``excerpt(_:limit:)``, so a reply never echoes a huge value back and a
/// newline or escape sequence in it cannot forge a log line or drive a
/// terminal (docs/security.md).
public enum ClientText {
    /// Most characters of a client's text an error message quotes.
    public static let excerptLimit = 64

    /// At most `limit` characters of `text`, escaped, with "…" when cut.
    /// Counts unicode scalars of the escaped text (so at most 4 × `limit`
    /// bytes), and reads no further into `text` than it quotes.
    public static func excerpt(_ text: String, limit: Int = excerptLimit) -> String {
        // Counted as it grows: a UnicodeScalarView's count walks the whole
        // view, which made each excerpt quadratic in its length.
        var out = String.UnicodeScalarView()
        var count = 0
        for scalar in text.unicodeScalars {
            let piece = escape(scalar)
            let width = piece?.unicodeScalars.count ?? 1
            guard count + width <= limit else {
                return String(out) + "…"
            }
            if let piece { out.append(contentsOf: piece.unicodeScalars) } else { out.append(scalar) }
            count += width
        }
        return String(out)
    }

    /// `text` with control and format characters as visible escapes
    /// (`\n`, `\e`, `\u{0}`), unbounded: for text already bounded (a log
    /// line's own fields, a table cell).
    public static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: { !isPrintable($0) }) else { return text }
        var out = ""
        out.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            if let piece = escape(scalar) { out += piece } else { out.unicodeScalars.append(scalar) }
        }
        return out
    }

    /// Whether `scalar` shows as itself: not a control, format, separator,
    /// surrogate, private-use or unassigned character.
    public static func isPrintable(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.properties.generalCategory {
        case .control, .format, .lineSeparator, .paragraphSeparator, .surrogate, .privateUse, .unassigned:
            return false
        default:
            return true
        }
    }

    /// The escape that shows `scalar`, or nil when it shows as itself.
    private static func escape(_ scalar: Unicode.Scalar) -> String? {
        guard !isPrintable(scalar) else { return nil }
        switch scalar {
        case "\n": return "\\n"
        case "\r": return "\\r"
        case "\t": return "\\t"
        case "\u{1B}": return "\\e"
        default: return "\\u{\(String(scalar.value, radix: 16, uppercase: true))}"
        }
    }
}
