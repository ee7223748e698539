import VigilDBus
import VigilKit

/// Conversions from host values to the D-Bus values of docs/dbus-api.md.
public enum HostBusValues {
    /// A strategy's TOML table as `a{sv}`.
    public static func configTable(_ table: [String: ConfigValue]) -> BusEncoded<[String: BusValue]> {
        BusEncoded(keyOrder: table.mapValues(config))
    }

    /// One TOML value: strings `s`, integers `x`, floats `d`, booleans `b`,
    /// date-times `s` (their TOML text), arrays `av` (TOML arrays may mix
    /// types), tables `a{sv}`.
    public static func config(_ value: ConfigValue) -> BusValue {
        switch value {
        case .string(let s): .string(s)
        case .integer(let i): .int64(i)
        case .float(let d): .double(d)
        case .boolean(let b): .bool(b)
        case .datetime(let text): .string(text)
        case .array(let items): .array(elementSignature: "v", items.map { .variant(config($0)) })
        case .table(let table): configTable(table).busValue
        }
    }

    /// A lease's live status as `a{sv}`, keys sorted.
    public static func status(_ status: [String: StatusValue]) -> BusEncoded<[String: BusValue]> {
        BusEncoded(keyOrder: status.mapValues { value in
            switch value {
            case .string(let v): .string(v)
            case .int(let v): .int64(v)
            case .uint(let v): .uint64(v)
            case .double(let v): .double(v)
            case .bool(let v): .bool(v)
            }
        })
    }

    /// Microseconds of a duration, 0 for negative ones.
    static func micros(_ duration: Duration) -> UInt64 {
        let (seconds, attoseconds) = duration.components
        return UInt64(clamping: max(0, seconds * 1_000_000 + attoseconds / 1_000_000_000_000))
    }

    /// The wall time (µs since the epoch) of a lease's deadline, 0 when it
    /// has none (``LeaseSnapshot/deadlineWallMicros``).
    static func deadlineWallMicros(_ lease: LeaseSnapshot) -> UInt64 {
        UInt64(clamping: max(0, lease.deadlineWallMicros ?? 0))
    }
}
