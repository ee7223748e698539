import Foundation
import Glibc
import Testing
import VigilClient
import VigilDBus
import VigilTestSupport

/// Pause, Resume and Cancel of the download-session strategy over D-Bus,
/// through the built vigild, against nginx's rate-limited `/slow/`.
extension EndToEnd.DownloadSessionEndToEndTests {
    static let strategyPath = "/org/vigil/Vigil1/Strategy/dl"
    static let sessionInterface = "org.vigil.Vigil1.DownloadSession"
    static let downloadInterface = "org.vigil.Vigil1.Download"
    static func downloadPath(_ id: Int) -> String { strategyPath + "/Download/\(id)" }

    /// A client connection to the harness's bus that records vigild's
    /// signals with their arrival time; tests await conditions on them.
    final class BusWatch: @unchecked Sendable {
        // Invariant: `task` is set once in init and only cancelled in close().
        struct Seen: Sendable {
            var at: ContinuousClock.Instant
            var path: String
            var member: String
            var changed: [String: BusValue]
        }

        private let seen = WaitableLog<Seen>()
        private var task: Task<Void, Never>?
        let connection: DBusConnection
        /// The typed client of vigild's API, on the same connection.
        let client: VigilClient

        init(_ bus: TestDBusDaemon) async throws {
            connection = try await bus.connect()
            client = VigilClient(connection: connection)
            let stream = try await connection.signals(matching: DBusMatchRule(sender: "org.vigil.Vigil1"))
            let seen = self.seen
            task = Task {
                for await message in stream { seen.append(Self.seen(message)) }
            }
        }

        func close() async {
            task?.cancel()
            await connection.close()
        }

        private static func seen(_ message: DBusMessage) -> Seen {
            var changed: [String: BusValue] = [:]
            if message.member == "PropertiesChanged", message.body.count == 3, case .dict(_, _, let entries) = message.body[1] {
                for entry in entries {
                    if case .string(let name) = entry.key, case .variant(let value) = entry.value { changed[name] = value }
                }
            }
            if message.member == "InterfacesRemoved", case .objectPath(let object)? = message.body.first {
                changed["object"] = .objectPath(object)
            }
            return Seen(at: .now, path: message.path ?? "", member: message.member ?? "", changed: changed)
        }

        var all: [Seen] { seen.all }

        /// Waits until `condition` holds for the signals so far; `timeout`
        /// only bounds a broken run.
        func wait(_ what: String, timeout: Duration = .seconds(30), until condition: @escaping @Sendable ([Seen]) -> Bool) async throws {
            let met = await seen.wait(timeout: timeout, until: condition)
            guard met else { throw DaemonError("timed out waiting for \(what); signals: \(all.map { "\($0.member) \($0.path) \($0.changed.keys.sorted())" })") }
        }

        /// Calls a DownloadSession method on a download; the error, if any.
        func control(_ action: VigilClient.DownloadAction, _ download: String) async -> DBusError? {
            do {
                try await client.control(action, download, on: strategyPath)
                return nil
            } catch let error as DBusError {
                return error
            } catch {
                return DBusError.failed("\(error)")
            }
        }

        func enqueue(_ url: String, _ dest: String, _ options: [String: BusValue] = [:]) async throws -> String {
            try await client.enqueue(on: strategyPath, url: url, dest: dest, options: options)
        }

        func property(_ path: String, _ name: String) async throws -> BusValue {
            try await client.property(name, of: path, interface: downloadInterface)
        }

        /// The paths in the host's `Leases` property.
        func leases() async throws -> [String] {
            try await client.host().leases
        }
    }

    static func bytesDone(_ signal: BusWatch.Seen) -> UInt64? {
        if case .uint64(let n)? = signal.changed["BytesDone"] { return n }
        return nil
    }

    /// Progress signals of `path`: PropertiesChanged carrying BytesDone
    /// without a State change.
    static func progress(_ signals: [BusWatch.Seen], _ path: String) -> [BusWatch.Seen] {
        signals.filter { $0.path == path && $0.member == "PropertiesChanged" && $0.changed["State"] == nil && bytesDone($0) != nil }
    }

    /// Runs busctl as uid/gid 65534 (nobody) against the harness's bus.
    static func asNobody(_ h: Harness, _ member: String, _ signature: String, _ arguments: [String]) throws -> CommandResult {
        try ProcessRunner.run("/usr/bin/setpriv", [
            "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/busctl", "--address=\(h.bus.address)", "call",
            "org.vigil.Vigil1", strategyPath, sessionInterface, member, signature,
        ] + arguments)
    }

