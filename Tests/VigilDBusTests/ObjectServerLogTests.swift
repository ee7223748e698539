import Foundation
import Testing
@testable import VigilDBus
import VigilKit
import VigilKitTesting

/// The object server's log: what a caller cannot see whole (a handler's
/// non-D-Bus error, a handler returning the wrong types) is an error line,
/// a refused call a debug line, and a call that succeeds writes nothing.
/// The logger names its handler: nothing depends on LoggingSystem.
@Suite struct ObjectServerLogTests {
    struct Crash: Error, CustomStringConvertible {
        var description: String { "the disk caught fire" }
    }

    @Test func failuresAreLoggedAndSuccessIsNot() async throws {
        let bus = try TestBus()
        defer { bus.stop() }
        let lines = WaitableLog<LogLine>()
        let service = try await bus.connect()
        let client = try await bus.connect()
        let server = try await DBusObjectServer(connection: service, logger: lines.logger("dbus"))
        try await server.export("/org/vigil/Test", interfaces: [DBusInterface(
            "org.vigil.Test1",
            methods: [
                DBusMethod("Echo", in: [DBusArgument("text", String.self)], out: [DBusArgument("echoed", String.self)]) { call in
                    [.string(try call.argument(0, as: String.self))]
                },
                DBusMethod("Crash") { _ in throw Crash() },
                DBusMethod("Broken", out: [DBusArgument("text", "s")]) { _ in [.int32(1)] },
            ]
        )])
        let name = await service.uniqueName
        let clientName = await client.uniqueName
        func call(_ member: String, _ arguments: [BusValue] = []) async -> String? {
            do {
                _ = try await client.call(destination: name, path: "/org/vigil/Test", interface: "org.vigil.Test1",
                                          member: member, arguments: arguments)
                return nil
            } catch let error as DBusError {
                return error.name
            } catch {
                return "\(error)"
            }
        }

        #expect(await call("Echo", [.string("hi")]) == nil)
        #expect(await call("Crash") == DBusError.Name.failed)
        #expect(await call("Broken") == DBusError.Name.failed)
        #expect(await call("Missing") == DBusError.Name.unknownMethod)
        #expect(await lines.wait { $0.contains { $0.message.hasPrefix("refused org.vigil.Test1.Missing") } })

        let logged = lines.all
        #expect(!logged.contains { $0.message.contains("Echo") }, "\(lines.entries)")
        let crash = try #require(logged.first { $0.message.contains("Crash") }, "\(lines.entries)")
        #expect(crash.level == .error)
        #expect(crash.source == "dbus")
        #expect(crash.message == "org.vigil.Test1.Crash on /org/vigil/Test failed: the disk caught fire")
        #expect(crash.metadata["sender"] == "\(clientName)")
        let broken = try #require(logged.first { $0.message.contains("Broken") }, "\(lines.entries)")
        #expect(broken.level == .error)
        #expect(broken.message.contains("returned signature \"i\" but is declared to return \"s\""))
        let refused = try #require(logged.first { $0.message.contains("Missing") })
        #expect(refused.level == .debug)
        #expect(refused.message.contains(DBusError.Name.unknownMethod))

        // A client's path may be megabytes long: the line quotes an excerpt.
        let longPath = "/" + String(repeating: "a", count: 1 << 20)
        _ = try? await client.call(destination: name, path: longPath, interface: "org.vigil.Test1", member: "Echo", arguments: [.string("x")])
        #expect(await lines.wait { $0.contains { $0.message.contains(DBusError.Name.unknownObject) } })
        let unknown = try #require(lines.all.first { $0.message.contains(DBusError.Name.unknownObject) })
        #expect(unknown.message.utf8.count < 1_000, "a line of \(unknown.message.utf8.count) bytes")

        await client.close()
        await service.close()
    }
}
