import TOMLKit
import VigilKit

/// Converts TOMLKit values into the SDK's ``ConfigValue``, so that nothing
/// above the config layer depends on TOMLKit.
enum TOMLConversion {
    static func value(_ node: any TOMLValueConvertible) -> ConfigValue {
        switch node.type {
        case .string: return .string(node.string ?? "")
        case .int: return .integer(Int64(node.int ?? 0))
        case .double: return .float(node.double ?? .nan)
        case .bool: return .boolean(node.bool ?? false)
        case .date: return .datetime(node.date.map(\.debugDescription) ?? "")
        case .time: return .datetime(node.time.map(\.debugDescription) ?? "")
        case .dateTime: return .datetime(node.dateTime.map(\.debugDescription) ?? "")
        case .array: return .array(node.array.map { $0.map(value) } ?? [])
        case .table: return .table(node.table.map(table) ?? [:])
        }
    }

    static func table(_ table: TOMLTable) -> [String: ConfigValue] {
        var out: [String: ConfigValue] = [:]
        for key in table.keys {
            if let node = table[key] { out[key] = value(node) }
        }
        return out
    }
}
