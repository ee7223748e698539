import Foundation
import Testing
import VigilDBus
import VigilTestSupport
@testable import VigilHost
import VigilKit
import VigilKitTesting

/// The StrategyBusBridge on a private bus and the manual clock: child
/// objects a strategy exports announce their property changes at most once
/// a second, with the newest values, and state changes at once.
@Suite struct StrategyBusBridgeTests {
    static let interface = VigilAPI.downloadInterface
    static let properties = VigilAPI.download.properties

    /// A bridge attached to an object server on a private bus, and a client
    /// connection recording every signal the server's connection sends.
    final class Fixture: @unchecked Sendable {
        // Invariant: all stored properties are immutable after init.
        let clock = ManualClock()
        let bus: TestDBusDaemon
        let host: DBusConnection
        let client: DBusConnection
        let bridge: StrategyBusBridge
        let signals: SignalRecorder

        init() async throws {
            bus = try await offPool { try TestDBusDaemon() }
            host = try await bus.connect()
            client = try await bus.connect()
            let server = try await DBusObjectServer(connection: host)
            bridge = StrategyBusBridge(logging: WaitableLog<LogLine>().logging)
            let log = WaitableLog<LogLine>().logger("dbus")
            let limiter = PropertiesChangedLimiter(clock: clock, log: log, server: server)
            await bridge.attach(server: server, hostUID: getuid(), credentials: CallerCredentials(connection: host), limiter: limiter)
            signals = SignalRecorder(try await client.signals(matching: DBusMatchRule(
                sender: await host.uniqueName, interface: VigilAPI.propertiesInterface, member: "PropertiesChanged")))
        }

        func stop() async {
            await bridge.runEnded("dl")
            await client.close()
            await host.close()
            let bus = self.bus
            await offPool { bus.stop() }
        }

        func get(_ path: String, _ name: String) async throws -> BusValue {
            let reply = try await client.call(destination: await host.uniqueName, path: path, interface: VigilAPI.propertiesInterface,
                                              member: "Get", arguments: [.string(Self.interfaceName), .string(name)], timeout: .seconds(10))
            guard case .variant(let value) = reply.body.first else { throw DBusError.failed("no variant") }
            return value
        }

        static let interfaceName = StrategyBusBridgeTests.interface
    }

    static func bytes(_ signal: SeenSignal) -> UInt64? {
        if case .uint64(let n)? = signal.changedProperties["BytesDone"] { return n }
        return nil
    }

    /// Progress every 100 ms for 3.5 s gives one PropertiesChanged per
    /// second (not 35), each with a larger BytesDone than the one before;
    /// the final state change is announced at once, with the last figure.
    @Test func progressIsAnnouncedAtMostOncePerSecondAndTheFinalStateAtOnce() async throws {
        let f = try await Fixture()
        do {
            let object = try await f.bridge.bus(for: "dl").exportObject(
                relativePath: "Download/1", interface: Self.interface, properties: Self.properties,
                values: ["State": .string("active"), "BytesDone": .uint64(0)])
            #expect(object.path == "/org/vigil/Vigil1/Strategy/dl/Download/1")
            for step in 1...35 {
                await f.clock.advance(by: .milliseconds(100))
                await object.update(["BytesDone": .uint64(UInt64(step) * 1000)], immediately: false)
                // Reads always see the newest value, announced or not.
                if step == 5 { #expect(try await f.get(object.path, "BytesDone") == .uint64(5000)) }
            }
            await object.update(["State": .string("completed"), "BytesDone": .uint64(35_000)], immediately: true)
            // Signals of one connection arrive in order: once the final one
            // is here, every earlier one is too.
            let seen = await f.signals.wait { $0.contains { $0.changedProperties["State"] == .string("completed") } }
            #expect(seen.allSatisfy { $0.path == object.path }, "\(seen)")
            let progress = seen.dropLast()
            #expect(progress.count == 3, "one announcement per second of progress, got \(seen.map(\.description))")
            // Second n announces the figure of about n seconds (9000 if the
            // flush ran before the update at the boundary, else 10000).
            for (index, signal) in progress.enumerated() {
                let second = UInt64(index + 1)
                let n = Self.bytes(signal) ?? 0
                #expect(n == second * 10_000 || n == second * 10_000 - 1000, "second \(second): \(n)")
                #expect(signal.changedProperties["State"] == nil, "\(signal)")
            }
            let figures = progress.compactMap(Self.bytes)
            #expect(figures == figures.sorted() && Set(figures).count == figures.count, "\(figures)")
            #expect(seen.last?.changedProperties["State"] == .string("completed"))
            // The last figure was still pending: it goes out with the state.
            #expect(seen.last.flatMap(Self.bytes) == 35_000, "\(seen.map(\.description))")
            // Nothing is left to flush: a later second brings no signal.
            await f.clock.advance(by: .seconds(2))
            await object.update(["State": .string("completed")], immediately: true)
            #expect(f.signals.all.count == seen.count, "\(f.signals.descriptions())")
        } catch {
            await f.stop()
            throw error
        }
        await f.stop()
    }

    /// The limit is per object: two downloads progressing together each
    /// get their own announcement each second.
    @Test func theRateLimitIsPerObject() async throws {
        let f = try await Fixture()
        do {
            let bus = f.bridge.bus(for: "dl")
            let a = try await bus.exportObject(relativePath: "Download/1", interface: Self.interface, properties: Self.properties,
                                               values: ["State": .string("active"), "BytesDone": .uint64(0)])
            let b = try await bus.exportObject(relativePath: "Download/2", interface: Self.interface, properties: Self.properties,
                                               values: ["State": .string("active"), "BytesDone": .uint64(0)])
            for step in 1...5 {
                await f.clock.advance(by: .milliseconds(250))
                await a.update(["BytesDone": .uint64(UInt64(step))], immediately: false)
                await b.update(["BytesDone": .uint64(UInt64(step) * 10)], immediately: false)
            }
            // 1.25 s: one announcement each so far (at 1 s).
            let seen = await f.signals.wait(for: 2)
            #expect(seen.filter { $0.path == a.path }.count == 1, "\(f.signals.descriptions())")
            #expect(seen.filter { $0.path == b.path }.count == 1, "\(f.signals.descriptions())")
            // The pending figures of both go out at 2 s.
            await f.clock.advance(by: .seconds(1))
            let later = await f.signals.wait(for: 4)
            #expect(later.filter { $0.path == a.path }.last.flatMap(Self.bytes) == 5, "\(f.signals.descriptions())")
            #expect(later.filter { $0.path == b.path }.last.flatMap(Self.bytes) == 50, "\(f.signals.descriptions())")
            #expect(later.count == 4, "\(f.signals.descriptions())")
        } catch {
            await f.stop()
            throw error
        }
        await f.stop()
    }
}
