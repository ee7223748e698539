import Foundation
import Glibc
import Testing
import VigilTestSupport

/// The download-session strategy through the built vigild, against a real
/// nginx on 127.0.0.1 (Range, If-Range, strong ETags) and a private bus.
extension EndToEnd {
    @Suite struct DownloadSessionEndToEndTests {
        /// nginx, a bus, a temp dir with `downloads/` and `state/`, and a
        /// config writer for one download-session strategy named "dl".
        final class Harness: @unchecked Sendable {
            // Invariant: set in init, read-only afterwards.
            let nginx: TestNginx
            let bus: TestDBusDaemon
            let dir: TempDir
            var downloads: String { dir.file("downloads") }

            init(slowRate: String = "4m", locations: String = "", servers: String = "") throws {
                nginx = try TestNginx(slowRate: slowRate, locations: locations, servers: servers)
                bus = try TestDBusDaemon()
                dir = try TempDir("vigil-download")
                try FileManager.default.createDirectory(atPath: dir.file("downloads"), withIntermediateDirectories: true)
            }

            func stop() {
                nginx.stop()
                bus.stop()
            }

            /// Writes the config; `body` is the rest of the strategy table.
            @discardableResult
            func config(_ body: String) throws -> String {
                let host = hostConfig(stateDir: dir.file("state"), interval: "60s", extra: "bus = \"\(bus.address)\"")
                return try dir.write("vigil.toml", host + """

                    [[strategy]]
                    name = "dl"
                    kind = "download-session"
                    dir = "\(downloads)"
                    backoff_initial = "100ms"
                    backoff_max = "500ms"
                    \(body)
                    """)
            }

            func start(_ wrapper: [String] = [], environment: [String: String] = [:]) throws -> Daemon {
                try Daemon(arguments: ["--config", dir.file("vigil.toml")], environment: environment,
                           executable: wrapper.isEmpty ? nil : wrapper)
            }

            func busctl(_ arguments: [String]) throws -> CommandResult {
                try ProcessRunner.run("/usr/bin/busctl", ["--address=\(bus.address)"] + arguments)
            }

            func enqueue(_ url: String, _ dest: String, _ options: [String] = ["0"]) throws -> CommandResult {
                try busctl(["call", "org.vigil.Vigil1", "/org/vigil/Vigil1/Strategy/dl", "org.vigil.Vigil1.DownloadSession",
                            "Enqueue", "ssa{sv}", url, dest] + options)
            }

            func property(_ id: Int, _ name: String) throws -> String {
                try busctl(["get-property", "org.vigil.Vigil1", "/org/vigil/Vigil1/Strategy/dl/Download/\(id)",
                            "org.vigil.Vigil1.Download", name]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            }

            /// Polls `property` (every 20 ms, at most `timeout`) until `done`
            /// holds; returns the last value. A download's object and its
            /// state reach the bus after the log line that reports them
            /// (the projection follows the strategy's status): two true
            /// events whose order is not fixed.
            func waitForProperty(_ id: Int, _ name: String, timeout: Duration = .seconds(10), until done: (String) -> Bool) async throws -> String {
                let end = ContinuousClock.now + timeout
                var value = try property(id, name)
                while !done(value), ContinuousClock.now < end {
                    try await Task.sleep(for: .milliseconds(20))
                    value = try property(id, name)
                }
                return value
            }

            func size(_ path: String) -> Int {
                var st = stat()
                return stat(path, &st) == 0 ? Int(st.st_size) : -1
            }

            /// Polls (every 20 ms, at most `timeout`) until `path` holds at least `bytes`.
            func waitForSize(_ path: String, atLeast bytes: Int, timeout: Duration = .seconds(30)) async throws {
                let end = ContinuousClock.now + timeout
                while size(path) < bytes {
                    guard ContinuousClock.now < end else { throw DaemonError("\(path) did not reach \(bytes) bytes (has \(size(path)))") }
                    try await Task.sleep(for: .milliseconds(20))
                }
            }
        }