    static func isAccessDenied(_ result: CommandResult) -> Bool {
        result.status != 0 && (result.stderr.lowercased().contains("access denied") || result.stderr.contains("AccessDenied"))
    }

    /// Pause stops the transfer and releases its lease; another uid can
    /// neither resume nor cancel it; Resume continues from the part with a
    /// Range request and the result verifies. While it runs, progress is
    /// announced at most about once a second, each time with more bytes.
    @Test func pauseStopsTheTransferAndResumeContinuesWithARange() async throws {
        let h = try Harness(slowRate: "4m")
        defer { h.stop() }
        let size = 24 << 20
        let file = try h.nginx.makeFile("paused.bin", size: size, seed: 11)
        let digest = try Self.sha256(file)
        // The monitor refreshes 4 times a second: the bridge's limit, not
        // the monitor's interval, is what bounds the signals.
        try h.config("progress_interval = \"250ms\"")
        let daemon = try h.start()
        try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
        // The strategy registers its D-Bus methods before it says what it knows.
        try await daemon.waitForLine(containing: " known, ")
        let watch = try await BusWatch(h.bus)
        let download = try await watch.enqueue("\(h.nginx.baseURL)/slow/paused.bin", "paused.bin",
                                               ["sha256": .string(digest), "size": .uint64(UInt64(size))])
        #expect(download == Self.downloadPath(1))
        let part = h.downloads + "/paused.bin.part"

        // Three progress announcements: about 3 s, 12 of 24 MiB at 4 MiB/s.
        try await watch.wait("three progress signals") { Self.progress($0, download).count >= 3 }
        let active = Self.progress(watch.all, download)
        let figures = active.compactMap(Self.bytesDone)
        #expect(figures == figures.sorted() && Set(figures).count == figures.count, "BytesDone grows between signals: \(figures)")
        if let first = active.first?.at, let last = active.last?.at {
            let seconds = Double((last - first).components.seconds) + Double((last - first).components.attoseconds) / 1e18
            #expect(Double(active.count - 1) <= seconds + 1, "\(active.count) progress signals in \(seconds) s")
        }
        #expect(try await watch.leases().count == 1)
        #expect(try await watch.property(download, "State") == .string("active"))

        #expect(await watch.control(.pause, download) == nil)
        // Pause returns once the transfer has stopped: the state and the
        // figure are final at once.
        #expect(try await watch.property(download, "State") == .string("paused"))
        let kept = h.size(part)
        #expect(kept > 0 && kept < size, "\(kept)")
        #expect(try await watch.property(download, "BytesDone") == .uint64(UInt64(kept)))
        try await watch.wait("the lease released") { $0.contains { $0.member == "LeaseReleased" } }
        #expect(try await watch.leases().isEmpty)

        // Another uid is refused and changes nothing.
        let deniedResume = try Self.asNobody(h, "Resume", "o", [download])
        #expect(Self.isAccessDenied(deniedResume), "\(deniedResume.stderr)")
        let deniedCancel = try Self.asNobody(h, "Cancel", "o", [download])
        #expect(Self.isAccessDenied(deniedCancel), "\(deniedCancel.stderr)")
        let deniedPause = try Self.asNobody(h, "Pause", "o", [download])
        #expect(Self.isAccessDenied(deniedPause), "\(deniedPause.stderr)")
        // An observation window, not synchronisation: at 4 MiB/s a transfer
        // still running would add about 1 MiB in it.
        try await Task.sleep(for: .milliseconds(250))
        #expect(h.size(part) == kept, "the part grew while paused")
        #expect(try await watch.property(download, "State") == .string("paused"))
        #expect(try await watch.property(download, "BytesDone") == .uint64(UInt64(kept)))
        #expect(Self.progress(watch.all, download).allSatisfy { (Self.bytesDone($0) ?? 0) <= UInt64(kept) }, "progress announced after Pause")
        // A paused download cannot be paused again.
        let again = await watch.control(.pause, download)
        #expect(again?.name == "org.freedesktop.DBus.Error.InvalidArgs" && again?.message.contains("is paused") == true, "\(String(describing: again))")

        #expect(await watch.control(.resume, download) == nil)
        try await daemon.waitForLine(containing: "download 1 try 2: GET \(h.nginx.baseURL)/slow/paused.bin from byte \(kept)")
        try await daemon.waitForLine(containing: "download 1 completed", timeout: .seconds(60))
        try await daemon.waitForLine(containing: "download 1 resumed at byte \(kept)")
        #expect(try Self.sha256(h.downloads + "/paused.bin") == digest)
        #expect(h.size(part) == -1)
        let ranged = h.nginx.requests().filter { $0.contains("range=\"bytes=\(kept)-\"") }
        #expect(ranged.count == 1 && ranged.first?.hasPrefix("206 \(size - kept) ") == true, "\(h.nginx.requests())")
        #expect(ranged.first?.contains("if-range=\"\"") == false, "\(h.nginx.requests())")
        try await watch.wait("the completed state") { $0.contains { $0.path == download && $0.changed["State"] == .string("completed") } }
        #expect(try await watch.property(download, "Sha256") == .string(digest))
        #expect(try await watch.property(download, "BytesDone") == .uint64(UInt64(size)))
        // A completed download can be neither paused nor resumed.
        let pauseDone = await watch.control(.pause, download)
        #expect(pauseDone?.name == "org.freedesktop.DBus.Error.InvalidArgs" && pauseDone?.message.contains("is completed") == true, "\(String(describing: pauseDone))")
        let resumeDone = await watch.control(.resume, download)
        #expect(resumeDone?.name == "org.freedesktop.DBus.Error.InvalidArgs" && resumeDone?.message.contains("is completed") == true, "\(String(describing: resumeDone))")
        await watch.close()
        daemon.signal(SIGTERM)
        #expect(await daemon.waitForExit() == 0)
    }

