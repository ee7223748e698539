import Foundation
import Glibc
import Testing
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

/// vigild stopping (issue 38): its services stop in the reverse of their
/// start order, so the strategies stop and their leases end while the bus is
/// still up. A client on the bus sees every strategy's `stopped` state, and
/// vigild logs no failure to publish it (it used to log `cannot publish the
/// state of strategy … on D-Bus: … Disconnected` for each strategy, having
/// closed the bus before the strategies it reports on had stopped).
extension EndToEnd {
    @Suite struct StopEndToEndTests {
        static let strategies = ["alpha", "bravo", "charlie"]

        @Test(arguments: [SIGTERM, SIGINT])
        func aStopShowsEveryStrategyStoppingBeforeTheBusCloses(signal: Int32) async throws {
            let dir = try TempDir("vigil-stop")
            let socket = dir.file("bus.sock")
            unlink(socket)
            let bus = try BusTestDaemon(listen: "unix:path=\(socket)")
            defer { bus.stop() }
            let address = "unix:path=\(socket)"
            let table = Self.strategies.map {
                """

                [[strategy]]
                name = "\($0)"
                kind = "background-task"
                budget = "1h"
                reason = "\($0) at work"
                """
            }.joined()
            let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(address)\"") + table)
            let notify = try NotifySocket(path: dir.file("notify"))
            let daemon = try Daemon(arguments: ["--config", config], environment: ["NOTIFY_SOCKET": dir.file("notify")])
            defer { daemon.signal(SIGKILL) }
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1 as ")
            // READY=1 comes once the name is owned.
            var ready = false
            for _ in 0..<10 {
                guard let message = await notify.receive() else { break }
                if message.text.contains("READY=1") { ready = true; break }
            }
            #expect(ready, "no READY=1")

            let client = try await DBusConnection.connect(to: .address(address))
            let signals = try await client.signals(matching: DBusMatchRule(
                sender: VigilAPI.busName, interface: "org.vigil.Vigil1.Host", member: "StrategyStateChanged"))
            daemon.signal(signal)
            // Each strategy's object announces `stopped` before vigild leaves the bus.
            let stopped = Task {
                var seen: Set<String> = []
                for await message in signals {
                    guard message.body.count >= 2, case .objectPath(let path) = message.body[0], case .string(let state) = message.body[1] else { continue }
                    if state == "stopped", let name = path.split(separator: "/").last { seen.insert(String(name)) }
                    if seen.count == Self.strategies.count { break }
                }
                return seen
            }
            let status = await daemon.waitForExit()
            let seen = await first(within: .seconds(10)) {
                await withTaskCancellationHandler { await stopped.value } onCancel: { stopped.cancel() }
            }
            await client.close()

            #expect(status == 0, "\(daemon.output)")
            #expect(seen == Set(Self.strategies), "StrategyStateChanged stopped seen for \(seen ?? [])")
            let output = daemon.output
            #expect(!output.contains { $0.contains("cannot publish") }, "\(output.filter { $0.contains("cannot publish") })")
            #expect(!output.contains { $0.contains("Disconnected") }, "\(output.filter { $0.contains("Disconnected") })")
            // The documented order of a stop: the signal, the strategies, the end of the run.
            let name = signal == SIGINT ? "SIGINT" : "SIGTERM"
            let received = output.firstIndex { $0.contains("received \(name)") }
            let shuttingDown = output.firstIndex { $0.contains("shutting down") }
            let ended = output.firstIndex { $0.contains("ended: stopped") }
            #expect(received != nil && shuttingDown != nil && ended != nil, "\(output)")
            if let received, let shuttingDown, let ended {
                #expect(received < shuttingDown && shuttingDown < ended, "\(output)")
            }
            // STOPPING=1 follows the signal.
            var stopping = false
            for _ in 0..<10 {
                guard let message = await notify.receive(timeout: .seconds(5)) else { break }
                if message.text.contains("STOPPING=1") { stopping = true; break }
            }
            #expect(stopping, "no STOPPING=1")
        }
    }
}
