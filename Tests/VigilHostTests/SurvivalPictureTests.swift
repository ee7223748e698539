import Foundation
import FoundationXML
import Testing
import VigilDBus
import VigilTestSupport
@testable import VigilHost
@testable import VigilSurvival

/// `vigilctl survival --html/--svg`: the picture drawn from a real store,
/// parsed as XML, and rendered by headless Chromium.
@Suite("Survival picture")
struct SurvivalPictureTests {
    /// A strategy name with every XML special character.
    static let awkwardName = #"mail <&> "quoted" 'x'"#

    /// Three runs in one store, as a real host would write them:
    /// - run-killed: a lease of `focus`, a 25-minute frozen gap, then no end
    ///   (the next start in the same boot closes it as killed);
    /// - run-woken: three suspends, woken by tick's alarm, by the power
    ///   button, and by something else while mail's alarm missed its wake;
    ///   tick and mail hold leases; a clean stop;
    /// - run-running: still running; its filesystem (a 1 MiB tmpfs) fills
    ///   up for five heartbeats, which leaves a store-unwritable gap.
    static func makeStore(_ dir: String) async throws -> (picture: SurvivalPicture, lastWall: Int64) {
        let path = dir + "/survival.sqlite"
        var clocks = FakeClocks()
        let focus = HeartbeatLease(id: 1, strategy: "focus", holds: "logind", state: "active")
        do {
            let store = try SurvivalStore(path: path)
            _ = try await store.beginRun(runStart("run-killed", boot: "boot-1", at: clocks.readings))
            for beat in 1...300 {
                // Frozen for 25 minutes after 3 hours.
                try await store.heartbeat(clocks.awake(beat == 180 ? 1_500 : 60), leases: (60...240).contains(beat) ? [focus] : [])
            }
        }
        let store = try SurvivalStore(path: path)
        _ = try await store.beginRun(runStart("run-woken", boot: "boot-1", at: clocks.awake(120)))
        let tick = HeartbeatLease(id: 2, strategy: "tick", holds: "wakelock", state: "active")
        let mail = HeartbeatLease(id: 3, strategy: awkwardName, holds: "logind", state: "active")
        func suspend(_ seconds: Double, then wake: (ClockReadings) -> SystemWake) async throws {
            clocks.awake(20)
            clocks.suspend(seconds)
            let resumed = clocks.readings
            try await store.recordEvent(SystemWake.eventName, strategy: nil, fields: wake(resumed).fields, readings: resumed)
        }
        for beat in 1...600 {
            switch beat {
            case 60:
                try await suspend(7_200) {
                    SystemWake(wall: $0.wallMicros, startOffsetMicros: 0, suspendedMicros: 7_200_000_000, cause: .vigilAlarm,
                               alarm: "tick periodic-wake", alarmStrategy: "tick", alarmKind: "periodic-wake", latenessMicros: 400_000)
                }
            case 240:
                try await suspend(3_600) {
                    SystemWake(wall: $0.wallMicros, startOffsetMicros: 0, suspendedMicros: 3_600_000_000, cause: .other, kernelSource: "LNXPWRBN:00")
                }
            case 420:
                try await suspend(5_400) {
                    SystemWake(wall: $0.wallMicros, startOffsetMicros: 0, suspendedMicros: 5_400_000_000, cause: .other,
                               missedAlarm: "\(awkwardName) periodic-wake", missedByMicros: 1_800_000_000)
                }
            default: break
            }
            var leases: [HeartbeatLease] = []
            if beat % 60 < 10 && beat < 600 { leases.append(tick) }
            if (300...360).contains(beat) { leases.append(mail) }
            try await store.heartbeat(clocks.awake(beat == 60 || beat == 240 || beat == 420 ? 40 : 60), leases: leases)
        }
        try await store.endRun(reason: .stopped, readings: clocks.awake(10))
        do {
            let running = try SurvivalStore(path: path)
            _ = try await running.beginRun(runStart("run-running", boot: "boot-2", at: clocks.awake(600)))
            let filler = dir + "/filler"
            for beat in 1...90 {
                if beat == 30 { _ = try fillFilesystem(filler) }
                if beat == 35 { #expect(truncate(filler, 0) == 0) }
                do {
                    try await running.heartbeat(clocks.awake(60), leases: [focus])
                } catch {
                    #expect((30..<35).contains(beat), "heartbeat \(beat): \(error)")
                }
            }
        }
        return (try SurvivalPicture.load(path: path, runs: nil, sinceWallMicros: nil), clocks.wall)
    }

    static let utc = TimeZone(identifier: "UTC")!

    @Test func theSVGShowsLanesMarksAndTheirTitles() async throws {
        try await SurvivalStoreFullDiskTests.withTmpfs { try await Self.checkSVG($0) }
    }

    static func checkSVG(_ dir: String) async throws {
        let (picture, lastWall) = try await Self.makeStore(dir)
        #expect(picture.runs.map(\.summary.runId) == ["run-running", "run-woken", "run-killed"])
        #expect(picture.runs.map(\.summary.endReason) == [.running, .stopped, .killed])
        let svg = SurvivalPictureFormat.svg(picture, timeZone: Self.utc, nowWall: lastWall + 1_000_000)
        let document = try XMLDocument(xmlString: svg, options: [])
        let root = try #require(document.rootElement())
        #expect(root.name == "svg")
        #expect(root.namespaces?.first?.stringValue == "http://www.w3.org/2000/svg")
        let elements = Self.all(root)
        func titled(_ name: String, _ cls: String? = nil) -> [(XMLElement, String)] {
            elements.compactMap { element in
                guard element.name == name, cls == nil || Self.attribute(element, "class") == cls,
                      let title = element.elements(forName: "title").first?.stringValue else { return nil }
                return (element, title)
            }
        }

        // One lane per run, oldest at the top.
        let lanes = titled("g").filter { $0.1.hasPrefix("run ") }
        #expect(lanes.map { String($0.1.prefix(while: { $0 != "," })) } == ["run run-killed", "run run-woken", "run run-running"])
        let laneY = lanes.compactMap { $0.0.elements(forName: "rect").first.flatMap { Self.attribute($0, "y") }.flatMap(Double.init) }
        #expect(laneY == laneY.sorted() && Set(laneY).count == 3)

        // The frozen gap and the three suspends, each with its times.
        let stalls = titled("rect", "st").map(\.1)
        #expect(stalls.count == 1 && stalls[0].hasPrefix("frozen or stalled") && stalls[0].hasSuffix("(25m)"), "\(stalls)")
        let unwritable = titled("rect", "un").map(\.1)
        // How many heartbeats the full tmpfs refuses depends on free pages SQLite already holds; at least one.
        let lost = try #require(picture.runs.first).summary
        #expect(lost.unwritableGaps == 1 && lost.unwritableMicros >= 120_000_000)
        #expect(unwritable.count == 1 && unwritable[0].hasPrefix("store unwritable")
                && unwritable[0].hasSuffix("(\(SurvivalReportFormat.duration(lost.unwritableMicros)))"), "\(unwritable)")
        let suspends = titled("rect", "su").map(\.1)
        #expect(suspends.count == 3, "\(suspends)")
        #expect(suspends.contains { $0.hasSuffix("(2h)") } && suspends.contains { $0.hasSuffix("(1h)") } && suspends.contains { $0.hasSuffix("(1h30m)") })

        // Each wake a mark, coloured (classed) by cause, naming what woke it.
        let alarms = titled("circle", "wa").map(\.1)
        #expect(alarms.count == 1)
        #expect(alarms.first?.contains("Vigil alarm of tick periodic-wake, 400ms late; strategy tick (periodic-wake)") == true, "\(alarms)")
        let others = titled("path", "wo").map(\.1)
        #expect(others.count == 1 && others[0].contains("LNXPWRBN:00"), "\(others)")
        let missed = titled("path", "wm").map(\.1)
        #expect(missed.count == 1 && missed[0].contains("Vigil alarm of \(Self.awkwardName) periodic-wake was due 30m earlier"), "\(missed)")

        // How each run ended.
        let ends = titled("g").map(\.1).filter { title in ["killed ", "stopped ", "running "].contains { title.hasPrefix($0) } }
        #expect(ends.count == 3, "\(ends)")
        #expect(ends.contains { $0.hasPrefix("killed ") && $0.contains("run run-woken started in the same boot") })
        #expect(elements.contains { Self.attribute($0, "class") == "cross-killed" })

        // The strategies' held time, a lane each under their run; the
        // awkward name comes back intact from the XML.
        let held = titled("rect", "held").map(\.1)
        #expect(held.filter { $0.hasPrefix("focus (logind) held leases") }.count == 2, "\(held)")
        #expect(held.contains { $0.hasPrefix("focus (logind) held leases") && $0.hasSuffix("(3h24m; heartbeats 60–240)") }, "\(held)")
        #expect(held.filter { $0.hasPrefix("tick (wakelock)") }.count == 10)
        #expect(held.contains { $0.hasPrefix("\(Self.awkwardName) (logind) held leases") && $0.contains("heartbeats 300–360") })
        let labels = elements.filter { $0.name == "text" }.compactMap(\.stringValue)
        #expect(labels.contains(Self.awkwardName))
        #expect(labels.contains("killed") && labels.contains("stopped") && labels.contains("running"))
        #expect(!svg.contains("<script") && !svg.contains("href"))
    }

