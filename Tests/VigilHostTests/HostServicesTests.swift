import Foundation
import ServiceLifecycle
import Testing
@testable import VigilHost
import VigilKit
import VigilKitTesting

/// The services the host makes of its parts start in the order vigild
/// relies on, though the group starts them together: the strategies wait
/// for the service before them (the sleep cycle) and say when they have
/// started (the bus waits for that); a group that shuts down first starts
/// no strategy at all.
@Suite("Host services")
struct HostServicesTests {
    @Test func theStrategiesStartOnlyOnceTheServiceBeforeThemHasStarted() async throws {
        let (runtime, logs, directory) = try await Self.open()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let before = Started()
        let strategies = await runtime.strategies(after: before)
        let (group, running) = Self.run([runtime.survivalRecorder(outcome: RunOutcome()), strategies], logs: logs)
        // Nothing starts while the service before it has not.
        try await Task.sleep(for: .milliseconds(200))
        #expect(await runtime.supervisor.statuses.isEmpty)
        await before.set(true)
        #expect(await strategies.started.wait() == true)
        #expect(await runtime.supervisor.statuses.map(\.name) == ["keep"])
        await group.triggerGracefulShutdown()
        try await running.value
        #expect(await runtime.supervisor.statuses.isEmpty)
        #expect(logs.all.contains { $0.message.contains("shutting down") })
    }

    @Test func aGroupThatStopsFirstStartsNoStrategy() async throws {
        let (runtime, logs, directory) = try await Self.open()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let strategies = await runtime.strategies(after: Started())
        let (group, running) = Self.run([runtime.survivalRecorder(outcome: RunOutcome()), strategies], logs: logs)
        await group.triggerGracefulShutdown()
        try await running.value
        #expect(await runtime.supervisor.statuses.isEmpty)
        #expect(!logs.all.contains { $0.message.contains("started with") })
    }

    /// A runtime with one strategy (`keep`, test-idle) on a manual clock.
    static func open() async throws -> (HostRuntime, WaitableLog<LogLine>, String) {
        var template = Array("/tmp/vigil-host-services-XXXXXX".utf8CString)
        let directory = String(cString: try #require(mkdtemp(&template)))
        let (runtime, logs, _) = try await HostBusFixture.openRuntime(directory: directory, """
            [[strategy]]
            name = "keep"
            kind = "test-idle"
            """)
        return (runtime, logs, directory)
    }

    static func run(_ services: [any Service], logs: WaitableLog<LogLine>) -> (ServiceGroup, Task<Void, any Error>) {
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(
            services: services.map { .init(service: $0) }, logger: logs.logger("vigild")))
        return (group, Task { try await group.run() })
    }
}
