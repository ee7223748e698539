import Foundation
import Testing
import VigilHost
import VigilKit

/// `network = "online"` from rtnetlink, inside a network namespace the test
/// makes: its only link is a veth pair (this kernel has no dummy links),
/// with an address on one end.
@Suite struct ConditionNetworkTests {
    /// A network namespace deleted when the value goes away.
    final class Namespace: @unchecked Sendable {
        // Invariant: `name` never changes.
        let name = "vigil-cond-" + String(UUID().uuidString.prefix(8)).lowercased()
        var path: String { "/run/netns/" + name }

        init() throws {
            try ip(["netns", "add", name])
        }

        deinit { _ = try? Self.run(["netns", "del", name]) }

        func ip(_ arguments: [String]) throws {
            let out = try Self.run(arguments)
            guard out.status == 0 else { throw DescribedError("ip \(arguments.joined(separator: " ")): \(out.stderr)") }
        }

        /// `ip -n <this namespace> ...`
        func inside(_ arguments: [String]) throws { try ip(["-n", name] + arguments) }

        static func run(_ arguments: [String]) throws -> ToolOutput {
            try runTool("/usr/sbin/ip", arguments, environment: ["PATH": "/usr/sbin:/usr/bin:/bin"])
        }
    }

    @Test func takingTheOnlyLinkDownStopsAnOnlineStrategyAndUpStartsIt() async throws {
        let ns = try Namespace()
        try ns.inside(["link", "add", "v0", "type", "veth", "peer", "name", "v1"])
        try ns.inside(["addr", "add", "10.99.0.1/24", "dev", "v0"])
        try ns.inside(["link", "set", "v1", "up"])

        let host = try GatedSupervisor(settings: ConditionMonitor.Settings(networkNamespace: ns.path))
        let status = await host.start("sync", StrategyConditions(tables: [[.network(.online)]]))
        let waiting = try await status.next(.waiting)
        #expect(waiting.waitingFor == "network = \"online\"")

        try ns.inside(["link", "set", "v0", "up"])
        try await status.next(.running)
        try ns.inside(["link", "set", "v0", "down"])
        try await status.next(.waiting)
        #expect(await host.activeLeases(of: "sync") == 0)
        try ns.inside(["link", "set", "v0", "up"])
        try await status.next(.running)
        await host.stop()
    }
}
