/// A D-Bus error: the one error type that crosses the bus.
///
/// Handlers throw it to reply with a specific error name; the client side
/// throws it when a call returns an error reply. Any other Swift error thrown
/// by a handler is sent as `org.freedesktop.DBus.Error.Failed`.
public struct DBusError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The D-Bus error name, such as `org.freedesktop.DBus.Error.InvalidArgs`.
    public var name: String
    /// A human-readable message.
    public var message: String

    public init(name: String, message: String) {
        self.name = name
        self.message = message
    }

    public var description: String { "\(name): \(message)" }

    /// Standard error names from the D-Bus specification.
    public enum Name {
        public static let failed = "org.freedesktop.DBus.Error.Failed"
        public static let unknownMethod = "org.freedesktop.DBus.Error.UnknownMethod"
        public static let unknownObject = "org.freedesktop.DBus.Error.UnknownObject"
        public static let unknownInterface = "org.freedesktop.DBus.Error.UnknownInterface"
        public static let unknownProperty = "org.freedesktop.DBus.Error.UnknownProperty"
        public static let propertyReadOnly = "org.freedesktop.DBus.Error.PropertyReadOnly"
        public static let invalidArgs = "org.freedesktop.DBus.Error.InvalidArgs"
        public static let invalidSignature = "org.freedesktop.DBus.Error.InvalidSignature"
        public static let accessDenied = "org.freedesktop.DBus.Error.AccessDenied"
        public static let limitsExceeded = "org.freedesktop.DBus.Error.LimitsExceeded"
        public static let noReply = "org.freedesktop.DBus.Error.NoReply"
        public static let disconnected = "org.freedesktop.DBus.Error.Disconnected"
        public static let notSupported = "org.freedesktop.DBus.Error.NotSupported"
        public static let noMemory = "org.freedesktop.DBus.Error.NoMemory"
    }

    public static func failed(_ message: String) -> DBusError { DBusError(name: Name.failed, message: message) }
    public static func unknownMethod(_ message: String) -> DBusError { DBusError(name: Name.unknownMethod, message: message) }
    public static func unknownObject(_ message: String) -> DBusError { DBusError(name: Name.unknownObject, message: message) }
    public static func unknownInterface(_ message: String) -> DBusError { DBusError(name: Name.unknownInterface, message: message) }
    public static func unknownProperty(_ message: String) -> DBusError { DBusError(name: Name.unknownProperty, message: message) }
    public static func propertyReadOnly(_ message: String) -> DBusError { DBusError(name: Name.propertyReadOnly, message: message) }
    public static func invalidArgs(_ message: String) -> DBusError { DBusError(name: Name.invalidArgs, message: message) }
    public static func accessDenied(_ message: String) -> DBusError { DBusError(name: Name.accessDenied, message: message) }
    public static func limitsExceeded(_ message: String) -> DBusError { DBusError(name: Name.limitsExceeded, message: message) }
    public static func notSupported(_ message: String) -> DBusError { DBusError(name: Name.notSupported, message: message) }
    public static func disconnected(_ message: String) -> DBusError { DBusError(name: Name.disconnected, message: message) }
}

/// Why requesting a well-known bus name failed.
public enum DBusNameRequestError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Another connection owns the name (and we asked not to queue).
    case alreadyOwned(name: String, owner: String?)
    /// The bus put us in the queue for the name (only without `doNotQueue`).
    case queued(name: String)
    /// The name is not a valid well-known bus name.
    case invalidName(String)
    /// The bus refused the request (policy, limits, ...).
    case refused(name: String, error: DBusError)

    public var description: String {
        switch self {
        case let .alreadyOwned(name, owner):
            return "the D-Bus name \(name) is already owned" + (owner.map { " by \($0)" } ?? "") + "; is another instance running?"
        case let .queued(name):
            return "the D-Bus name \(name) is owned by another connection; this one was put in the queue"
        case let .invalidName(name):
            return "\"\(name)\" is not a valid D-Bus well-known name"
        case let .refused(name, error):
            return "the bus refused the name \(name): \(error)"
        }
    }
}
