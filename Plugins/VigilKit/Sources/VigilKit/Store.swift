/// A strategy's own persistent records: key → bytes, kept by the host in
/// its SQLite store (the survival log's database), per strategy instance
/// name, across restarts, crashes and reloads.
///
/// Meant for small state a strategy must find again after `kill -9`: a
/// download's URL, validators and state; a socket's last session id. Each
/// `put` is one committed transaction (durable when it returns), so write
/// on state changes, not on every byte. Keys are free-form strings; values
/// are opaque (JSON is a good choice).
public protocol StrategyStore: Sendable {
    /// Stores `value` under `key`, replacing any previous value.
    func put(_ key: String, _ value: [UInt8]) async throws
    /// The value under `key`, or nil.
    func get(_ key: String) async throws -> [UInt8]?
    /// Removes `key`; removing a missing key does nothing.
    func delete(_ key: String) async throws
    /// Every record of this strategy, keyed by key.
    func all() async throws -> [String: [UInt8]]
}

/// Why a store operation failed.
public struct StrategyStoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// A store that keeps records in memory only: the default for contexts
/// built without a host (tests, examples). Records are lost with the value.
public actor MemoryStrategyStore: StrategyStore {
    private var records: [String: [UInt8]] = [:]

    public init() {}

    public func put(_ key: String, _ value: [UInt8]) { records[key] = value }
    public func get(_ key: String) -> [UInt8]? { records[key] }
    public func delete(_ key: String) { records[key] = nil }
    public func all() -> [String: [UInt8]] { records }
}
