import Foundation

/// The kernel's boot id: a random UUID chosen at every boot. A run whose boot
/// id differs from the current one ended with a reboot.
public enum BootID {
    /// Where Linux publishes it.
    public static let path = "/proc/sys/kernel/random/boot_id"

    /// Reads the current boot id (lowercase UUID text, no newline).
    public static func current() throws -> String {
        try read(from: path)
    }

    /// Reads a boot id from `file`; for tests and for unusual /proc mounts.
    public static func read(from file: String) throws -> String {
        let text: String
        do {
            text = try String(contentsOfFile: file, encoding: .utf8)
        } catch {
            throw SurvivalStoreError(.unreadable, path: file, "cannot read the boot id: \(error.localizedDescription)")
        }
        let id = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard !id.isEmpty else {
            throw SurvivalStoreError(.invalidArgument, path: file, "the boot id file is empty; expected a UUID")
        }
        return id
    }
}
