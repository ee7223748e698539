/// Where a value sits in a config file.
public struct ConfigLocation: Hashable, Sendable, CustomStringConvertible {
    public var file: String
    public var line: Int
    public var column: Int

    public init(file: String, line: Int, column: Int) {
        self.file = file
        self.line = line
        self.column = column
    }

    public var description: String { "\(file):\(line):\(column)" }
}

/// A value from a TOML config, independent of the TOML library.
public indirect enum ConfigValue: Hashable, Sendable {
    case string(String)
    case integer(Int64)
    case float(Double)
    case boolean(Bool)
    /// TOML dates and times, kept as their TOML text.
    case datetime(String)
    case array([ConfigValue])
    case table([String: ConfigValue])

    /// The TOML type name, for error messages ("expected a duration, found an array").
    public var typeName: String {
        switch self {
        case .string: "a string"
        case .integer: "an integer"
        case .float: "a float"
        case .boolean: "a boolean"
        case .datetime: "a date-time"
        case .array: "an array"
        case .table: "a table"
        }
    }
}

/// One problem found while validating a config.
public struct ConfigProblem: Hashable, Sendable, CustomStringConvertible, Error {
    /// File, line and column, when known.
    public var location: ConfigLocation?
    /// The dotted key path, e.g. `strategy[2].every` or `host.state_dir`.
    public var keyPath: String
    public var message: String

    public init(location: ConfigLocation?, keyPath: String, message: String) {
        self.location = location
        self.keyPath = keyPath
        self.message = message
    }

    public var description: String {
        let at = location.map { "\($0): " } ?? ""
        return keyPath.isEmpty ? "\(at)\(message)" : "\(at)\(keyPath): \(message)"
    }
}
