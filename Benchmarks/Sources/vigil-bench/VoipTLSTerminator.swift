import Foundation
import Glibc
import VigilTestSupport

/// `vigil-bench voip-socket --tls`: nginx's stream module terminating TLS on
/// 127.0.0.1 in front of the plain pong server, with a throw-away CA
/// (``TestCertificates``), so the strategy and the bare reference loop both
/// run the same TLS sessions against the same server.
///
/// nginx holds two descriptors per connection (the TLS side and the
/// upstream), and a worker cannot raise RLIMIT_NOFILE past the hard limit
/// (20,000 here without CAP_SYS_RESOURCE): one worker would stop short of
/// 10,000 connections. So it runs enough workers that each stays within the
/// limit, each with its own listening socket (`reuseport`), among which the
/// kernel spreads the connections.
final class VoipTLSTerminator {
    let certificates: TestCertificates
    let port: Int
    private let process = Process()

    /// `placement`: nginx's workers run on its far end's core.
    init(upstreamPort: UInt16, connections: Int, placement: CorePlacement? = nil) throws {
        certificates = try TestCertificates()
        let dir = certificates.directory
        port = try TestNginx.freePort()
        var limit = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        let perWorker = max(2_000, Int(min(limit.rlim_max, 1 << 20)) - 500)
        // One worker more than the even split needs: reuseport spreads by a
        // hash of the addresses, not exactly evenly.
        workers = (2 * connections + perWorker - 1) / perWorker + 1
        try """
            load_module /usr/lib/nginx/modules/ngx_stream_module.so;
            user root;
            daemon off;
            worker_processes \(workers);
            \(placement.map { "worker_cpu_affinity \($0.nginxAffinity(workers: workers));" } ?? "")
            worker_rlimit_nofile \(perWorker);
            pid \(dir)/nginx.pid;
            error_log \(dir)/error.log warn;
            events { worker_connections \(perWorker - 100); }
            stream {
                server {
                    listen 127.0.0.1:\(port) ssl backlog=4096 reuseport;
                    ssl_certificate \(certificates.serverCertificate);
                    ssl_certificate_key \(certificates.serverKey);
                    proxy_pass 127.0.0.1:\(upstreamPort);
                }
            }
            """.write(toFile: dir + "/nginx.conf", atomically: true, encoding: .utf8)
        process.executableURL = URL(fileURLWithPath: "/usr/sbin/nginx")
        process.arguments = ["-p", dir, "-c", dir + "/nginx.conf", "-e", dir + "/error.log"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        for _ in 0..<500 {
            if TestNginx.canConnect(port: port) { return }
            usleep(10_000)
        }
        stop()
        let log = (try? String(contentsOfFile: dir + "/error.log", encoding: .utf8)) ?? ""
        throw BenchError("nginx (TLS terminator) did not listen on 127.0.0.1:\(port): \(log)")
    }

    var address: String { "127.0.0.1:\(port)" }
    /// nginx worker processes.
    let workers: Int

    func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            process.waitUntilExit()
        }
        certificates.remove()
    }
}
