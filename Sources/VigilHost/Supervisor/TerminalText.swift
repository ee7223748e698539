/// Text from outside (config files, D-Bus clients, plugins, servers) made
/// safe for a log line or a terminal: control and format characters become
/// visible escapes (`\n`, `\e`, `\u{0}`), so a newline cannot forge a log
/// line and an escape sequence cannot drive the terminal.
public enum TerminalText {
    public static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: { !StrategyName.isPrintable($0) }) else { return text }
        var out = ""
        out.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            if StrategyName.isPrintable(scalar) {
                out.unicodeScalars.append(scalar)
                continue
            }
            switch scalar {
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case "\u{1B}": out += "\\e"
            default: out += "\\u{\(String(scalar.value, radix: 16, uppercase: true))}"
            }
        }
        return out
    }
}