    /// Cancel stops the transfer and removes the download's object, its
    /// part file, its record and its lease; another uid cannot cancel; bad
    /// object paths get UnknownObject or InvalidArgs with a clear message.
    @Test func cancelRemovesTheDownloadItsPartAndItsLease() async throws {
        let h = try Harness(slowRate: "2m")
        defer { h.stop() }
        try h.nginx.makeFile("cancelled.bin", size: 16 << 20, seed: 12)
        try h.config("")
        let daemon = try h.start()
        try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
        // The strategy registers its D-Bus methods before it says what it knows.
        try await daemon.waitForLine(containing: " known, ")
        let watch = try await BusWatch(h.bus)
        let download = try await watch.enqueue("\(h.nginx.baseURL)/slow/cancelled.bin", "sub/cancelled.bin")
        let part = h.downloads + "/sub/cancelled.bin.part"
        try await watch.wait("progress") { Self.progress($0, download).contains { (Self.bytesDone($0) ?? 0) > 0 } }
        #expect(try await watch.leases().count == 1)

        let denied = try Self.asNobody(h, "Cancel", "o", [download])
        #expect(Self.isAccessDenied(denied), "\(denied.stderr)")
        #expect(try await watch.property(download, "State") == .string("active"))
        #expect(h.size(part) > 0)

        // Bad arguments.
        let unknown = await watch.control(.cancel, Self.downloadPath(99))
        #expect(unknown?.name == "org.freedesktop.DBus.Error.UnknownObject" && unknown?.message == "no download 99", "\(String(describing: unknown))")
        let foreign = await watch.control(.pause, "/org/vigil/Vigil1/Strategy/other/Download/1")
        #expect(foreign?.name == "org.freedesktop.DBus.Error.UnknownObject", "\(String(describing: foreign))")
        #expect(foreign?.message.contains("is not a download of this session") == true, "\(String(describing: foreign))")
        let notANumber = await watch.control(.resume, Self.strategyPath + "/Download/abc")
        #expect(notANumber?.name == "org.freedesktop.DBus.Error.UnknownObject", "\(String(describing: notANumber))")
        let resumeActive = await watch.control(.resume, download)
        #expect(resumeActive?.name == "org.freedesktop.DBus.Error.InvalidArgs" && resumeActive?.message.contains("is active") == true,
                "\(String(describing: resumeActive))")
        do {
            _ = try await watch.client.call("Cancel", path: Self.strategyPath, interface: Self.sessionInterface, arguments: [.string(download)])
            Issue.record("Cancel with a string instead of an object path was accepted")
        } catch let error as DBusError {
            #expect(error.name == "org.freedesktop.DBus.Error.InvalidArgs", "\(error)")
        }
        #expect(try await watch.property(download, "State") == .string("active"))

