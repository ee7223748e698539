import Foundation
import Glibc
import Testing

/// Per-uid limits hold however calls interleave (issue 35): each limit is
/// reserved before vigild's first suspension point, so calls that arrive
/// together, on one connection or on hundreds, are granted exactly the
/// limit, and each refusal states the true count. The calls come from
/// jeepney as uid 65534 (Tests/Fixtures/limit-burst.py).
extension EndToEnd {
    @Suite struct LimitsEndToEndTests {
        static let burst = Build.packageRoot.appendingPathComponent("Tests/Fixtures/limit-burst.py").path

        /// Runs limit-burst.py as uid 65534; returns how many were granted and the distinct errors.
        static func burst(_ host: InhibitEndToEndTests.Host, _ arguments: [String]) throws -> (granted: Int, errors: [String]) {
            let result = try asNobody("/usr/bin/python3", [burst, host.bus.address] + arguments)
            try #require(result.status == 0, "\(result.stderr)")
            let lines = result.stdout.split(separator: "\n").map(String.init)
            let granted = try #require(lines.first.flatMap { $0.hasPrefix("granted ") ? Int($0.dropFirst(8)) : nil }, "\(result.stdout)")
            return (granted, Array(lines.dropFirst()))
        }

        @Test(arguments: [200, 700])
        func inhibitsInOneWriteGrantExactlyTheLimit(calls: Int) async throws {
            // The bus would refuse calls beyond 128 awaiting replies on one connection itself.
            let host = try await InhibitEndToEndTests.Host(busLimits: #"<limit name="max_replies_per_connection">1000</limit>"#)
            let (granted, errors) = try Self.burst(host, ["inhibit", String(calls)])
            #expect(granted == 64, "\(errors)")
            #expect(!errors.isEmpty && errors.allSatisfy {
                $0.hasPrefix("error org.freedesktop.DBus.Error.LimitsExceeded uid 65534 already holds 64 inhibits")
            }, "\(errors)")
            await host.stop()
        }

        @Test func fiveHundredConnectionsOfOneUIDGetExactlyTheLeaseLimit() async throws {
            let host = try await InhibitEndToEndTests.Host(
                extra: "client_max_leases_per_uid = 16",
                busLimits: #"<limit name="max_connections_per_user">2000</limit><limit name="max_completed_connections">4000</limit>"#)
            let (granted, errors) = try Self.burst(host, ["begin", "500", "60000000"])
            #expect(granted == 16, "\(errors)")
            #expect(!errors.isEmpty && errors.allSatisfy {
                $0.hasPrefix("error org.freedesktop.DBus.Error.LimitsExceeded uid 65534 already holds 16 client leases")
            }, "\(errors)")
            await host.stop()
        }

        @Test func concurrentBeginsNeverGrantMoreThanTheBudgetCap() async throws {
            let host = try await InhibitEndToEndTests.Host(extra: "client_max_budget_per_uid = \"4h\"")
            let (granted, errors) = try Self.burst(host, ["begin", "60", "3600000000"])
            #expect(granted == 4, "\(errors)")
            #expect(!errors.isEmpty && errors.allSatisfy {
                $0.hasPrefix("error org.freedesktop.DBus.Error.LimitsExceeded a budget of 1h would bring uid 65534's client leases to 5h")
                    && $0.contains("; 4h is granted now")
            }, "\(errors)")
            await host.stop()
        }
    }
}
