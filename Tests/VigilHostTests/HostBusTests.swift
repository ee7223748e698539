import Foundation
import Testing
import VigilDBus
@testable import VigilHost
import VigilKit
import VigilKitTesting

private let root = VigilAPI.rootPath
private func lease(_ id: UInt64) -> String { VigilAPI.leasePath(LeaseID(id)) }
private func strategy(_ name: String) -> String { VigilAPI.strategyPath(name) }

private func paths(_ value: BusValue?) -> [String] {
    guard case .array("o", let items)? = value else { return ["not an ao: \(String(describing: value))"] }
    return items.compactMap { if case .objectPath(let p) = $0 { p } else { nil } }
}

@Suite struct HostBusUnitTests {
    @Test func strategyNamesAreEscapedLikeSystemdUnitPaths() throws {
        #expect(VigilAPI.escapePathElement("mail-sync") == "mail_2dsync")
        #expect(VigilAPI.escapePathElement("") == "_")
        #expect(VigilAPI.escapePathElement("Sync2") == "Sync2")
        #expect(VigilAPI.escapePathElement("a_b") == "a_5fb")
        #expect(VigilAPI.escapePathElement("a b/c.d") == "a_20b_2fc_2ed")
        #expect(VigilAPI.escapePathElement("ä") == "_c3_a4")
        #expect(VigilAPI.strategyPath("mail-sync") == "/org/vigil/Vigil1/Strategy/mail_2dsync")
        #expect(VigilAPI.leasePath(LeaseID(42)) == "/org/vigil/Vigil1/Lease/42")
        for name in ["mail-sync", "", "_", "a_5fb", "ä ö", "x/y", "..", "\u{1F600}"] {
            let element = VigilAPI.escapePathElement(name)
            #expect(DBusObjectPath.isValid(VigilAPI.strategyPath(name)), "\(name)")
            #expect(VigilAPI.unescapePathElement(element) == name, "\(name) -> \(element)")
            #expect(VigilAPI.strategyName(path: VigilAPI.strategyPath(name)) == name, "\(name)")
        }
        // Only a strategy's own object: not a child below it, nor a lease.
        #expect(VigilAPI.strategyName(path: VigilAPI.strategyPath("dl") + "/Download/1") == nil)
        #expect(VigilAPI.strategyName(path: VigilAPI.leasePath(LeaseID(1))) == nil)
        #expect(VigilAPI.strategyName(path: "/org/vigil/Vigil1/Strategy/a_zz") == nil)
        #expect(VigilAPI.unescapePathElement("a_2") == nil)
        #expect(VigilAPI.unescapePathElement("a_zz") == nil)
        #expect(VigilAPI.unescapePathElement("a-b") == nil)
    }

    @Test func mutatingMethodsAreForRootAndTheHostUser() {
        #expect(HostBusAPI.mayMutate(callerUID: 0, hostUID: 1000))
        #expect(HostBusAPI.mayMutate(callerUID: 1000, hostUID: 1000))
        #expect(!HostBusAPI.mayMutate(callerUID: 1001, hostUID: 1000))
        #expect(!HostBusAPI.mayMutate(callerUID: 65534, hostUID: 0))
        do {
            try HostBusAPI.requireMayMutate(callerUID: 1001, hostUID: 1000, method: "org.vigil.Vigil1.Host.Reload")
            Issue.record("uid 1001 must be refused")
        } catch {
            #expect(error.name == DBusError.Name.accessDenied)
            #expect(error.message.contains("uid 1000") && error.message.contains("uid 1001") && error.message.contains("Reload"))
        }
    }

