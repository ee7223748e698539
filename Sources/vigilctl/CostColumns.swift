import Foundation
import VigilKit

/// The cost columns `vigilctl strategies` and `vigilctl cost` share: the
/// figures of a ``StrategyCostRow``, for people.
enum CostColumns {
    static let columns: [TableFormat.Column] = [
        .init("SLEEP HELD", .right), .init("IDLE HELD", .right), .init("WAKEUPS", .right), .init("SYS WAKES", .right),
        .init("CPU", .right), .init("SENT", .right), .init("RECEIVED", .right),
    ]

    /// The cells of `cost`; dashes when it is unknown (a strategy gone
    /// between the list and the read).
    static func cells(_ cost: StrategyCostRow?) -> [String] {
        guard let cost else { return Array(repeating: "-", count: columns.count) }
        return [
            TableFormat.duration(micros: cost.sleepHeldUsec), TableFormat.duration(micros: cost.idleHeldUsec),
            String(cost.wakeups), String(cost.systemWakes), TableFormat.duration(micros: cost.childCPUUsec),
            bytes(cost.bytesSent), bytes(cost.bytesReceived),
        ]
    }

    /// Bytes for people: "512B", "1.5KiB", "3.2MiB", "1.0GiB".
    static func bytes(_ count: UInt64) -> String {
        guard count >= 1024 else { return "\(count)B" }
        var value = Double(count) / 1024
        for unit in ["KiB", "MiB", "GiB", "TiB"] {
            if value < 1024 || unit == "TiB" { return String(format: "%.1f%@", value, unit) }
            value /= 1024
        }
        return "\(count)B"
    }
}
