import Foundation
import Testing
import VigilHost

/// StartupPages.release in this test process: resident code pages leave,
/// and the code and read-only data they held work again when touched.
@Suite struct StartupPagesMemoryTests {
    @Test func releaseDropsResidentCodeAndCodeStillRuns() throws {
        // Touch Foundation code and read-only data first.
        let before = try JSONEncoder().encode(["probe": [1, 2, 3]])
        let report = StartupPages.release()
        #expect(report.failures == 0)
        // The test binary, the Swift runtime, Foundation, libc at least.
        #expect(report.objects >= 4, "\(report)")
        #expect(report.residentBeforeKiB > 0)
        // A test process has many MB of code resident; most of it goes.
        #expect(report.releasedKiB >= 2048, "\(report)")
        // Code and constants fault back in unchanged.
        let after = try JSONEncoder().encode(["probe": [1, 2, 3]])
        #expect(before == after)
        #expect(String(decoding: after, as: UTF8.self) == #"{"probe":[1,2,3]}"#)
    }
}
