import Foundation

/// The time zone wall times are shown in, for people.
///
/// Foundation's local zone needs the system's time zone data: in a root
/// without `/usr/share/zoneinfo` (a minimal container or initramfs) a release
/// `DateFormatter` on `TimeZone.current` trapped (SIGILL). Without the data
/// the times are shown in UTC, built from a fixed offset (no file needed),
/// and `note` says so.
public struct DisplayTimeZone: Sendable {
    public var zone: TimeZone
    /// Why the zone is not the local one, or nil.
    public var note: String?

    /// The zone for this process: local when `TZDIR` (default
    /// `/usr/share/zoneinfo`) is a directory, else UTC with a note.
    public static func resolve(environment: [String: String] = ProcessInfo.processInfo.environment) -> DisplayTimeZone {
        let dir = environment["TZDIR"].flatMap { $0.isEmpty ? nil : $0 } ?? "/usr/share/zoneinfo"
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: dir, isDirectory: &isDirectory), isDirectory.boolValue {
            return DisplayTimeZone(zone: .current, note: nil)
        }
        return utc(note: "times are UTC: no time zone data at \(dir)")
    }

    /// UTC from a fixed offset, which needs no time zone file.
    public static func utc(note: String? = nil) -> DisplayTimeZone {
        // Invariant: offset 0 is within the valid range of ±18 hours.
        DisplayTimeZone(zone: TimeZone(secondsFromGMT: 0)!, note: note)
    }
}