        /// `python3 -c script arguments...`, where the script imports
        /// http.server and sys and defines the handler class `H`: served on
        /// 127.0.0.1 at an ephemeral port (`handler` makes each request's
        /// handler). Returns the server and the URL of `path` on it.
        static func serveHTTP(_ script: String, handler: String = "H", arguments: [String] = [], path: String) async throws -> (Daemon, String) {
            let server = try Daemon(arguments: arguments, executable: ["/usr/bin/python3", "-c", script + """

                s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), \(handler))
                sys.stderr.write("port %d\\n" % s.server_address[1])
                sys.stderr.flush()
                s.serve_forever()
                """])
            let portLine = try await server.waitForLine(containing: "port ")
            return (server, "http://127.0.0.1:\(portLine.split(separator: " ")[1])\(path)")
        }

        static func sha256(_ path: String) throws -> String {
            String(try ProcessRunner.run("/usr/bin/sha256sum", [path]).stdout.prefix(64))
        }

        @Test func a256MiBDownloadCompletesAndVerifies() async throws {
            let h = try Harness()
            defer { h.stop() }
            let file = try h.nginx.makeFile("big.bin", size: 256 << 20)
            let digest = try Self.sha256(file)
            try h.config("downloads = [{ url = \"\(h.nginx.baseURL)/big.bin\", sha256 = \"\(digest)\", size = \(256 << 20) }]")
            let daemon = try h.start()
            try await daemon.waitForLine(containing: "download 1 completed", timeout: .seconds(120))
            let dest = h.downloads + "/big.bin"
            #expect(try Self.sha256(dest) == digest)
            #expect(h.size(dest + ".part") == -1)
            #expect(try h.property(1, "State") == "s \"completed\"")
            #expect(try h.property(1, "Sha256") == "s \"\(digest)\"")
            #expect(try h.property(1, "BytesDone") == "t \(256 << 20)")
            // What the strategy moved on the network: the body and the
            // response's headers in, one GET out.
            func cost(_ name: String) throws -> UInt64 {
                let text = try h.busctl(["get-property", "org.vigil.Vigil1", "/org/vigil/Vigil1/Strategy/dl", "org.vigil.Vigil1.Strategy", name]).stdout
                return UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines).dropFirst(2)) ?? 0
            }
            let received = try cost("BytesReceived"), sent = try cost("BytesSent")
            #expect(received > 256 << 20 && received < (256 << 20) + 4096, "BytesReceived \(received)")
            #expect(sent > 30 && sent < 4096, "BytesSent \(sent)")
            let listing = try ProcessRunner.run(Build.vigilctl, ["downloads", "--bus", h.bus.address])
            #expect(listing.status == 0, "\(listing.stderr)")
            #expect(listing.stdout.contains("[####################] 100%"), "\(listing.stdout)")
            #expect(listing.stdout.contains("256.0 MiB/256.0 MiB") && listing.stdout.contains("completed"), "\(listing.stdout)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func killNineMidDownloadThenRestartResumesFromThePartFile() async throws {
            let h = try Harness(slowRate: "8m")
            defer { h.stop() }
            let size = 48 << 20
            let file = try h.nginx.makeFile("resume.bin", size: size, seed: 7)
            let digest = try Self.sha256(file)
            try h.config("downloads = [{ url = \"\(h.nginx.baseURL)/slow/resume.bin\", dest = \"maps/resume.bin\", sha256 = \"\(digest)\" }]")
            let part = h.downloads + "/maps/resume.bin.part"
            let first = try h.start()
            try await h.waitForSize(part, atLeast: 12 << 20)
            // While it runs: one lease with the live figures, and a progress bar.
            let leases = try ProcessRunner.run(Build.vigilctl, ["leases", "--bus", h.bus.address])
            #expect(leases.stdout.contains("download maps/resume.bin"), "\(leases.stdout)")
            #expect(leases.stdout.contains("BytesTotal=\(size)"), "\(leases.stdout)")
            let listing = try ProcessRunner.run(Build.vigilctl, ["downloads", "--bus", h.bus.address])
            #expect(listing.stdout.contains(" active ") && listing.stdout.contains("/48.0 MiB"), "\(listing.stdout)")
            first.signal(SIGKILL)
            _ = await first.waitForExit()
            let kept = h.size(part)
            #expect(kept >= 12 << 20 && kept < size)

