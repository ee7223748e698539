import ServiceLifecycle

/// A service for a part of the host that starts by itself (a listener, a
/// watcher, a task) and only needs stopping: it waits for the group's
/// graceful shutdown (or its own cancellation), then runs `stop`. Its place
/// in the group says when it stops: in reverse order of the group's services.
public struct StopAtShutdown: Service, CustomStringConvertible {
    public let description: String
    private let stop: @Sendable () async -> Void

    public init(_ name: String, stop: @escaping @Sendable () async -> Void) {
        self.description = name
        self.stop = stop
    }

    public func run() async {
        try? await gracefulShutdown()
        await stop()
    }
}
