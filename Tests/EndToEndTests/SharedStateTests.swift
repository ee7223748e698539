import Foundation
import Testing
import VigilTestSupport

/// One way to share state (issue 46; docs/architecture.md, "Concurrency"):
/// in the Swift sources no lock but actors and `Lock<T>`, and every
/// unstructured task says who cancels it, as Scripts/check-shared-state
/// checks.
extension EndToEnd {
    @Suite struct SharedStateTests {
        static var check: String { Build.packageRoot.appendingPathComponent("Scripts/check-shared-state").path }

        @Test func oneWayToShareStateInTheSources() throws {
            let check = try ProcessRunner.run(Self.check, [Build.packageRoot.path])
            #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
            #expect(check.stdout.contains("one way to share state"), "\(check.stdout)")
        }

        /// The check finds what it is for: another lock, and a task that
        /// does not say who cancels it (the marked one passes).
        @Test func theCheckNamesAnotherLockAndAnUnmarkedTask() throws {
            let dir = try TempDir("vigil-shared-state")
            try FileManager.default.createDirectory(atPath: dir.file("Sources/Example"), withIntermediateDirectories: true)
            // Spelled in two pieces, so that this file passes the check.
            let other = "NS" + "Lock"
            _ = try dir.write("Sources/Example/Example.swift", """
                import Foundation
                let lock = \(other)()
                func start() {
                    Task { await work() }
                    // Unstructured task: not cancelled: it ends by itself.
                    Task { await work() }
                }
                func work() async {}

                """)
            let check = try ProcessRunner.run(Self.check, [dir.path])
            #expect(check.status == 1, "\(check.stdout)\(check.stderr)")
            #expect(check.stderr.contains("Sources/Example/Example.swift:2:let lock = \(other)()"), "\(check.stderr)")
            #expect(check.stderr.contains("Sources/Example/Example.swift:4:"), "\(check.stderr)")
            #expect(!check.stderr.contains("Sources/Example/Example.swift:6:"), "\(check.stderr)")
        }
    }
}
