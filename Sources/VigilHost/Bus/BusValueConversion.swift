import VigilDBus
import VigilKit

/// The one conversion between the SDK's ``BusValue`` (what strategies and
/// the API's rows hold) and the wire's ``DBusValue``.
extension HostBusValues {
    /// A bus value on the wire.
    public static func bus(_ value: BusValue) -> DBusValue {
        switch value {
        case .string(let v): .string(v)
        case .int64(let v): .int64(v)
        case .uint64(let v): .uint64(v)
        case .int32(let v): .int32(v)
        case .uint32(let v): .uint32(v)
        case .double(let v): .double(v)
        case .bool(let v): .bool(v)
        case .objectPath(let v): .objectPath(v)
        case .array(let element, let items): .array(elementSignature: element, items.map { bus($0) })
        case .dictionary(let d):
            .dict(keySignature: "s", valueSignature: "v", d.keys.sorted().map { key in
                DBusDictEntry(key: .string(key), value: .variant(bus(d[key] ?? .string(""))))
            })
        case .structure(let fields): .structure(fields.map { bus($0) })
        }
    }

    /// A wire value as a bus value; nil for types ``BusValue`` cannot hold
    /// (file descriptors, bytes, non-`a{sv}` dictionaries). Variants are
    /// unwrapped; 8- and 16-bit integers widen to 32 bits.
    public static func bus(_ value: DBusValue) -> BusValue? {
        switch value {
        case .string(let v): return .string(v)
        case .int64(let v): return .int64(v)
        case .uint64(let v): return .uint64(v)
        case .int32(let v): return .int32(v)
        case .uint32(let v): return .uint32(v)
        case .int16(let v): return .int32(Int32(v))
        case .uint16(let v): return .uint32(UInt32(v))
        case .byte(let v): return .uint32(UInt32(v))
        case .double(let v): return .double(v)
        case .bool(let v): return .bool(v)
        case .objectPath(let v): return .objectPath(v)
        case .variant(let inner): return bus(inner)
        case .array(let element, let items):
            var out: [BusValue] = []
            out.reserveCapacity(items.count)
            for item in items {
                guard let v = bus(item) else { return nil }
                out.append(v)
            }
            return .array(elementSignature: element, out)
        case .dict(let key, let valueSig, let entries):
            guard key == "s", valueSig == "v" else { return nil }
            var out: [String: BusValue] = [:]
            for entry in entries {
                guard case .string(let k) = entry.key, let v = bus(entry.value) else { return nil }
                out[k] = v
            }
            return .dictionary(out)
        case .structure(let fields):
            var out: [BusValue] = []
            for field in fields {
                guard let v = bus(field) else { return nil }
                out.append(v)
            }
            return .structure(out)
        default:
            return nil
        }
    }

    /// Rows as the array a method returns.
    public static func rows<Row: APIRow>(_ rows: [Row]) -> DBusValue {
        bus(Row.array(rows))
    }

    /// The rows of an array a method returned; `APIDecodingError` when it
    /// is not the contract's array.
    public static func rows<Row: APIRow>(_ value: DBusValue, as type: Row.Type = Row.self) throws(APIDecodingError) -> [Row] {
        guard let converted = bus(value) else { throw APIDecodingError("expected \(Row.arraySignature), got \(value.signature)") }
        return try Row.rows(converted)
    }
}
