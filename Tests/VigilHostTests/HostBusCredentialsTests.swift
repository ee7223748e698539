import Foundation
import Testing
import VigilDBus
import VigilTestSupport
@testable import VigilHost

/// The one caller-credentials cache: filled from the bus, keyed by unique
/// name, and dropped only by a NameOwnerChanged that came from the bus driver.
@Suite struct HostBusCredentialsTests {
    @Test func aForgedNameOwnerChangedKeepsTheEntryAndTheDriversDropsIt() async throws {
        let bus = try await offPool { try TestDBusDaemon() }
        let host = try await bus.connect()
        let client = try await bus.connect()
        let peer = try await bus.connect()
        do {
            let cache = CallerCredentials(connection: host)
            let name = await client.uniqueName
            let entry = try await cache.of(name)
            #expect(entry.uid == getuid())
            #expect(entry.pid == UInt32(getpid()))
            #expect(cache.cached(name) == entry)

            let vanished: [BusValue] = [.string(name), .string(name), .string("")]
            // A peer's copy (its sender is the peer's unique name, as the bus sets it).
            #expect(cache.follow(nameOwnerChangedFrom: await peer.uniqueName, body: vanished) == nil)
            #expect(cache.follow(nameOwnerChangedFrom: nil, body: vanished) == nil)
            #expect(cache.cached(name) == entry)
            // From the driver, but a name changing hands rather than leaving.
            #expect(cache.follow(nameOwnerChangedFrom: DBusConnection.busDriverName, body: [.string(name), .string(""), .string(name)]) == nil)
            #expect(cache.cached(name) == entry)
            // The driver's own signal: the name left.
            #expect(cache.follow(nameOwnerChangedFrom: DBusConnection.busDriverName, body: vanished) == name)
            #expect(cache.cached(name) == nil)
        } catch {
            Issue.record(error)
        }
        await peer.close()
        await client.close()
        await host.close()
        await offPool { bus.stop() }
    }
}