    @Test func theHTMLPageRendersInChromium() async throws {
        let dir = try SurvivalTempDir()
        var made: (picture: SurvivalPicture, lastWall: Int64)?
        try await SurvivalStoreFullDiskTests.withTmpfs { made = try await Self.makeStore($0) }
        let (picture, lastWall) = try #require(made)
        let html = SurvivalPictureFormat.html(picture, timeZone: Self.utc, nowWall: lastWall + 1_000_000)
        #expect(!html.contains("<script"))
        #expect(html.components(separatedBy: "://").count == 2, "the only URL is the SVG namespace")
        #expect(html.contains("<tr class=\"total\"><td>total: 3 runs</td>"))
        #expect(html.contains("<td>run-killed</td>") && html.contains("4h30m (3×)"))

        let artifacts = Self.artifactDirectory()
        let page = artifacts + "/survival.html"
        try html.write(toFile: page, atomically: true, encoding: .utf8)
        let png = artifacts + "/survival.png"
        try? FileManager.default.removeItem(atPath: png)
        let chromium = "/usr/bin/chromium"
        try #require(FileManager.default.isExecutableFile(atPath: chromium),
                     "headless Chromium is missing: install Debian's chromium package (Scripts/packages lists it; Scripts/test installs it)")
        // Off the cooperative pool: Chromium takes 15 to 50 s here, and on
        // two cores the pool has two threads, which every other test running
        // beside this one (and their in-process D-Bus services) needs.
        let shot = try await ProcessRunner.runDetached(chromium, [
            "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=\(dir.path)/chromium",
            "--screenshot=\(png)", "--window-size=1280,720", "file://\(page)",
        ], environment: ["PATH": "/usr/bin:/bin", "HOME": dir.path])
        try #require(FileManager.default.fileExists(atPath: png), "chromium wrote no screenshot (status \(shot.status)): \(shot.stderr.suffix(2_000))")
        print("survival picture: page \(page), screenshot \(png)")

