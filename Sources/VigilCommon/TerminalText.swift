import VigilKit

/// Text from outside (config files, D-Bus clients, plugins, servers) made
/// safe for a log line or a terminal: control and format characters become
/// visible escapes (`\n`, `\e`, `\u{0}`), so a newline cannot forge a log
/// line and an escape sequence cannot drive the terminal.
public enum TerminalText {
    public static func escaped(_ text: String) -> String { ClientText.escaped(text) }
}
