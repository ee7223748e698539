import Foundation
import Testing
import VigilDBus
@testable import VigilHost
import VigilKit

/// Method handlers never wait behind each other: while one call's handler
/// is blocked (a strategy method waiting on a gate the test holds), a
/// BeginBackgroundTask, its End and the reads are answered.
@Suite struct HostBusConcurrencyTests {
    @Test func beginIsAnsweredWhileAnotherHandlerIsBlocked() async throws {
        // One strategy, whose object carries the gate interface.
        try await HostBusFixture.with(strategies: "[[strategy]]\nkind = \"test-idle\"\nname = \"idle\"") { f in
            let (entered, enteredNow) = AsyncStream<Void>.makeStream()
            let (gate, open) = AsyncStream<Void>.makeStream()
            let wait = Method("org.vigil.Test.Gate", "Wait", out: Arg("done", Bool.self))
            try await f.runtime.strategyBus.bus(for: "idle").register(
                APIInterface(wait.interface, objects: VigilAPI.strategyPath("idle"), methods: [wait.declaration]), methods: [
                    wait.bind(mutating: false) { _ in
                        enteredNow.yield()
                        for await _ in gate { break }
                        return BusTuple(true)
                    },
                ])
            let blocked = Task {
                try await f.call(VigilAPI.strategyPath("idle"), "org.vigil.Test.Gate", "Wait")
            }
            // The Wait handler is running and holds its call.
            for await _ in entered { break }

            let lease = try await ClientLeaseBusTests.begin(f, budget: 60)
            #expect(lease.path.hasPrefix(VigilAPI.rootPath + "/Lease/"))
            let rows = try await f.hostCall("ListLeases")
            guard case .array(_, let items)? = rows.body.first else { throw DBusError.failed("no rows: \(rows.body)") }
            #expect(items.count == 1)
            #expect(try await f.get(lease.path, VigilAPI.leaseInterface, "Kind") == .string("client"))
            _ = try await ClientLeaseBusTests.leaseCall(f, lease.path, "End")
            lease.fd.close()

            // The blocked call was not answered meanwhile; now it is.
            open.yield()
            open.finish()
            let reply = try await blocked.value
            #expect(reply.body == [.bool(true)])
        }
    }
}
