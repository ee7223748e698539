import Testing
import VigilKit

@Test func parsesDurations() throws {
    #expect(try DurationSyntax.parse("90s").get() == .seconds(90))
    #expect(try DurationSyntax.parse("25m").get() == .seconds(1500))
    #expect(try DurationSyntax.parse("1h30m").get() == .seconds(5400))
    #expect(try DurationSyntax.parse("250ms").get() == .milliseconds(250))
    #expect(try DurationSyntax.parse("1.5s").get() == .milliseconds(1500))
    #expect(DurationSyntax.format(.seconds(5400)) == "1h30m")
}

/// The issue's examples: at most two units, rounded, and read back by `parse`.
@Test func formatsDurationsForPeople() throws {
    let ns: (Int64) -> Duration = { .nanoseconds($0) }
    #expect(DurationSyntax.human(ns(227_257_001_272)) == "3m47s")
    #expect(DurationSyntax.human(ns(814_066_507)) == "814ms")
    #expect(DurationSyntax.human(.seconds(3_720)) == "1h02m")
    #expect(DurationSyntax.human(.seconds(3_600)) == "1h")
    #expect(DurationSyntax.human(.seconds(2 * 86_400 + 5 * 3_600 + 59)) == "2d05h")
    #expect(DurationSyntax.human(.milliseconds(59_600)) == "1m")
    #expect(DurationSyntax.human(.milliseconds(1_540)) == "1.5s")
    #expect(DurationSyntax.human(.seconds(20)) == "20s")
    #expect(DurationSyntax.human(.microseconds(66)) == "66us")
    #expect(DurationSyntax.human(.zero) == "0s")
    #expect(Duration.seconds(110).vigilDescription == "1m50s")
    for text in ["3m47s", "814ms", "1h02m", "1.5s", "66us"] {
        #expect(DurationSyntax.human(try DurationSyntax.parse(text).get()) == text)
    }
}

@Test func rejectsBadDurations() {
    for bad in ["-5s", "", "5", "5x", "h", "1h30", "abc"] {
        if case .success(let d) = DurationSyntax.parse(bad) { Issue.record("\"\(bad)\" parsed as \(d)") }
    }
}

@Test func parsesByteSizes() throws {
    #expect(try ByteSizeSyntax.parse("64KiB").get() == 65536)
    #expect(try ByteSizeSyntax.parse("10MB").get() == 10_000_000)
    #expect(try ByteSizeSyntax.parse("4096").get() == 4096)
    if case .success = ByteSizeSyntax.parse("-1k") { Issue.record("negative size accepted") }
    if case .success = ByteSizeSyntax.parse("12 parsecs") { Issue.record("nonsense accepted") }
}

@Test func suggestsSpellings() {
    #expect(Spelling.suggestion(for: "evrey", among: ["every", "tolerance", "align"]) == "every")
    #expect(Spelling.suggestion(for: "periodic-wak", among: ["periodic-wake", "silent-audio"]) == "periodic-wake")
    #expect(Spelling.suggestion(for: "zzzz", among: ["every"]) == nil)
}

@Test func readerCollectsEveryProblem() {
    let reader = ConfigReader(
        strategyName: "s", keyPath: "strategy[0]",
        values: ["every": .string("-3m"), "run": .array([]), "align": .integer(3)],
        locations: ["every": ConfigLocation(file: "f.toml", line: 4, column: 1)]
    )
    _ = reader.requirePositiveDuration("every")
    _ = reader.argv("run")
    _ = reader.bool("align")
    _ = reader.requireString("target")
    #expect(reader.problems.count == 4)
    #expect(reader.problems[0].description.hasPrefix("f.toml:4:1: strategy[0].every: expected a non-negative duration"))
    #expect(reader.consultedKeys == ["every", "run", "align", "target"])
}

@Test func backoffStaysWithinBounds() {
    let b = Backoff(initial: .milliseconds(100), maximum: .seconds(2))
    #expect(b.ceiling(attempt: 0) == .milliseconds(100))
    #expect(b.ceiling(attempt: 3) == .milliseconds(800))
    #expect(b.ceiling(attempt: 30) == .seconds(2))
    for n in 0..<20 {
        let d = b.delay(attempt: n)
        #expect(d >= .zero && d <= b.ceiling(attempt: n))
    }
}
