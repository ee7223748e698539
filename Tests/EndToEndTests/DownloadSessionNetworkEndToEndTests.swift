import Foundation
import Glibc
import Testing
import VigilTestSupport

/// Issue 7's "http and https, redirects, and proxies from the environment",
/// through the built vigild against nginx on 127.0.0.1.
extension EndToEnd {
    @Suite struct DownloadSessionNetworkEndToEndTests {
        typealias Harness = DownloadSessionEndToEndTests.Harness

        /// The id vigild gave the download of `url` (from its "try 1: GET" line).
        static func downloadID(of url: String, in daemon: Daemon) async throws -> Int {
            let line = try await daemon.waitForLine(containing: "try 1: GET \(url)")
            let words = line.split(separator: " ")
            guard let at = words.firstIndex(of: "download"), at + 1 < words.count, let id = Int(words[at + 1]) else {
                throw DaemonError("no download id in \"\(line)\"")
            }
            return id
        }

        @Test func redirectsAreFollowedAndLoopsAndOtherSchemesFailClearly() async throws {
            let h = try Harness(locations: """
                location = /found { return 302 /x.bin; }
                location = /moved { return 301 /found; }
                location = /loop { return 302 /loop; }
                location = /to-ftp { return 302 ftp://127.0.0.1:21/x.bin; }
                """)
            defer { h.stop() }
            let file = try h.nginx.makeFile("x.bin", size: 3 << 20, seed: 11)
            let digest = try DownloadSessionEndToEndTests.sha256(file)
            let base = h.nginx.baseURL
            try h.config("""
                max_parallel = 4
                max_tries = 3
                downloads = [
                    { url = "\(base)/found", dest = "found.bin", sha256 = "\(digest)" },
                    { url = "\(base)/moved", dest = "moved.bin", sha256 = "\(digest)" },
                    { url = "\(base)/loop", dest = "loop.bin" },
                    { url = "\(base)/to-ftp", dest = "ftp.bin" },
                ]
                """)
            let daemon = try h.start()
            let found = try await Self.downloadID(of: "\(base)/found", in: daemon)
            let moved = try await Self.downloadID(of: "\(base)/moved", in: daemon)
            let loop = try await Self.downloadID(of: "\(base)/loop", in: daemon)
            let ftp = try await Self.downloadID(of: "\(base)/to-ftp", in: daemon)
            try await daemon.waitForLine(containing: "download \(found) completed")
            try await daemon.waitForLine(containing: "download \(moved) completed")
            #expect(try DownloadSessionEndToEndTests.sha256(h.downloads + "/found.bin") == digest)
            #expect(try DownloadSessionEndToEndTests.sha256(h.downloads + "/moved.bin") == digest)

            // A loop fails on the first try (retrying gets the same loop), after libcurl's 10 redirects.
            let loopFailed = try await daemon.waitForLine(containing: "download \(loop) failed")
            #expect(loopFailed.contains("too many redirects") && loopFailed.contains("\(base)/loop"), "\(loopFailed)")
            #expect(try h.property(loop, "LastError").contains("redirect loop"))
            #expect(try h.property(loop, "Attempts") == "u 1")
            #expect(h.nginx.requests().filter { $0.contains("\"GET /loop ") }.count == 11, "\(h.nginx.requests())")

            // A redirect to ftp:// is refused: nothing connects to port 21, nothing is written.
            let ftpFailed = try await daemon.waitForLine(containing: "download \(ftp) failed")
            #expect(ftpFailed.contains("unsupported scheme") && ftpFailed.contains("ftp"), "\(ftpFailed)")
            #expect(try h.property(ftp, "State") == "s \"failed\"")
            #expect(try h.property(ftp, "Attempts") == "u 1")
            for name in ["loop.bin", "loop.bin.part", "ftp.bin", "ftp.bin.part"] {
                #expect(h.size(h.downloads + "/" + name) <= 0, "\(name)")
            }
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func httpProxyFromTheEnvironmentIsUsedAndNoProxyBypassesIt() async throws {
            let proxyPort = try TestNginx.freePort()
            // A forward proxy: absolute-URI requests are passed to the host they name.
            let h = try Harness(servers: """
                server {
                    listen 127.0.0.1:\(proxyPort);
                    access_log {prefix}/logs/proxy.log vigil;
                    location / { proxy_pass http://$http_host$request_uri; }
                }
                """)
            defer { h.stop() }
            let file = try h.nginx.makeFile("p.bin", size: 2 << 20, seed: 12)
            let digest = try DownloadSessionEndToEndTests.sha256(file)
            let viaProxy = "http://127.0.0.1:\(h.nginx.port)/p.bin"
            let direct = "http://localhost:\(h.nginx.port)/p.bin"
            try h.config("""
                downloads = [
                    { url = "\(viaProxy)", dest = "proxied.bin", sha256 = "\(digest)" },
                    { url = "\(direct)", dest = "direct.bin", sha256 = "\(digest)" },
                ]
                """)
            let daemon = try h.start(environment: ["http_proxy": "http://127.0.0.1:\(proxyPort)", "no_proxy": "localhost"])
            let proxied = try await Self.downloadID(of: viaProxy, in: daemon)
            let bypassed = try await Self.downloadID(of: direct, in: daemon)
            try await daemon.waitForLine(containing: "download \(proxied) completed")
            try await daemon.waitForLine(containing: "download \(bypassed) completed")
            #expect(try DownloadSessionEndToEndTests.sha256(h.downloads + "/proxied.bin") == digest)
            #expect(try DownloadSessionEndToEndTests.sha256(h.downloads + "/direct.bin") == digest)

            let proxyLog = h.nginx.lines(ofLog: "proxy.log")
            #expect(proxyLog.count == 1 && proxyLog.first?.hasPrefix("200 \(2 << 20) \"GET \(viaProxy) ") == true, "\(proxyLog)")
            // The origin saw the proxy's request (nginx proxies with HTTP/1.0) and the direct one.
            let origin = h.nginx.requests()
            #expect(origin.contains { $0.contains("\"GET /p.bin HTTP/1.0\"") && $0.contains("host=\"127.0.0.1:\(h.nginx.port)\"") }, "\(origin)")
            #expect(origin.contains { $0.contains("\"GET /p.bin HTTP/1.1\"") && $0.contains("host=\"localhost:\(h.nginx.port)\"") }, "\(origin)")
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func httpsVerifiesAgainstCAFileAndAnUntrustedCertificateFailsClearly() async throws {
            let certs = try TestCertificates()
            defer { certs.remove() }
            let tlsPort = try TestNginx.freePort()
            let h = try Harness(servers: """
                server {
                    listen 127.0.0.1:\(tlsPort) ssl;
                    ssl_certificate \(certs.serverCertificate);
                    ssl_certificate_key \(certs.serverKey);
                    root {prefix}/www;
                }
                """)
            defer { h.stop() }
            let file = try h.nginx.makeFile("s.bin", size: 2 << 20, seed: 13)
            let digest = try DownloadSessionEndToEndTests.sha256(file)
            let url = "https://127.0.0.1:\(tlsPort)/s.bin"
            let untrustedDir = h.dir.file("untrusted")
            try h.config("""
                ca_file = "\(certs.caCertificate)"
                downloads = [{ url = "\(url)", sha256 = "\(digest)" }]

                [[strategy]]
                name = "untrusted"
                kind = "download-session"
                dir = "\(untrustedDir)"
                max_tries = 3
                downloads = [{ url = "\(url)" }]
                """)
            let daemon = try h.start()
            try await daemon.waitForLine(containing: "download 1 completed")
            #expect(try DownloadSessionEndToEndTests.sha256(h.downloads + "/s.bin") == digest)

            // Without the CA the certificate is refused at once, with a message that says so.
            let failed = try await daemon.waitForLine(containing: "download 1 failed")
            #expect(failed.contains("certificate") && failed.contains("not trusted") && failed.contains("ca_file"), "\(failed)")
            let object = ["org.vigil.Vigil1", "/org/vigil/Vigil1/Strategy/untrusted/Download/1", "org.vigil.Vigil1.Download"]
            let attempts = try h.busctl(["get-property"] + object + ["Attempts"]).stdout
            #expect(attempts.hasPrefix("u 1"), "\(attempts)")
            let lastError = try h.busctl(["get-property"] + object + ["LastError"]).stdout
            #expect(lastError.contains("certificate"), "\(lastError)")
            #expect(h.size(untrustedDir + "/s.bin") == -1 && h.size(untrustedDir + "/s.bin.part") <= 0)
            daemon.signal(SIGTERM)
            #expect(await daemon.waitForExit() == 0)
        }

        @Test func aBadCAFileIsAConfigProblem() throws {
            let dir = try TempDir("vigil-download-ca")
            for (value, expected) in [("ca.pem", "expected an absolute path to a PEM file of CA certificates, found \"ca.pem\""),
                                      (dir.file("missing.pem"), "cannot read the CA file \"\(dir.file("missing.pem"))\": No such file or directory")] {
                let config = try dir.write("vigil.toml", hostConfig(stateDir: dir.file("state")) + """

                    [[strategy]]
                    name = "dl"
                    kind = "download-session"
                    dir = "\(dir.file("downloads"))"
                    ca_file = "\(value)"
                    """)
                let result = try ProcessRunner.run(Build.vigilctl, ["check-config", config])
                #expect(result.status == 1 && result.stderr.contains(expected) && result.stderr.contains("ca_file"), "\(result.stderr)")
            }
        }
    }
}
