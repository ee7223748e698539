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
}