            let second = try h.start()
            let resumed = try await second.waitForLine(containing: "download 1 resumed at byte")
            try await second.waitForLine(containing: "download 1 completed", timeout: .seconds(60))
            #expect(try Self.sha256(h.downloads + "/maps/resume.bin") == digest)
            // "download 1 resumed at byte N", then the line's fields.
            let offset = resumed.split(separator: "resumed at byte ").last.flatMap { Int($0.prefix { $0.isNumber }) } ?? -1
            #expect(offset == kept)
            let ranged = h.nginx.requests().filter { $0.contains("range=\"bytes=\(kept)-\"") }
            #expect(ranged.count == 1, "\(h.nginx.requests())")
            #expect(ranged.first?.hasPrefix("206 ") == true)
            #expect(ranged.first?.contains("if-range=\"\"") == false)
            second.signal(SIGTERM)
            #expect(await second.waitForExit() == 0)
        }

        @Test func aFileChangedOnTheServerRestartsFromZero() async throws {
            let h = try Harness(slowRate: "8m")
            defer { h.stop() }
            let size = 32 << 20
            let file = try h.nginx.makeFile("changing.bin", size: size, seed: 1)
            try h.config("downloads = [{ url = \"\(h.nginx.baseURL)/slow/changing.bin\" }]")
            let part = h.downloads + "/changing.bin.part"
            let first = try h.start()
            try await h.waitForSize(part, atLeast: 4 << 20)
            first.signal(SIGKILL)
            _ = await first.waitForExit()

            // New content and a different mtime, so the ETag changes.
            try h.nginx.makeFile("changing.bin", size: size, seed: 2)
            var times = [timeval(tv_sec: time(nil) + 100, tv_usec: 0), timeval(tv_sec: time(nil) + 100, tv_usec: 0)]
            #expect(utimes(file, &times) == 0)
            let digest = try Self.sha256(file)

            let second = try h.start()
            try await second.waitForLine(containing: "download 1 completed", timeout: .seconds(60))
            #expect(try Self.sha256(h.downloads + "/changing.bin") == digest)
            let requests = h.nginx.requests()
            let resumeAttempt = try #require(requests.last { $0.contains("range=\"bytes=") }, "\(requests)")
            #expect(resumeAttempt.hasPrefix("200 \(size) "), "If-Range did not match: the whole new file is sent: \(requests)")
            #expect(second.output.contains { $0.contains("download 1: If-Range did not match: the file changed on the server (200 to a resume at byte ") && $0.contains("restarted from zero") }, "\(second.output)")
            #expect(!resumeAttempt.contains("if-range=\"\""))
            second.signal(SIGTERM)
            #expect(await second.waitForExit() == 0)
        }

