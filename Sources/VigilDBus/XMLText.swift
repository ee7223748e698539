/// Text made safe for XML content and attribute values: the five markup
/// characters become entities, and characters XML 1.0 forbids (C0 controls
/// other than tab, newline and carriage return; U+FFFE, U+FFFF) become
/// U+FFFD, so outside strings (strategy names, peer names) can never break
/// a document or smuggle markup into it. Used by the introspection XML and
/// by the survival picture (SVG/HTML).
public enum XMLText {
    public static func escaped(_ text: String) -> String {
        var result = ""
        result.reserveCapacity(text.utf8.count)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "&": result += "&amp;"
            case "<": result += "&lt;"
            case ">": result += "&gt;"
            case "\"": result += "&quot;"
            case "'": result += "&apos;"
            case "\t", "\n", "\r": result.unicodeScalars.append(scalar)
            case _ where scalar.value < 0x20 || scalar.value == 0xFFFE || scalar.value == 0xFFFF:
                result += "\u{FFFD}"
            default: result.unicodeScalars.append(scalar)
            }
        }
        return result
    }
}