    @Test func configTablesBecomeVariants() {
        let value = HostBusValues.configTable([
            "name": .string("x"), "count": .integer(-3), "ratio": .float(0.5), "on": .boolean(true),
            "at": .datetime("1979-05-27T07:32:00Z"), "mixed": .array([.integer(1), .string("two")]),
            "nested": .table(["every": .string("10m")]),
        ]).busValue
        #expect(value.signature == "a{sv}")
        #expect(throws: Never.self) { try value.validate() }
        guard case .dict(_, _, let entries) = value else { Issue.record("not a dict"); return }
        var map: [String: BusValue] = [:]
        for e in entries { if case .string(let k) = e.key, case .variant(let v) = e.value { map[k] = v } }
        #expect(map["name"] == .string("x"))
        #expect(map["count"] == .int64(-3))
        #expect(map["ratio"] == .double(0.5))
        #expect(map["on"] == .bool(true))
        #expect(map["at"] == .string("1979-05-27T07:32:00Z"))
        #expect(map["mixed"] == .array(elementSignature: "v", [.variant(.int64(1)), .variant(.string("two"))]))
        #expect(map["nested"] == .dict(keySignature: "s", valueSignature: "v", [BusDictEntry(key: .string("every"), value: .variant(.string("10m")))]))
    }

    @Test func introspectionDocumentIsWellFormedAndMatchesTheDocs() async throws {
        let xml = HostBusAPI.introspectionXML()
        #expect(xml.hasPrefix("<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"\n \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">\n"))
        let file = NSTemporaryDirectory() + "vigil-introspection-\(UUID().uuidString).xml"
        try xml.write(toFile: file, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: file) }
        let parsed = try await ProcessRunner.runDetached("/usr/bin/python3", ["-c", """
            import sys, xml.etree.ElementTree as ET
            root = ET.parse(sys.argv[1]).getroot()
            assert root.tag == 'node', root.tag
            for i in root.findall('interface'):
                print(i.get('name'), len(i.findall('method')), len(i.findall('signal')), len(i.findall('property')))
            """, file])
        #expect(parsed.status == 0, "\(parsed.stderr)")
        #expect(parsed.stdout.contains("org.vigil.Vigil1.Host 9 7 14\n"))
        #expect(parsed.stdout.contains("org.vigil.Vigil1.Strategy 0 0 15\n"))
        #expect(parsed.stdout.contains("org.vigil.Vigil1.Lease 0 0 10\n"))
        #expect(parsed.stdout.contains("org.vigil.Vigil1.ClientLease 2 2 4\n"))
        #expect(parsed.stdout.contains("org.freedesktop.DBus.ObjectManager 1 2 0\n"))
        #expect(parsed.stdout.contains("org.vigil.Vigil1.DownloadSession 4 0 0\n"))
        #expect(parsed.stdout.contains("org.vigil.Vigil1.Download 0 0 9\n"))
        let docs = try String(contentsOfFile: Build.packageRoot + "/docs/org.vigil.Vigil1.xml", encoding: .utf8)
        #expect(docs == xml, "docs/org.vigil.Vigil1.xml is stale: regenerate it with `vigild --print-introspection > docs/org.vigil.Vigil1.xml`")
    }
}

private enum Build {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
}

@Suite(.serialized) struct HostBusTests {
    static let script = """
        [[strategy]]
        name = "lease-script"
        kind = "test-script"
        """

    @Test func leaseSignalsArriveInTheDocumentedOrder() async throws {
        try await HostBusFixture.with(strategies: Self.script) { f in
            let signals = try await f.record()
            let wall0 = f.clock.wallMicroseconds
            // Before the strategy acts: only its object (and the root).
            let managed = try await f.call(root, VigilAPI.objectManagerInterface, "GetManagedObjects")
            let objects = try managed.argument(0, as: [DBusObjectPath: [String: [String: DBusVariant]]].self)
            #expect(objects.keys.map(\.rawValue) == [strategy("lease-script")])

            await f.advance(1)
            // The root's Leases is announced at most once a second: at the
            // first lease at once, for the next two once the second is over.
            var seen = await signals.wait(for: 7)
            #expect(signals.descriptions() == [
                "InterfacesAdded \(lease(1))", "PropertiesChanged \(root) Leases", "LeaseAcquired \(lease(1)) \"lease-script\" \"a\"",
                "InterfacesAdded \(lease(2))", "LeaseAcquired \(lease(2)) \"lease-script\" \"b\"",
                "InterfacesAdded \(lease(3))", "LeaseAcquired \(lease(3)) \"lease-script\" \"c\"",
            ])
            #expect(paths(seen[safe: 1]?.changedProperties["Leases"]) == [lease(1)])
            // InterfacesAdded carries the lease's properties.
            if case .dict(_, _, let interfaces)? = seen.first?.body.last,
               case .dict(_, _, let properties)? = interfaces.first?.value {
                let names = properties.compactMap { if case .string(let n) = $0.key { n } else { nil } }
                #expect(names == ["Id", "Strategy", "Kind", "Holds", "Reason", "AcquiredAt", "Deadline", "Renewals", "State", "Status"])
            } else {
                Issue.record("InterfacesAdded without properties: \(String(describing: seen.first))")
            }