        // Not blank: many colours, and the picture's own colours in it
        // (awake, suspended, stalled, unwritable, held, the Vigil alarm mark).
        let colours = ["a3d69b", "5b84c4", "d9413b", "f0a030", "9467bd", "14306b"]
        let decoded = try await ProcessRunner.runDetached("/usr/bin/python3", [Self.fixture("png-colours.py"), png] + colours)
        #expect(decoded.status == 0, "\(decoded.stderr)")
        struct Colours: Decodable { var width: Int; var height: Int; var distinct: Int; var pixels: [String: Int] }
        let result = try JSONDecoder().decode(Colours.self, from: Data(decoded.stdout.utf8))
        #expect(result.width == 1280 && result.height == 720)
        #expect(result.distinct > 50, "a blank page has one colour: \(result)")
        for colour in colours {
            #expect((result.pixels[colour] ?? 0) > 20, "colour #\(colour) missing from the screenshot: \(result.pixels)")
        }
    }

    /// A run of `days` days with nights of suspends: from 23:00, `perNight`
    /// cycles of 15 minutes asleep then 1 minute awake, each ended by tick's
    /// alarm, while tick holds a lease for the awake minute.
    static func nightlyRun(id: String, startWall: Int64, days: Int, perNight: Int) -> SurvivalPicture.Run {
        let minute: Int64 = 60_000_000
        var timeline: [TimelineSegment] = []
        var wakes: [SystemWake] = []
        var spans: [HeldSpan] = []
        var cursor: Int64 = 0
        for day in 0..<days {
            var at = Int64(day) * 1_440 * minute + 23 * 60 * minute
            timeline.append(TimelineSegment(kind: .awake, startOffsetMicros: cursor, durationMicros: at - cursor, startWall: startWall + cursor))
            for _ in 0..<perNight {
                timeline.append(TimelineSegment(kind: .suspended, startOffsetMicros: at, durationMicros: 15 * minute, startWall: startWall + at))
                at += 15 * minute
                wakes.append(SystemWake(wall: startWall + at, startOffsetMicros: at, suspendedMicros: 15 * minute, cause: .vigilAlarm,
                                        alarm: "tick periodic-wake", alarmStrategy: "tick", alarmKind: "periodic-wake", latenessMicros: 200_000))
                spans.append(HeldSpan(startOffsetMicros: at, durationMicros: minute, firstSeq: spans.count * 2, lastSeq: spans.count * 2 + 1))
                timeline.append(TimelineSegment(kind: .awake, startOffsetMicros: at, durationMicros: minute, startWall: startWall + at))
                at += minute
            }
            cursor = at
        }
        let alive = cursor + 60 * minute
        timeline.append(TimelineSegment(kind: .awake, startOffsetMicros: cursor, durationMicros: alive - cursor, startWall: startWall + cursor))
        let suspended = Int64(wakes.count) * 15 * minute
        let summary = RunSummary(
            runId: id, pid: 1, bootId: "boot", version: "test", configPath: "/etc/vigil/vigil.toml", intervalMicros: minute,
            startWall: startWall, endWall: startWall + alive, lastHeartbeatWall: startWall + alive, endReason: .stopped, endNote: nil,
            aliveMicros: alive, awakeMicros: alive - suspended, suspendedMicros: suspended, suspends: wakes.count,
            heartbeats: Int(alive / minute), stalls: 0, stalledMicros: 0, longestStallMicros: 0, events: wakes.count,
            timeline: timeline, wakes: wakes)
        return SurvivalPicture.Run(summary: summary, strategies: [StrategyHeld(strategy: "tick", holds: ["wakelock"], spans: spans)])
    }

    /// 2025-01-01 00:00 UTC.
    static let newYear: Int64 = 1_735_689_600_000_000

    @Test func aWeekOfMinuteHeartbeatsIsDrawnAsItHappened() throws {
        let picture = SurvivalPicture(runs: [Self.nightlyRun(id: "week", startWall: Self.newYear, days: 7, perNight: 30)])
        #expect(SurvivalPictureLayout(picture, timeZone: Self.utc).resolution == .exact)
        let svg = SurvivalPictureFormat.svg(picture, timeZone: Self.utc, nowWall: Self.newYear)
        let root = try #require(try XMLDocument(xmlString: svg, options: []).rootElement())
        let elements = Self.all(root)
        #expect(elements.filter { Self.attribute($0, "class") == "su" && $0.name == "rect" }.count == 7 * 30 + 1, "every suspend, and the legend's swatch")
        #expect(elements.filter { Self.attribute($0, "class") == "wa" }.count == 7 * 30 + 1)
        #expect(elements.filter { Self.attribute($0, "class") == "held" }.count == 7 * 30 + 1)
    }

    /// A year in 12 runs, 30 suspends and wakes a night (10,950): one
    /// column a day, each day's wakes one mark, the file well under 2 MB.
    @Test func aYearIsDrawnOneColumnADay() throws {
        let month: Int64 = 30 * 86_400_000_000
        let runs = (0..<12).map { Self.nightlyRun(id: "month-\($0)", startWall: Self.newYear + Int64($0) * (month + 60_000_000), days: 30, perNight: 30) }
        let picture = SurvivalPicture(runs: runs.reversed())
        let layout = SurvivalPictureLayout(picture, timeZone: Self.utc)
        #expect(layout.resolution == .columns(86_400_000_000))
        #expect(layout.startWall == Self.newYear, "columns start at local midnight")
        let html = SurvivalPictureFormat.html(picture, timeZone: Self.utc, nowWall: Self.newYear)
        #expect(html.utf8.count < 2 * 1_048_576, "\(html.utf8.count) bytes")
        let svg = SurvivalPictureFormat.svg(picture, timeZone: Self.utc, nowWall: Self.newYear)
        let root = try #require(try XMLDocument(xmlString: svg, options: []).rootElement())
        let titles = Self.all(root).filter { $0.name == "title" }.compactMap(\.stringValue)
        // 12 × 30 nights, each a column with a suspended share, a wake mark and a held column.
        #expect(titles.filter { $0.contains(": awake ") && $0.hasSuffix("suspended 7h30m") }.count >= 12 * 29, "every whole day has 30 × 15 minutes asleep")
        #expect(titles.filter { $0.hasSuffix("30 wakes by Vigil alarms (tick 30)") }.count >= 12 * 29)
        #expect(titles.contains { $0.hasPrefix("tick (wakelock) held leases 30m of 2025-01-02 (") })
    }

    @Test func sinceStartsTheAxisAndCutsEarlierRuns() throws {
        let run = Self.nightlyRun(id: "long", startWall: Self.newYear, days: 40, perNight: 4)
        let since = Self.newYear + 36 * 86_400_000_000
        let picture = SurvivalPicture(runs: [run], sinceWallMicros: since)
        let layout = SurvivalPictureLayout(picture, timeZone: Self.utc)
        #expect(layout.resolution == .exact, "four days shown, though the run is 40 days long")
        #expect(layout.startWall <= since && layout.startWall > since - 3_600_000_000)
        let svg = SurvivalPictureFormat.svg(picture, timeZone: Self.utc, nowWall: Self.newYear)
        #expect(svg.contains(#"<g clip-path="url(#plot)">"#))
        #expect(try SurvivalSince.wallMicros("7d", nowWall: since, timeZone: Self.utc) == since - 7 * 86_400_000_000)
        #expect(try SurvivalSince.wallMicros("2025-02-06", nowWall: 0, timeZone: Self.utc) == since)
        #expect(try SurvivalSince.wallMicros("2025-02-06 01:30", nowWall: 0, timeZone: Self.utc) == since + 5_400_000_000)
        #expect(throws: SurvivalSince.Invalid.self) { try SurvivalSince.wallMicros("last tuesday", nowWall: 0, timeZone: Self.utc) }
        #expect(throws: SurvivalSince.Invalid.self) { try SurvivalSince.wallMicros("7x", nowWall: 0, timeZone: Self.utc) }
        #expect(try SurvivalSince.wallMicros("2025-2-6T01:30:15", nowWall: 0, timeZone: Self.utc) == since + 5_415_000_000)
        #expect(try SurvivalSince.wallMicros(" 2024-02-29 ", nowWall: 0, timeZone: Self.utc) == since - 343 * 86_400_000_000)
        #expect(try SurvivalSince.wallMicros("2025-02-06", nowWall: 0, timeZone: TimeZone(secondsFromGMT: 3600) ?? Self.utc) == since - 3_600_000_000)
        // Non-ASCII in a date stopped vigilctl inside DateFormatter.
        for bad in ["2026-11-2\u{07B0} 09:00", "2026-\u{07B0}-21", "2025-02-29", "2025-13-01", "2025-02-06 24:00",
                    "2025-02-06 01:60", "2025-02-06 01:30:60", "2025-02-06 01", "2025-02-06T", "25-02-06", "2025-02-06 01:30x"] {
            #expect(throws: SurvivalSince.Invalid.self, "\(bad)") { try SurvivalSince.wallMicros(bad, nowWall: 0, timeZone: Self.utc) }
        }
    }

    @Test func outsideStringsCannotBreakTheDocument() throws {
        #expect(XMLText.escaped("a<b>&\"c'\u{1}\u{FFFE}\t") == "a&lt;b&gt;&amp;&quot;c&apos;\u{FFFD}\u{FFFD}\t")
        var run = Self.nightlyRun(id: "</svg><script>alert(1)</script>\u{7}", startWall: Self.newYear, days: 1, perNight: 1)
        run.strategies[0].strategy = "]]><!-- \u{0}"
        run.summary.endNote = "<b>"
        let svg = SurvivalPictureFormat.svg(SurvivalPicture(runs: [run]), timeZone: Self.utc, nowWall: Self.newYear)
        #expect(!svg.contains("<script>") && !svg.contains("<!--"))
        let root = try #require(try XMLDocument(xmlString: svg, options: []).rootElement())
        #expect(Self.all(root).filter { $0.name == "text" }.compactMap(\.stringValue).contains("]]><!-- \u{FFFD}"))
    }

    // MARK: helpers

    static func all(_ element: XMLElement) -> [XMLElement] {
        [element] + (element.children ?? []).compactMap { $0 as? XMLElement }.flatMap(all)
    }

    /// An attribute's value (FoundationXML's `attribute(forName:)` finds
    /// nothing in a document with a default namespace).
    static func attribute(_ element: XMLElement, _ name: String) -> String? {
        element.attributes?.first { $0.name == name }?.stringValue
    }

    static func fixture(_ name: String) -> String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/\(name)").path
    }

    /// `.build/test-artifacts/survival-picture` in the package: kept after
    /// the test, so a person (or docs/images/survival.png) can use it.
    static func artifactDirectory() -> String {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent(".build/test-artifacts/survival-picture").path
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }
}
