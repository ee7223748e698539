import Foundation
import Testing
@testable import VigilDBus

/// A signal counts only from its real sender: a peer's unicast copy of a bus
/// driver signal, or of a service's signal, reaches the connection whatever
/// its match rules say, and the connection drops it.
@Suite struct SignalSenderTests {
    static let driverPath = "/org/freedesktop/DBus"

    @Test func forgedBusDriverSignalsAreDropped() async throws {
        let bus = try TestBus()
        defer { bus.stop() }
        let receiver = try await bus.connect()
        let forger = try await bus.connect()
        let changes = try await receiver.signals(matching: DBusMatchRule(
            sender: DBusConnection.busDriverName, interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))
        let lost = try await receiver.signals(matching: DBusMatchRule(interface: "org.freedesktop.DBus", member: "NameLost"))
        let target = await receiver.uniqueName
        let forgerName = await forger.uniqueName
        for member in ["NameOwnerChanged", "NameLost", "NameAcquired"] {
            let arguments: [BusValue] = member == "NameOwnerChanged" ? [.string(":9.999"), .string(":9.999"), .string("")] : [.string("org.vigil.Forged")]
            try await forger.emitSignal(path: Self.driverPath, interface: "org.freedesktop.DBus", name: member,
                                        arguments: arguments, destination: target)
        }
        // Its round trip through the bus puts the forgeries ahead of the
        // real NameOwnerChanged that its disconnect makes.
        _ = try await forger.call(destination: DBusConnection.busDriverName, path: Self.driverPath,
                                  interface: "org.freedesktop.DBus", member: "GetId")
        await forger.close()
        var seen: [DBusMessage] = []
        for await message in changes {
            seen.append(message)
            if message.body.first == .string(forgerName) { break }
        }
        #expect(seen.allSatisfy { $0.sender == DBusConnection.busDriverName }, "\(seen)")
        #expect(!seen.contains { $0.body.first == .string(":9.999") }, "\(seen)")
        #expect(seen.last?.body == [.string(forgerName), .string(forgerName), .string("")])
        // A rule without a sender: the driver's signals still come only from
        // the driver. Releasing a name makes the driver send a real NameLost.
        try await receiver.requestName("org.vigil.Real")
        try await receiver.releaseName("org.vigil.Real")
        var lostIterator = lost.makeAsyncIterator()
        let firstLost = await lostIterator.next()
        #expect(firstLost?.body == [.string("org.vigil.Real")], "\(String(describing: firstLost))")
        #expect(firstLost?.sender == DBusConnection.busDriverName)
        await receiver.close()
    }

    @Test func serviceSignalsCountOnlyFromTheNamesCurrentOwner() async throws {
        let bus = try TestBus()
        defer { bus.stop() }
        let name = "org.vigil.SenderTest"
        let receiver = try await bus.connect()
        let first = try await bus.connect()
        try await first.requestName(name)
        let forger = try await bus.connect()
        let pings = try await receiver.signals(matching: DBusMatchRule(sender: name, path: "/t", interface: "org.vigil.Ping1"))
        var iterator = pings.makeAsyncIterator()
        let target = await receiver.uniqueName

        try await forger.emitSignal(path: "/t", interface: "org.vigil.Ping1", name: "Ping", arguments: [.string("forged")], destination: target)
        _ = try await forger.call(destination: DBusConnection.busDriverName, path: Self.driverPath,
                                  interface: "org.freedesktop.DBus", member: "GetId")
        try await first.emitSignal(path: "/t", interface: "org.vigil.Ping1", name: "Ping", arguments: [.string("real")])
        #expect(await iterator.next()?.body == [.string("real")])

        // The name moves: the former owner's unicast signals no longer count.
        try await first.releaseName(name)
        let second = try await bus.connect()
        try await second.requestName(name)
        try await first.emitSignal(path: "/t", interface: "org.vigil.Ping1", name: "Ping", arguments: [.string("stale")], destination: target)
        _ = try await first.call(destination: DBusConnection.busDriverName, path: Self.driverPath,
                                 interface: "org.freedesktop.DBus", member: "GetId")
        try await second.emitSignal(path: "/t", interface: "org.vigil.Ping1", name: "Ping", arguments: [.string("new owner")])
        let next = await iterator.next()
        #expect(next?.body == [.string("new owner")])
        #expect(next?.sender == (await second.uniqueName))
        for connection in [receiver, first, second, forger] { await connection.close() }
    }
}