        #expect(await watch.control(.cancel, download) == nil)
        // Cancel returns once the download is gone.
        #expect(h.size(part) == -1)
        #expect(h.size(h.downloads + "/sub/cancelled.bin") == -1)
        try await watch.wait("the object removed") { $0.contains { $0.member == "InterfacesRemoved" && $0.changed["object"] == .objectPath(download) } }
        do {
            _ = try await watch.property(download, "State")
            Issue.record("the cancelled download's object is still there")
        } catch let error as DBusError {
            #expect(error.name == "org.freedesktop.DBus.Error.UnknownObject", "\(error)")
        }
        try await watch.wait("the lease released") { $0.contains { $0.member == "LeaseReleased" } }
        #expect(try await watch.leases().isEmpty)
        let twice = await watch.control(.cancel, download)
        #expect(twice?.name == "org.freedesktop.DBus.Error.UnknownObject" && twice?.message == "no download 1", "\(String(describing: twice))")
        try await daemon.waitForLine(containing: "download 1 cancelled")

        // The record is gone too: a restart does not bring it back.
        await watch.close()
        daemon.signal(SIGTERM)
        #expect(await daemon.waitForExit() == 0)
        let second = try h.start()
        let known = try await second.waitForLine(containing: "downloads known")
        #expect(known.contains("0 downloads known, 0 to do"), "\(known)")
        #expect(h.size(part) == -1)
        second.signal(SIGTERM)
        #expect(await second.waitForExit() == 0)
    }
}

extension EndToEnd.DownloadSessionEndToEndTests {
    /// Enqueue's url, dest and options have limits (docs/security.md):
    /// over them, InvalidArgs naming the limit, and nothing is queued.
    @Test func enqueueRefusesOversizedArgumentsNamingTheLimit() async throws {
        let h = try Harness(slowRate: "2m")
        defer { h.stop() }
        try h.config("")
        let daemon = try h.start()
        try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
        try await daemon.waitForLine(containing: " known, ")
        let watch = try await BusWatch(h.bus)
        func refusal(_ url: String, _ dest: String, _ options: [String: BusValue] = [:]) async -> String {
            do {
                return "queued \(try await watch.enqueue(url, dest, options))"
            } catch let error as DBusError {
                return "\(error.name): \(error.message)"
            } catch {
                return "\(error)"
            }
        }
        let base = "\(h.nginx.baseURL)/"
        let invalid = "org.freedesktop.DBus.Error.InvalidArgs"
        #expect(await refusal(base + String(repeating: "a", count: 8192), "x")
                == "\(invalid): the download URL has \(base.utf8.count + 8192) bytes, over the limit of 8192 bytes")
        #expect(await refusal(base + "x", String(repeating: "d", count: 4097))
                == "\(invalid): the download destination has 4097 bytes, over the limit of 4096 bytes")
        let many = Dictionary(uniqueKeysWithValues: (0..<17).map { ("k\($0)", BusValue.string("v")) })
        #expect(await refusal(base + "x", "x", many) == "\(invalid): the options dictionary has 17 entries, over the limit of 16 entries")
        // An unknown option is quoted by a short prefix only.
        let longKey = await refusal(base + "x", "x", [String(repeating: "k", count: 100_000): .string("v")])
        #expect(longKey.hasPrefix("\(invalid): unknown option") && longKey.utf8.count < 200, "\(longKey.prefix(300))")
        #expect(try await watch.leases().isEmpty)

        // A destination with ESC, CR, LF and BEL: `vigilctl downloads` prints it escaped.
        let queued = await refusal(base + "missing.bin", "evil\u{1B}[2J\r\n\u{07}x.bin")
        #expect(queued.hasPrefix("queued "), "\(queued)")
        let listing = try ProcessRunner.run(Build.vigilctl, ["downloads", "--bus", h.bus.address])
        #expect(listing.status == 0, "\(listing.stderr)")
        #expect(listing.stdout.contains(#"evil\e[2J\r\n\u{7}x.bin"#), "\(listing.stdout)")
        #expect(!listing.stdout.unicodeScalars.contains { $0 == "\u{1B}" || $0 == "\r" || $0 == "\u{07}" }, "\(listing.stdout.debugDescription)")
        daemon.signal(SIGTERM)
        #expect(await daemon.waitForExit() == 0)
    }
}
