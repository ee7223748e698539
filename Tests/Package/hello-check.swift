// Runs the example plugin's test (docs/examples/hello-strategy/Tests) where
// there is no test framework: in the package test's Debian root, built
// against the installed SDK and its test kit (Tests/Package/run).
import Foundation

@main struct HelloCheck {
    static func main() async {
        do {
            try await HelloChecks.greetsEachPeriodUnderALease()
            print("hello-strategy test: OK")
        } catch {
            print("hello-strategy test: FAIL: \(error)")
            exit(1)
        }
    }
}