            await f.advance(2)  // the second ends (Leases with all three), then a is renewed
            seen = await signals.wait(for: 10)
            #expect(signals.descriptions(from: 7) == [
                "PropertiesChanged \(root) Leases",
                "PropertiesChanged \(lease(1)) Deadline,Renewals",
                "LeaseRenewed \(lease(1)) \(UInt64(wall0 + 13_000_000))",
            ])
            #expect(paths(seen[safe: 7]?.changedProperties["Leases"]) == [lease(1), lease(2), lease(3)])
            #expect(seen[safe: 8]?.changedProperties["Renewals"] == .uint32(1))

            await f.advance(3)  // b's 5 s budget runs out; its handler returns at once
            seen = await signals.wait(for: 16)
            #expect(signals.descriptions(from: 10) == [
                "PropertiesChanged \(lease(2)) State", "LeaseExpiring \(lease(2)) 2000000",
                "PropertiesChanged \(lease(2)) State", "LeaseExpired \(lease(2)) false",
                "InterfacesRemoved \(lease(2))", "PropertiesChanged \(root) Leases",
            ])
            #expect(seen[safe: 10]?.changedProperties["State"] == .string("expiring"))
            #expect(seen[safe: 12]?.changedProperties["State"] == .string("expired"))
            #expect(paths(seen[safe: 15]?.changedProperties["Leases"]) == [lease(1), lease(3)])

            await f.advance(3)  // c is released
            seen = await signals.wait(for: 20)
            #expect(signals.descriptions(from: 16) == [
                "PropertiesChanged \(lease(3)) State", "LeaseReleased \(lease(3)) \"released by holder\"",
                "InterfacesRemoved \(lease(3))", "PropertiesChanged \(root) Leases",
            ])
            #expect(seen[safe: 16]?.changedProperties["State"] == .string("released"))
            #expect(paths(seen[safe: 19]?.changedProperties["Leases"]) == [lease(1)])
            // Every signal came from the objects the contract names.
            #expect(seen.allSatisfy { $0.path == root || $0.path.hasPrefix(root + "/Lease/") })
            #expect(paths(try await f.get(root, VigilAPI.hostInterface, "Leases")) == [lease(1)])
        }
    }

    /// A lease's status is readable at once and announced at most once a
    /// second: three changes at one instant give one PropertiesChanged now
    /// and one at the end of the second, carrying the last of them.
    @Test func leaseStatusIsShownAndAnnouncedAtABoundedRate() async throws {
        let config = """
            [[strategy]]
            name = "status"
            kind = "test-status"
            """
        try await HostBusFixture.with(strategies: config) { f in
            let signals = try await f.record()
            await f.advance(1)
            var seen = await signals.wait(for: 4)
            #expect(signals.descriptions() == [
                "InterfacesAdded \(lease(1))", "PropertiesChanged \(root) Leases", "LeaseAcquired \(lease(1)) \"status\" \"stream\"",
                "PropertiesChanged \(lease(1)) Status",
            ])
            let first = seen[safe: 3]?.changedProperties["Status"]
            #expect(first == HostBusValues.status(["State": .string("up"), "Count": .uint(1), "Level": .double(-0.5),
                                                   "Delta": .int(-2), "Ok": .bool(true)]).busValue)
            // Reads see the newest status before it is announced.
            let latest = HostBusValues.status(["State": .string("up"), "Count": .uint(3), "Level": .double(-0.5),
                                               "Delta": .int(-2), "Ok": .bool(true)]).busValue
            #expect(try await f.get(lease(1), VigilAPI.leaseInterface, "Status") == latest)
            #expect(latest.signature == "a{sv}")

            await f.advance(1)
            seen = await signals.wait(for: 5)
            #expect(signals.descriptions(from: 4) == ["PropertiesChanged \(lease(1)) Status"])
            #expect(seen[safe: 4]?.changedProperties["Status"] == latest)

            await f.advance(1)
            seen = await signals.wait(for: 6)
            #expect(seen[safe: 5]?.changedProperties["Status"] == HostBusValues.status(["State": .string("down"), "Count": .uint(4)]).busValue)
            #expect(signals.descriptions().count == 6)
        }
    }

    /// Statuses that change in a burst on many leases (as 10,000
    /// voip-socket leases change with each ping) cost the bus a bounded
    /// number of signals: at most the host's budget at once (20), then a
    /// quarter of it each quarter second, each lease at most once a second,
    /// each announcement with the status of its moment; a watcher ends with
    /// the newest status of every lease, and reads it. Five statuses on 30
    /// leases are 150 changes: per change (or per lease and second, without
    /// the host's budget), the first flush alone would be 30 signals.
    @Test func aBurstOfStatusesIsAnnouncedWithinTheHostsBudgetEndingWithTheNewest() async throws {
        #expect(PropertiesChangedLimiter.defaultAnnouncementsPerSecond == 20)
        try await HostBusFixture.with(strategies: "") { f in
            let registry = f.runtime.registry
            let signals = try await f.record()
            var ids: [LeaseID] = []
            for i in 0..<30 {
                ids.append(try await registry.acquire(strategy: "burst", LeaseRequest(holds: "h\(i)", reason: "burst")))
            }
            let paths = Set(ids.map { VigilAPI.leasePath($0) })
            _ = await signals.wait { $0.filter { $0.member == "LeaseAcquired" }.count == 30 }
            for count in UInt64(1)...5 {
                await registry.setStatuses(ids.map { (lease: $0, status: ["Count": .uint(count)]) })
            }
            @Sendable func statuses(_ seen: [SeenSignal]) -> [SeenSignal] { seen.filter { $0.changedProperties["Status"] != nil } }
            // Each flush is one batch, and the next waits for the clock, so
            // the count is exact once reached: 20 at once (the first
            // statuses), 5 a quarter second for the 10 left; at 0.75 s
            // nothing is due (the 20 announced at 0 s wait until 1 s), then
            // half a second's budget (10) and 5 and 5 for their newest.
            for (step, expected) in [(0, 20), (1, 25), (2, 30), (3, 30), (4, 40), (5, 45), (6, 50)] {
                if step > 0 { await f.clock.advance(by: .milliseconds(250)) }
                guard expected > statuses(signals.all).count || step == 0 else { continue }
                _ = await signals.wait { statuses($0).count >= expected }
                #expect(statuses(signals.all).count == expected, "after \(step * 250) ms")
            }
            let seen = statuses(signals.all)
            #expect(Set(seen.map(\.path)) == paths)
            let final = HostBusValues.status(["Count": .uint(5)]).busValue
            for path in paths {
                let announced = seen.filter { $0.path == path }
                #expect(announced.count <= 2, "\(path): \(announced.count) announcements")
                #expect(announced.last?.changedProperties["Status"] == final, "\(path)")
            }
            #expect(try await f.get(VigilAPI.leasePath(ids[0]), VigilAPI.leaseInterface, "Status") == final)
        }
    }

    @Test func everyPropertyAndMethodAnswers() async throws {
        try await HostBusFixture.with(strategies: Self.script) { f in
            let signals = try await f.record()
            let wall0 = UInt64(f.clock.wallMicroseconds)
            await f.advance(1)
            await signals.wait(for: 9)

            let host = try await f.getAll(root, VigilAPI.hostInterface)
            #expect(host.keys.sorted() == ["CanWakeSystem", "ConfigPath", "DroppedLogLines", "Leases", "PowerBackend", "PowerBackendReason", "RunId",
                                          "StartedAt", "StoreWritable", "Strategies", "SurvivalSeconds", "Version", "WakeClock", "WakeClockReason"])
            #expect(host["StoreWritable"] == .bool(true))
            #expect(host["DroppedLogLines"] == .uint64(0))
            #expect(host["Version"] == .string("9.9.9-test"))
            #expect(host["RunId"] == .string(f.runtime.runId))
            #expect(host["StartedAt"] == .uint64(UInt64(f.runtime.startedWallMicros)))
            #expect(host["SurvivalSeconds"] == .uint64(1))
            #expect(host["PowerBackend"] == .string("none"))
            #expect(host["PowerBackendReason"] == .string(f.runtime.registry.backend.reason))
            #expect(host["WakeClock"] == .string(f.runtime.scheduler.clockInfo.clock))
            #expect(host["WakeClockReason"] == .string(f.runtime.scheduler.clockInfo.reason))
            #expect(host["CanWakeSystem"] == .bool(false))
            #expect(host["ConfigPath"] == .string(f.configPath))
            #expect(paths(host["Strategies"]) == [strategy("lease-script")])
            #expect(paths(host["Leases"]) == [lease(1), lease(2), lease(3)])

            let s = try await f.getAll(strategy("lease-script"), VigilAPI.strategyInterface)
            #expect(s.count == 8 + StrategyCostRow.fields.count)
            // The cost properties are the host's counters, read when asked.
            let cost = try StrategyCostRow(properties: s)
            #expect(cost == f.runtime.costs.cost(of: "lease-script"))
            #expect(s["WaitingFor"] == .string(""))
            #expect(s["LastError"] == .string("") && s["LastErrorAt"] == .uint64(0))
            #expect(s["Name"] == .string("lease-script"))
            #expect(s["Kind"] == .string("test-script"))
            #expect(s["State"] == .string("running"))
            #expect(s["Restarts"] == .uint32(0))
            #expect(s["LastError"] == .string(""))
            #expect(s["Config"] == HostBusValues.configTable(["name": .string("lease-script"), "kind": .string("test-script")]).busValue)

            let a = try await f.getAll(lease(1), VigilAPI.leaseInterface)
            #expect(a == [
                "Id": .uint64(1), "Strategy": .string("lease-script"), "Kind": .string("test-script"), "Holds": .string("a"),
                "Reason": .string("script a"), "AcquiredAt": .uint64(wall0 + 1_000_000), "Deadline": .uint64(wall0 + 11_000_000),
                "Renewals": .uint32(0), "State": .string("active"), "Status": HostBusValues.status([:]).busValue,
            ])
            #expect(try await f.get(lease(3), VigilAPI.leaseInterface, "Deadline") == .uint64(0))

            let list = try await f.hostCall("ListLeases")
            #expect(list.signature == LeaseRow.arraySignature)
            #expect(list.body.first.map(rows) == [
                [.objectPath(lease(1)), .uint64(1), .string("lease-script"), .string("test-script"), .string("a"), .string("script a"),
                 .uint64(wall0 + 1_000_000), .uint64(wall0 + 11_000_000), .uint32(0), .string("active")],
                [.objectPath(lease(2)), .uint64(2), .string("lease-script"), .string("test-script"), .string("b"), .string("script b"),
                 .uint64(wall0 + 1_000_000), .uint64(wall0 + 6_000_000), .uint32(0), .string("active")],
                [.objectPath(lease(3)), .uint64(3), .string("lease-script"), .string("test-script"), .string("c"), .string("script c"),
                 .uint64(wall0 + 1_000_000), .uint64(0), .uint32(0), .string("active")],
            ])
            let strategies = try await f.hostCall("ListStrategies")
            #expect(strategies.signature == StrategyRow.arraySignature)
            #expect(strategies.body.first.map(rows) == [
                [.objectPath(strategy("lease-script")), .string("lease-script"), .string("test-script"), .string("running"), .uint32(0), .string("")],
            ])

            let survival = try await f.hostCall("Survival", [UInt64(0)])
            #expect(survival.signature == RunRow.arraySignature)
            let runs = survival.body.first.map(rows) ?? []
            #expect(runs.count == 1)
            #expect(runs.first?[0] == .string(f.runtime.runId))
            #expect(runs.first?[1] == .uint64(UInt64(f.runtime.startedWallMicros)))
            #expect(runs.first?[2] == .uint64(0), "a running run has no end")
            #expect(runs.first?[3] == .string("running"))
            #expect(runs.first?[9] == .uint32(1), "the start counts as the first heartbeat")
            let since = UInt64(f.runtime.startedWallMicros)
            #expect(try await f.hostCall("Survival", [since]).body.first.map(rows)?.count == 1)
            #expect(try await f.hostCall("Survival", [since + 1]).body.first.map(rows)?.count == 0)

            let reload = try await f.hostCall("Reload")
            #expect(reload.body == [.bool(true), .array(elementSignature: "s", [.string("no changes")])])

            // Computed on read, no signal.
            await f.advance(59)
            #expect(try await f.get(root, VigilAPI.hostInterface, "SurvivalSeconds") == .uint64(60))
            // Bad calls get the standard errors.
            await #expect(throws: DBusError.self) { try await f.hostCall("Survival", ["not a time"]) }
            do {
                try await f.call(root, VigilAPI.propertiesInterface, "Set", ["org.vigil.Vigil1.Host", "Version", DBusVariant(.string("x"))])
                Issue.record("Set on a read-only property must fail")
            } catch let error as DBusError {
                #expect(error.name == DBusError.Name.propertyReadOnly)
            }
            do {
                try await f.call(lease(99), VigilAPI.propertiesInterface, "GetAll", [VigilAPI.leaseInterface])
                Issue.record("an unknown lease must fail")
            } catch let error as DBusError {
                #expect(error.name == DBusError.Name.unknownObject)
            }
        }
    }

    @Test func reloadFromAnotherUserIsDenied() async throws {
        // vigild "runs as" uid 4242 here: root (the test) may reload, nobody may not.
        try await HostBusFixture.with(strategies: Self.script, hostUID: 4242) { f in
            #expect(try await f.hostCall("Reload").body.first == .bool(true))
            // dbus-send prints the error's name and message (busctl only the errno text).
            let denied = try await ProcessRunner.runDetached("/usr/bin/setpriv", [
                "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/dbus-send", "--bus=\(f.bus.address)",
                "--print-reply", "--dest=\(f.hostName)", root, "\(VigilAPI.hostInterface).Reload",
            ])
            #expect(denied.status != 0)
            #expect(denied.stderr.contains("org.freedesktop.DBus.Error.AccessDenied"), "\(denied.stderr)")
            #expect(denied.stderr.contains("allowed only to root and to uid 4242") && denied.stderr.contains("uid 65534"), "\(denied.stderr)")
            // Reading stays open to everyone.
            let read = try await ProcessRunner.runDetached("/usr/bin/setpriv", [
                "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/busctl", "--address=\(f.bus.address)",
                "get-property", f.hostName, root, VigilAPI.hostInterface, "Version",
            ])
            #expect(read.status == 0, "\(read.stderr)")
            #expect(read.stdout == "s \"9.9.9-test\"\n")
        }
    }

    @Test func invalidReloadChangesNothing() async throws {
        try await HostBusFixture.with(strategies: Self.script) { f in
            let signals = try await f.record()
            await f.advance(1)
            await signals.wait(for: 7)  // Leases announced once: the second is not over
            try f.writeConfig("""
                [[strategy]]
                name = "lease-script"
                kind = "test-script"
                bogus = 1

                [[strategy]]
                name = "other"
                kind = "no-such-kind"
                """)
            let reply = try await f.hostCall("Reload")
            #expect(reply.body.first == .bool(false))
            let messages = try reply.argument(1, as: [String].self)
            #expect(messages.count == 2, "\(messages)")
            #expect(messages.first?.hasPrefix("\(f.configPath):8:1: strategy[0].bogus: unknown key \"bogus\"") == true, "\(messages)")
            #expect(messages.last?.hasPrefix("\(f.configPath):12:1: strategy[1].kind: unknown kind \"no-such-kind\"") == true, "\(messages)")
            // Nothing changed: same strategies, same leases, no signal.
            #expect(await f.runtime.config.strategies.map(\.name) == ["lease-script"])
            #expect(paths(try await f.get(root, VigilAPI.hostInterface, "Leases")) == [lease(1), lease(2), lease(3)])
            #expect(await f.runtime.registry.active.map(\.id.rawValue) == [1, 2, 3])
            #expect(signals.all.count == 7)
            // A missing file is reported the same way.
            try FileManager.default.removeItem(atPath: f.configPath)
            let missing = try await f.hostCall("Reload")
            #expect(missing.body.first == .bool(false))
            #expect(try missing.argument(1, as: [String].self).first?.contains("cannot open config file") == true)
        }
    }

    @Test func reloadAppliesOnlyTheDifferences() async throws {
        try await HostBusFixture.with(strategies: """
            [[strategy]]
            name = "keep"
            kind = "test-idle"

            [[strategy]]
            name = "change"
            kind = "test-idle"
            holds = "x"

            [[strategy]]
            name = "drop"
            kind = "test-idle"
            """) { f in
            let signals = try await f.record()
            await f.advance(1)
            await signals.wait(for: 9)
            let before = await f.runtime.registry.active
            let keepLease = try #require(before.first { $0.strategy == "keep" })
            let changeLease = try #require(before.first { $0.strategy == "change" })
            let dropLease = try #require(before.first { $0.strategy == "drop" })
            let start = signals.all.count

            try f.writeConfig("""
                [[strategy]]
                name = "keep"
                kind = "test-idle"

                [[strategy]]
                name = "change"
                kind = "test-idle"
                holds = "y"

                [[strategy]]
                name = "new-one"
                kind = "test-idle"
                """, host: "survival_interval = \"30s\"")
            let reply = try await f.hostCall("Reload")
            #expect(reply.body.first == .bool(true))
            #expect(try reply.argument(1, as: [String].self) == [
                "stopped strategy \"drop\": removed from the config",
                "started strategy \"new-one\": added to the config",
                "restarted strategy \"change\": its configuration changed",
                "[host] survival_interval changed: restart vigild to apply",
            ])
            await f.advance(1)  // the new instances take their leases
            // Lease and strategy changes are followed independently: wait for both.
            let seen = await signals.wait { all in
                let texts = all.map(\.description)
                return texts.contains("LeaseAcquired \(lease(4)) \"change\" \"y\"")
                    && texts.contains("LeaseAcquired \(lease(5)) \"new-one\" \"idle\"")
                    && texts.contains("StrategyStateChanged \(strategy("new-one")) \"running\" \"\"")
                    && texts.contains("StrategyStateChanged \(strategy("change")) \"running\" \"\"")
            }
            let after = Array(seen.dropFirst(start)).map(\.description)
            // keep: untouched, same lease.
            #expect(!after.contains { $0.contains(lease(keepLease.id.rawValue)) }, "\(after)")
            #expect(!after.contains { $0.contains(strategy("keep")) }, "\(after)")
            #expect(await f.runtime.registry.lease(keepLease.id)?.state == .active)
            // drop: stopped, its lease released, its object gone.
            #expect(after.contains("LeaseReleased \(lease(dropLease.id.rawValue)) \"strategy stopped\""))
            #expect(after.contains("StrategyStateChanged \(strategy("drop")) \"stopped\" \"\""))
            #expect(after.contains("InterfacesRemoved \(strategy("drop"))"))
            // change: stopped and started again with the new table.
            #expect(after.contains("LeaseReleased \(lease(changeLease.id.rawValue)) \"strategy stopped\""))
            let removed = after.firstIndex(of: "InterfacesRemoved \(strategy("change"))")
            let added = after.firstIndex(of: "InterfacesAdded \(strategy("change"))")
            #expect(removed != nil && added != nil && removed! < added!, "\(after)")
            // new-one: appears, running.
            #expect(after.contains("InterfacesAdded \(strategy("new-one"))"))
            #expect(after.contains("StrategyStateChanged \(strategy("new-one")) \"running\" \"\""))

            #expect(paths(try await f.get(root, VigilAPI.hostInterface, "Strategies")) == [strategy("keep"), strategy("change"), strategy("new-one")])
            let config = try await f.get(strategy("change"), VigilAPI.strategyInterface, "Config")
            #expect(config == HostBusValues.configTable(["name": .string("change"), "kind": .string("test-idle"), "holds": .string("y")]).busValue)
            await #expect(throws: DBusError.self) { try await f.getAll(strategy("drop"), VigilAPI.strategyInterface) }
            #expect(await f.runtime.config.strategies.map(\.name) == ["keep", "change", "new-one"])
            #expect(await f.runtime.config.host.survivalInterval == .seconds(60), "[host] changes are not applied")
            let holds = await f.runtime.registry.active.map { "\($0.strategy)=\($0.holds)" }
            #expect(Set(holds) == ["keep=idle", "change=y", "new-one=idle"])
        }
    }

    @Test func strategyFailuresAreSignalled() async throws {
        try await HostBusFixture.with(strategies: """
            [[strategy]]
            name = "flaky"
            kind = "test-fail"
            """) { f in
            let signals = try await f.record()
            await f.advance(1)
            var seen = await signals.wait(for: 2)
            #expect(signals.descriptions() == [
                "PropertiesChanged \(strategy("flaky")) State,Restarts,LastError,LastErrorAt",
                "StrategyStateChanged \(strategy("flaky")) \"backoff\" \"boom\"",
            ])
            // LastErrorAt: when it was set, on the fixture's wall clock.
            #expect(seen.first?.changedProperties == [
                "State": .string("backoff"), "Restarts": .uint32(1), "LastError": .string("boom"),
                "LastErrorAt": .uint64(UInt64(f.clock.wallMicroseconds)),
            ])
            try await f.waitForSleeper(within: 1)
            await f.advance(1)  // the first backoff is at most 1 s
            seen = await signals.wait(for: 4)
            #expect(Array(signals.descriptions().dropFirst(2).prefix(2)) == [
                "PropertiesChanged \(strategy("flaky")) State",
                "StrategyStateChanged \(strategy("flaky")) \"running\" \"boom\"",
            ])
            let listed = try await f.typed.strategies()
            #expect(listed.map { [$0.state, "\($0.restarts)", $0.lastError] } == [["running", "1", "boom"]])
        }
    }

    @Test func liveIntrospectionMatchesTheGeneratedDocument() async throws {
        try await HostBusFixture.with(strategies: Self.script) { f in
            let signals = try await f.record()
            await f.advance(1)
            await signals.wait(for: 9)
            let document = HostBusAPI.introspectionXML()
            for (path, interface) in [(root, VigilAPI.hostInterface), (strategy("lease-script"), VigilAPI.strategyInterface),
                                      (lease(1), VigilAPI.leaseInterface)] {
                let xml = try await f.call(path, "org.freedesktop.DBus.Introspectable", "Introspect").argument(0, as: String.self)
                let live = interfaceBlock(interface, in: xml)
                #expect(live != nil && live == interfaceBlock(interface, in: document), "\(path)")
            }
            let rootXML = try await f.call(root, "org.freedesktop.DBus.Introspectable", "Introspect").argument(0, as: String.self)
            #expect(rootXML.contains("<node name=\"Lease\"/>") && rootXML.contains("<node name=\"Strategy\"/>"))
            #expect(rootXML.contains("org.freedesktop.DBus.ObjectManager"))
        }
    }
}

/// The `<interface name="...">...</interface>` element of `name` in `xml`.
private func interfaceBlock(_ name: String, in xml: String) -> String? {
    guard let start = xml.range(of: "<interface name=\"\(name)\">") else { return nil }
    guard let end = xml.range(of: "</interface>", range: start.upperBound..<xml.endIndex) else { return nil }
    return String(xml[start.lowerBound..<end.upperBound])
}

/// The rows of an array of structs, as field lists.
private func rows(_ value: BusValue) -> [[BusValue]] {
    guard case .array(_, let items) = value else { return [] }
    return items.map { if case .structure(let fields) = $0 { fields } else { [] } }
}

private extension Array {
    subscript(safe index: Int) -> Element? { indices.contains(index) ? self[index] : nil }
}