        /// python's http.server ignores Range: after a kill mid-download the
        /// resume (Range and If-Range: its Last-Modified) gets the whole file
        /// with a 200. The part is discarded and the download restarted from
        /// zero, and the log says so once, at notice, with what it costs.
        @Test func aServerThatIgnoresRangeRestartsFromZeroAndSaysSo() async throws {
            let h = try Harness()
            defer { h.stop() }
            let size = 24 << 20
            let file = try h.nginx.makeFile("norange.bin", size: size, seed: 3)
            let served = (file as NSString).deletingLastPathComponent
            let digest = try Self.sha256(file)
            // SimpleHTTPRequestHandler as shipped, its body slowed to about
            // 8 MB/s so that a kill lands mid-download.
            let (server, url) = try await Self.serveHTTP("""
                import functools, http.server, sys, time
                class H(http.server.SimpleHTTPRequestHandler):
                    def log_message(self, fmt, *a):
                        sys.stderr.write("%s range=%s\\n" % (fmt % a, self.headers.get("Range")))
                        sys.stderr.flush()
                    def copyfile(self, source, destination):
                        while True:
                            chunk = source.read(64 << 10)
                            if not chunk:
                                break
                            destination.write(chunk)
                            time.sleep(0.008)
                """, handler: "functools.partial(H, directory=sys.argv[1])", arguments: [served], path: "/norange.bin")
            defer { server.signal(SIGTERM) }
            try h.config("downloads = [{ url = \"\(url)\", sha256 = \"\(digest)\" }]")
            let part = h.downloads + "/norange.bin.part"
            let first = try h.start()
            try await h.waitForSize(part, atLeast: 4 << 20)
            first.signal(SIGKILL)
            _ = await first.waitForExit()
            let kept = h.size(part)
            #expect(kept >= 4 << 20 && kept < size)

            let second = try h.start()
            let line = try await second.waitForLine(containing: "restarted from zero")
            #expect(line.hasPrefix("notice "), "\(line)")
            #expect(line.contains("download 1: the server ignores Range (200 to a resume at byte \(kept)); discarded the partial file and restarted from zero, fetching \(kept) bytes again"), "\(line)")
            try await second.waitForLine(containing: "download 1 completed", timeout: .seconds(60))
            #expect(try Self.sha256(h.downloads + "/norange.bin") == digest)
            #expect(second.output.filter { $0.contains("restarted from zero") }.count == 1, "\(second.output)")
            #expect(durationsOverTwoUnits(in: first.output + second.output).isEmpty, "\(second.output)")
            #expect(server.output.contains { $0.contains("GET /norange.bin") && $0.contains("range=bytes=\(kept)-") }, "\(server.output)")
            second.signal(SIGTERM)
            #expect(await second.waitForExit() == 0)
        }

