import VigilKit

/// Items appended from any thread, and a bounded wait for a condition over
/// all of them so far: tests await what a server, a hook or a strategy did
/// instead of sleeping.
///
/// It is also a strategy's test `EventRecording` (items ``RecordedEvent``)
/// and a swift-log backend (items ``LogLine``): give it, or a `Logger` made
/// with ``logger(_:metadata:level:)``, to a `StrategyContext` and wait for the
/// event or line the strategy should produce. Its loggers name their handler
/// explicitly, so a test never depends on `LoggingSystem.bootstrap`.
public final class WaitableLog<Item: Sendable>: Sendable {
    private struct Waiter {
        var id: UInt64
        var check: @Sendable ([Item]) -> Bool
        var continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        var items: [Item] = []
        var waiters: [Waiter] = []
        var nextWaiter: UInt64 = 0
    }

    private let state = Lock(State())

    public init() {}

    /// Every item so far, oldest first.
    public var all: [Item] { state.withLock { $0.items } }

    public var count: Int { state.withLock { $0.items.count } }

    /// Appends `item` and wakes the waiters whose condition now holds.
    public func append(_ item: Item) {
        let ready: [CheckedContinuation<Bool, Never>] = state.withLock { state in
            state.items.append(item)
            let snapshot = state.items
            var out: [CheckedContinuation<Bool, Never>] = []
            state.waiters.removeAll { waiter in
                guard waiter.check(snapshot) else { return false }
                out.append(waiter.continuation)
                return true
            }
            return out
        }
        for continuation in ready { continuation.resume(returning: true) }
    }

    /// Waits until `condition` holds for the items so far; false after
    /// `timeout` of real time (a bound for a broken run, not a pause), or
    /// when the waiting task is cancelled.
    @discardableResult
    public func wait(timeout: Duration = .seconds(10), until condition: @escaping @Sendable ([Item]) -> Bool) async -> Bool {
        let id: UInt64 = state.withLock {
            $0.nextWaiter += 1
            return $0.nextWaiter
        }
        // Unstructured task: cancelled by the defer below, when the wait ends.
        let timer = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            self?.giveUp(id)
        }
        defer { timer.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let now: Bool = state.withLock { state in
                    if condition(state.items) { return true }
                    state.waiters.append(Waiter(id: id, check: condition, continuation: continuation))
                    return false
                }
                if now { continuation.resume(returning: true) }
            }
        } onCancel: {
            giveUp(id)
        }
    }

    /// Waits until at least `n` items were appended; returns the count then
    /// (less than `n` after `timeout`).
    @discardableResult
    public func wait(forCount n: Int, timeout: Duration = .seconds(10)) async -> Int {
        await wait(timeout: timeout) { $0.count >= n }
        return count
    }

    /// Resumes the waiter `id` with false, if it still waits.
    private func giveUp(_ id: UInt64) {
        let waiter: CheckedContinuation<Bool, Never>? = state.withLock { state in
            guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
            return state.waiters.remove(at: index).continuation
        }
        waiter?.resume(returning: false)
    }
}

/// An event a strategy recorded (`StrategyContext.events`).
public struct RecordedEvent: Sendable, Hashable {
    public var name: String
    public var fields: [String: String]

    public init(_ name: String, _ fields: [String: String] = [:]) {
        self.name = name
        self.fields = fields
    }
}

extension WaitableLog: EventRecording where Item == RecordedEvent {
    public func record(_ event: String, _ fields: [String: String]) async {
        append(RecordedEvent(event, fields))
    }

    /// Waits until an event named `name` was recorded.
    @discardableResult
    public func wait(for name: String, timeout: Duration = .seconds(10)) async -> Bool {
        await wait(timeout: timeout) { $0.contains { $0.name == name } }
    }
}

/// A line a strategy logged (`StrategyContext.log`).
public struct LogLine: Sendable, Equatable {
    public var level: Logger.Level
    /// The logger's label (the host's lines start with it).
    public var source: String
    public var message: String
    /// The logger's fields merged with the call's own.
    public var metadata: Logger.Metadata

    public init(level: Logger.Level, source: String, message: String, metadata: Logger.Metadata = [:]) {
        self.level = level
        self.source = source
        self.message = message
        self.metadata = metadata
    }

    /// `<level> <source>: <message> key=value...`, the fields sorted by key:
    /// the shape of vigild's plain lines, unescaped (for tests to match).
    public var text: String {
        var line = "\(level.rawValue) \(source): \(message)"
        for key in metadata.keys.sorted() {
            if let value = metadata[key] { line += " \(key)=\(value)" }
        }
        return line
    }
}

/// The swift-log handler of a ``WaitableLog`` of ``LogLine``s: every line
/// at or above its level is appended.
public struct WaitableLogHandler: LogHandler {
    public let label: String
    public let lines: WaitableLog<LogLine>
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level
    public var metadataProvider: Logger.MetadataProvider?

    public init(label: String, lines: WaitableLog<LogLine>, level: Logger.Level = .trace,
                metadataProvider: Logger.MetadataProvider? = nil) {
        self.label = label
        self.lines = lines
        self.logLevel = level
        self.metadataProvider = metadataProvider
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { _, new in new } }
        if let own = event.metadata { merged.merge(own) { _, new in new } }
        lines.append(LogLine(level: event.level, source: label, message: event.message.description, metadata: merged))
    }
}

extension WaitableLog where Item == LogLine {
    /// A handler that appends here, for `Logger(label:factory:)`.
    public func handler(label: String) -> any LogHandler {
        WaitableLogHandler(label: label, lines: self)
    }

    /// A logger labelled `label` whose lines are appended here.
    public func logger(_ label: String, metadata: Logger.Metadata = [:], level: Logger.Level = .trace) -> Logger {
        var logger = Logger(label: label) { WaitableLogHandler(label: $0, lines: self, level: level) }
        for (key, value) in metadata { logger[metadataKey: key] = value }
        return logger
    }

    /// Every line so far as ``LogLine/text``.
    public var entries: [String] { all.map(\.text) }

    /// Waits until a line containing `text` was logged.
    @discardableResult
    public func wait(forLineContaining text: String, timeout: Duration = .seconds(10)) async -> Bool {
        await wait(timeout: timeout) { $0.contains { $0.message.contains(text) } }
    }
}
