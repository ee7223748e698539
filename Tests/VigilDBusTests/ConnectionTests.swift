import Foundation
import Testing
@testable import VigilDBus

@Suite("DBusConnection")
struct ConnectionTests {
    @Test func connectsAndCallsTheBus() async throws {
        let bus = try TestBus()
        defer { bus.stop() }
        let connection = try await bus.connect()
        let name = await connection.uniqueName
        #expect(name.hasPrefix(":"))
        let names = try await connection.call(
            destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
            member: "ListNames", arguments: [], returning: [String].self)
        #expect(names.contains(name))
        await connection.close()
    }

    /// A reply deadline is one of the host loop's timers: a call whose peer
    /// does not read it fails with NoReply after its timeout, not before
    /// and not much after, and the connection goes on working; a call
    /// answered in time cancels its timer, which then never fires.
    @Test func aReplyDeadlineIsALoopTimer() async throws {
        let bus = try TestBus()
        defer { bus.stop() }
        let service = try await bus.connect()
        let client = try await bus.connect()
        let destination = await service.uniqueName
        await service.onQueue { $0.queue.holdReading() }
        let started = ContinuousClock.now
        do {
            try await client.call(destination: destination, path: "/", interface: "org.vigil.Silent1", member: "Wait",
                                  timeout: .milliseconds(300))
            Issue.record("a call nobody read was answered")
        } catch let error as DBusError {
            #expect(error.name == DBusError.Name.noReply, "\(error)")
        }
        let waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(300) && waited < .seconds(5), "waited \(waited)")
        await service.onQueue { $0.queue.resumeReading() }

        for _ in 0..<3 {
            let id = try await client.call(
                destination: "org.freedesktop.DBus", path: "/org/freedesktop/DBus", interface: "org.freedesktop.DBus",
                member: "GetId", returning: String.self, timeout: .milliseconds(200))
            #expect(!id.isEmpty)
        }
        // Past the deadlines of the calls just answered: their timers were
        // cancelled, and the connection still answers.
        try await Task.sleep(for: .milliseconds(400))
        #expect(await client.isConnected)
        #expect(await service.uniqueName == destination)
        await client.close()
        await service.close()
    }
}