        @Test func aWrongSha256LeavesNoFileAndReportsTheError() async throws {
            let h = try Harness()
            defer { h.stop() }
            try h.nginx.makeFile("small.bin", size: 1 << 20)
            let wrong = String(repeating: "0", count: 64)
            try h.config("""
                downloads = [{ url = "\(h.nginx.baseURL)/small.bin", sha256 = "\(wrong)" }]
                on_fail = ["sh", "-c", "echo \\"$VIGIL_ERROR\\" > \(h.dir.file("failed.txt"))"]
                """)
            let daemon = try h.start()
            let line = try await daemon.waitForLine(containing: "download 1 failed")
            #expect(line.contains("sha256 mismatch"), "\(line)")
            #expect(h.size(h.downloads + "/small.bin") == -1)
            #expect(h.size(h.downloads + "/small.bin.part") == -1)
            // A 1 MiB download can fail before vigild serves the bus.
            _ = try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
            #expect(try await h.waitForProperty(1, "State") { $0 == "s \"failed\"" } == "s \"failed\"")
            #expect(try h.property(1, "LastError").contains("expected \(wrong)"))
            try await h.waitForSize(h.dir.file("failed.txt"), atLeast: 10)
            #expect(try String(contentsOfFile: h.dir.file("failed.txt"), encoding: .utf8).contains("sha256 mismatch"))
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        /// A 503's Retry-After as delay-seconds ("seconds"), as an HTTP date
        /// 3 s ahead ("date"), and as the non-ASCII date that stopped
        /// Foundation's DateFormatter in fuzz-http ("hostile"): the first two
        /// are waited out, the third is ignored for the backoff (100 ms).
        @Test(arguments: ["seconds", "date", "hostile"])
        func a503WithRetryAfterIsHonoured(_ form: String) async throws {
            let h = try Harness()
            defer { h.stop() }
            let port = try TestNginx.freePort()
            let log = h.dir.file("python.log")
            // First GET: 503 with Retry-After; then 200 with a body. Logs
            // each request's monotonic time. The header's bytes go out as
            // given (UTF-8), which send_header's latin-1 keeps.
            let server = ProcessRunner.process("/usr/bin/python3")
            server.arguments = ["-c", """
                import http.server, time, sys, email.utils
                count = 0
                form = sys.argv[3]
                class H(http.server.BaseHTTPRequestHandler):
                    def do_GET(self):
                        global count
                        count += 1
                        with open(sys.argv[2], 'a') as f: f.write('%d %f\\n' % (count, time.monotonic()))
                        if count == 1:
                            value = {'seconds': '2', 'date': email.utils.formatdate(time.time() + 3, usegmt=True),
                                     'hostile': 'Wed, 21\\u07b0ct 2015 07:28:00 WMT'}[form]
                            self.send_response(503); self.send_header('Retry-After', value.encode().decode('latin-1'))
                            self.send_header('Content-Length', '0'); self.end_headers()
                        else:
                            body = b'x' * 100000
                            self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)
                    def log_message(self, *a): pass
                http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
                """, String(port), log, form]
            try server.run()
            defer { kill(server.processIdentifier, SIGKILL); server.waitUntilExit() }
            for _ in 0..<500 {
                if TestNginx.canConnect(port: port) { break }
                usleep(10_000)
            }
            try h.config("""
                downloads = [{ url = "http://127.0.0.1:\(port)/file", size = 100000 }]
                backoff_jitter = false
                """)
            let daemon = try h.start()
            let warning = try await daemon.waitForLine(containing: "download 1: HTTP 503")
            try await daemon.waitForLine(containing: "download 1 completed")
            let times = try String(contentsOfFile: log, encoding: .utf8).split(separator: "\n").compactMap { Double($0.split(separator: " ")[1]) }
            #expect(times.count == 2)
            switch form {
            case "seconds":
                #expect(warning.contains("the server asked to retry after 2; try 2 of 5 in 2s"), "\(warning)")
                #expect(times[1] - times[0] >= 1.95, "\(times)")
            case "date":
                #expect(warning.contains("the server asked to retry after "), "\(warning)")
                #expect(warning.contains(" GMT; try 2 of 5 in "), "\(warning)")
                #expect(times[1] - times[0] >= 1.5, "\(times)")
            default:
                #expect(warning.contains("download 1: HTTP 503; try 2 of 5 in 100ms"), "\(warning)")
            }
            #expect(try h.property(1, "Attempts") == "u 2")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func aStalledServerTriggersTheStallTimeoutAndARetry() async throws {
            let h = try Harness()
            defer { h.stop() }
            let silent = try SilentServer()
            defer { silent.stop() }
            try h.config("""
                downloads = [{ url = "http://127.0.0.1:\(silent.port)/never" }]
                stall_timeout = "1s"
                max_tries = 2
                """)
            let daemon = try h.start()
            let retry = try await daemon.waitForLine(containing: "download 1: transfer failed")
            #expect(retry.contains("try 2 of 2"), "\(retry)")
            #expect(retry.lowercased().contains("too slow"), "\(retry)")
            let failed = try await daemon.waitForLine(containing: "download 1 failed")
            #expect(failed.contains("gave up after 2 tries"), "\(failed)")
            #expect(try h.property(1, "Attempts") == "u 2")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func enqueueOverDBusStaysInsideDirAndRejectsBadInput() async throws {
            let h = try Harness()
            defer { h.stop() }
            try h.nginx.makeFile("ok.bin", size: 300_000)
            try h.config("")
            try FileManager.default.createSymbolicLink(atPath: h.downloads + "/outside", withDestinationPath: "/tmp")
            try FileManager.default.createDirectory(atPath: h.downloads + "/adir", withIntermediateDirectories: true)
            let daemon = try h.start()
            try await daemon.waitForLine(containing: "serving org.vigil.Vigil1")
            try await daemon.waitForLine(containing: "0 to do")

            let url = "\(h.nginx.baseURL)/ok.bin"
            let dotdot = try h.enqueue(url, "../escaped.bin")
            #expect(dotdot.status != 0)
            #expect(dotdot.stderr.contains("escapes the download dir"), "\(dotdot.stderr)")
            let symlink = try h.enqueue(url, "outside/escaped.bin")
            #expect(symlink.stderr.contains("escapes the download dir") && symlink.stderr.contains("symlink"), "\(symlink.stderr)")
            let absolute = try h.enqueue(url, "/etc/passwd")
            #expect(absolute.stderr.contains("is absolute"), "\(absolute.stderr)")
            let malformed = try h.enqueue("http://[::1", "x.bin")
            #expect(malformed.stderr.contains("malformed URL"), "\(malformed.stderr)")
            let scheme = try h.enqueue("ftp://127.0.0.1/ok.bin", "x.bin")
            #expect(scheme.stderr.contains("unsupported URL scheme \"ftp\""), "\(scheme.stderr)")
            let directory = try h.enqueue(url, "adir")
            #expect(directory.stderr.contains("is a directory"), "\(directory.stderr)")
            let option = try h.enqueue(url, "x.bin", ["1", "colour", "s", "red"])
            #expect(option.stderr.contains("unknown option \"colour\""), "\(option.stderr)")
            #expect(h.size("/tmp/escaped.bin") == -1)
            // Enqueue is mutating: another uid is refused before anything happens.
            let denied = try ProcessRunner.run("/usr/bin/setpriv", [
                "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/busctl", "--address=\(h.bus.address)", "call",
                "org.vigil.Vigil1", "/org/vigil/Vigil1/Strategy/dl", "org.vigil.Vigil1.DownloadSession", "Enqueue", "ssa{sv}", url, "x.bin", "0",
            ])
            #expect(denied.status != 0)
            #expect(denied.stderr.lowercased().contains("access denied") || denied.stderr.contains("AccessDenied"), "\(denied.stderr)")
            // Introspection shows the strategy's extra interface.
            let introspect = try h.busctl(["introspect", "org.vigil.Vigil1", "/org/vigil/Vigil1/Strategy/dl", "--no-pager"])
            #expect(introspect.stdout.contains("org.vigil.Vigil1.DownloadSession") && introspect.stdout.contains(".Enqueue"), "\(introspect.stdout)")

            // The host still serves, and a good Enqueue works.
            let good = try h.enqueue(url, "sub/ok.bin", ["1", "size", "t", "300000"])
            #expect(good.stdout == "o \"/org/vigil/Vigil1/Strategy/dl/Download/1\"\n", "\(good.stdout) \(good.stderr)")
            try await daemon.waitForLine(containing: "download 1 completed")
            #expect(h.size(h.downloads + "/sub/ok.bin") == 300_000)
            #expect(try h.property(1, "Dest") == "s \"\(DestinationCheck.real(h.downloads))/sub/ok.bin\"")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        /// A server that first announces 8 MiB (and drops the connection
        /// after 1 MiB), then answers the resume with a 206 whose total is
        /// 4 MiB: the 206 is discarded with a clear LastError and nothing
        /// is published (it used to publish the 4 MiB file as complete).
        // It used to fail in the whole suite only: vigild refuses the 206 on
        // its headers and resets the connection; on a loaded machine that
        // came before the server had written the body, so its "served 206"
        // line (written after the body) never came. The server says so
        // before the body now.
        @Test
        func a206WhoseTotalContradictsTheFirstLengthIsNeverPublished() async throws {
            let h = try Harness()
            defer { h.stop() }
            let (server, url) = try await Self.serveHTTP("""
                import http.server, sys
                FULL, SHORT = 8 << 20, 4 << 20
                class H(http.server.BaseHTTPRequestHandler):
                    protocol_version = "HTTP/1.1"
                    def log_message(self, *a): pass
                    def do_GET(self):
                        r = self.headers.get("Range")
                        if r is None:
                            self.send_response(200)
                            self.send_header("Content-Length", str(FULL))
                            self.send_header("ETag", '"v1"')
                            self.end_headers()
                            self.wfile.write(b"a" * (1 << 20))
                            self.close_connection = True
                            return
                        start = int(r.split("=")[1].split("-")[0])
                        self.send_response(206)
                        self.send_header("Content-Range", "bytes %d-%d/%d" % (start, SHORT - 1, SHORT))
                        self.send_header("Content-Length", str(SHORT - start))
                        self.send_header("ETag", '"v1"')
                        self.end_headers()
                        self.wfile.flush()
                        # Said before the body: vigild refuses the 206 on its
                        # headers and resets the connection, often before
                        # the body is all written.
                        sys.stderr.write("served 206 from %d\\n" % start)
                        sys.stderr.flush()
                        try:
                            self.wfile.write(b"a" * (SHORT - start))
                        except (ConnectionResetError, BrokenPipeError):
                            self.close_connection = True
                """, path: "/liar.bin")
            defer { server.signal(SIGTERM) }
            // On a loaded machine the first answer can be cut before its 1 MiB
            // arrives (the suite runs in parallel), so the resume may start
            // elsewhere and a try may go to a plain 200: wait for the discard
            // itself, whichever try meets it.
            try h.config("max_tries = 4\ndownloads = [{ url = \"\(url)\", dest = \"liar.bin\" }]")
            let daemon = try h.start()
            do {
                try await server.waitForLine(containing: "served 206 from ")
            } catch {
                Issue.record("no 206 was asked for; vigild said:\n\(daemon.output.joined(separator: "\n"))")
                throw error
            }
            let discarded = try await daemon.waitForLine(containing: "discarded a 206 answer")
            #expect(discarded.contains("discarded a 206 answer: the server's Content-Range \"bytes "), "\(discarded)")
            #expect(discarded.contains("-4194303/4194304\" gives a total of 4194304 bytes, but the response the part began with said 8388608"), "\(discarded)")
            _ = try await daemon.waitForLine(containing: "download 1 failed")
            #expect(!daemon.output.contains { $0.contains("completed") })
            #expect(h.size(h.downloads + "/liar.bin") == -1)
            #expect(try await h.waitForProperty(1, "State") { $0 == "s \"failed\"" } == "s \"failed\"")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        /// A server's numbers at Int64's edge: a 206 whose Content-Range ends
        /// at Int64.max ("end"), or whose Content-Length, added to the resume
        /// offset, passes it ("length", with an unknown total: `/*`). Both
        /// trapped vigild (arithmetic overflow in the plugin, found reading
        /// the code behind a fuzz-http crash); now the first is a discarded
        /// answer and the second a length not known, and vigild carries on.
        /// "no-total": a Content-Range without its `/total` (`bytes N-`),
        /// which RFC 9110 does not allow, is a discarded answer too.
        @Test(arguments: ["end", "length", "no-total"])
        func numbersPastInt64FromTheServerDoNotStopVigild(mode: String) async throws {
            let h = try Harness()
            defer { h.stop() }
            let (server, url) = try await Self.serveHTTP("""
                import http.server, sys
                FULL, MAX = 2 << 20, (1 << 63) - 1
                MODE = sys.argv[1]
                class H(http.server.BaseHTTPRequestHandler):
                    protocol_version = "HTTP/1.1"
                    def log_message(self, *a): pass
                    def do_GET(self):
                        r = self.headers.get("Range")
                        self.close_connection = True
                        if r is None:
                            # Half the body, then the connection ends: the
                            # next try resumes with a Range.
                            self.send_response(200)
                            self.send_header("Content-Length", str(FULL))
                            self.send_header("ETag", '"v1"')
                            self.end_headers()
                            self.wfile.write(b"a" * (1 << 20))
                            return
                        start = int(r.split("=")[1].split("-")[0])
                        self.send_response(206)
                        if MODE == "end":
                            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, MAX, FULL))
                            self.send_header("Content-Length", "16")
                        elif MODE == "length":
                            self.send_header("Content-Range", "bytes %d-%d/*" % (start, start + 15))
                            self.send_header("Content-Length", str(MAX))
                        else:
                            self.send_header("Content-Range", "bytes %d-" % start)
                            self.send_header("Content-Length", "16")
                        self.send_header("ETag", '"v1"')
                        self.end_headers()
                        sys.stderr.write("served %s from %d\\n" % (MODE, start))
                        sys.stderr.flush()
                        try:
                            self.wfile.write(b"a" * 16)
                        except (ConnectionResetError, BrokenPipeError):
                            pass
                """, arguments: [mode], path: "/edge.bin")
            defer { server.signal(SIGTERM) }
            try h.config("max_tries = 2\ndownloads = [{ url = \"\(url)\", dest = \"edge.bin\" }]")
            let daemon = try h.start()
            _ = try await server.waitForLine(containing: "served \(mode) from ")
            switch mode {
            case "end":
                let discarded = try await daemon.waitForLine(containing: "discarded a 206 answer")
                #expect(discarded.contains("-9223372036854775807/2097152\", which ends before the total"), "\(discarded)")
            case "no-total":
                let discarded = try await daemon.waitForLine(containing: "discarded a 206 answer")
                #expect(discarded.contains("- and the server sent Content-Range \"bytes "), "\(discarded)")
            default:
                #expect(!daemon.output.contains { $0.contains("discarded a 206 answer") }, "\(daemon.output)")
            }
            // Still here, and still answering for the download it gave up.
            _ = try await daemon.waitForLine(containing: "download 1 failed")
            #expect(try await h.waitForProperty(1, "State") { $0 == "s \"failed\"" } == "s \"failed\"")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        /// A real full filesystem (a 4 MiB tmpfs over the download dir, in
        /// vigild's own mount namespace): the download fails saying so and
        /// its part is removed, so the filesystem is not left full.
        @Test func noSpaceRemovesThePart() async throws {
            let h = try Harness()
            defer { h.stop() }
            try h.nginx.makeFile("large.bin", size: 24 << 20)
            try h.config("downloads = [{ url = \"\(h.nginx.baseURL)/large.bin\" }]")
            try FileManager.default.createDirectory(atPath: h.downloads, withIntermediateDirectories: true)
            let daemon = try h.start(["/usr/bin/unshare", "-m", "/bin/sh", "-c",
                                      "mount -t tmpfs -o size=4m vigil-dl \"$0\" && exec \"$@\"", h.downloads, Build.vigild])
            let failed = try await daemon.waitForLine(containing: "download 1 failed")
            #expect(failed.contains("No space left on device") && failed.contains("the partial file was removed"), "\(failed)")
            let seen = "/proc/\(daemon.pid)/root" + h.downloads
            #expect(h.size(seen + "/large.bin.part") == -1)
            #expect(try h.property(1, "LastError").contains("partial file was removed"))
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func aFullDiskFailsTheDownloadAndTheHostKeepsRunning() async throws {
            let h = try Harness()
            defer { h.stop() }
            try h.nginx.makeFile("large.bin", size: 24 << 20)
            try h.nginx.makeFile("small.bin", size: 100_000)
            try h.config("downloads = [{ url = \"\(h.nginx.baseURL)/large.bin\" }]")
            // A file-size limit of 8 MiB stands in for a full disk: writes
            // past it fail with EFBIG (SIGXFSZ ignored, as a daemon would).
            let wrapper = ["/usr/bin/python3", "-c", """
                import os, resource, signal, sys
                resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                os.execv(sys.argv[1], sys.argv[1:])
                """, Build.vigild]
            let daemon = try h.start(wrapper)
            let failed = try await daemon.waitForLine(containing: "download 1 failed")
            #expect(failed.contains("File too large"), "\(failed)")
            #expect(h.size(h.downloads + "/large.bin") == -1)
            let good = try h.enqueue("\(h.nginx.baseURL)/small.bin", "")
            #expect(good.status == 0, "\(good.stderr)")
            try await daemon.waitForLine(containing: "download 2 completed")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }
    }
}

enum DestinationCheck {
    static func real(_ path: String) -> String {
        guard let p = realpath(path, nil) else { return path }
        defer { free(p) }
        return String(cString: p)
    }
}
