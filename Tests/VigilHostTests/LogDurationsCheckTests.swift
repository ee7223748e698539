import Testing
import VigilTestSupport

/// The log check every end-to-end test runs at exit: it must catch a
/// duration in three units, and must not read an id as one.
@Suite struct LogDurationsCheckTests {
    @Test func aDurationInThreeUnitsIsCaught() {
        let lines = ["renewed after 3m47s257ms", "slept 814ms66us507ns"]
        #expect(durationsOverTwoUnits(in: lines) == lines)
    }

    @Test func twoUnitsPass() {
        #expect(durationsOverTwoUnits(in: ["renewed after 3m47s", "slept 814ms", "every 1h02m"]).isEmpty)
    }

    /// CI failed once on a run id whose last group was "15913d84d23d".
    @Test func idsThatLookLikeDaysPass() {
        let lines = [
            "heartbeat 1 written run=943f77a2-1fe0-41c7-9b94-15913d84d23d",
            "bus guid=15913d84d23d15913d84d23d15913d84",
            "host 1d2d3d4d5d6d7d8d9d",
        ]
        #expect(durationsOverTwoUnits(in: lines).isEmpty)
    }

    @Test func aDurationBesideAnIdIsStillCaught() {
        let line = "run=943f77a2-1fe0-41c7-9b94-15913d84d23d took 1m2s3ms"
        #expect(durationsOverTwoUnits(in: [line]) == [line])
    }
}
