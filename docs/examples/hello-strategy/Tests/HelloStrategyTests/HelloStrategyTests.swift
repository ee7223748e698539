import Testing

@Suite struct HelloStrategyTests {
    @Test func greetsEachPeriodUnderALease() async throws {
        try await HelloChecks.greetsEachPeriodUnderALease()
    }
}
