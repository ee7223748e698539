import Foundation
import Glibc
import VigilKit
import VigilKitTesting

/// An nginx on 127.0.0.1 with a temporary prefix, serving the files of
/// `root` (nginx answers Range, If-Range and sends strong ETags for static
/// files). Stopped with SIGKILL by `stop()`.
///
/// Locations: `/` serves `root` at full speed; `/slow/` serves the same
/// files at `slowRate` bytes a second (so a test can interrupt a transfer).
/// The access log (`accessLog`) has one line per request:
/// `<status> <body bytes sent> "<request line>" range="<Range>" if-range="<If-Range>" host="<Host>"`.
///
/// `locations` is added to that server block; `servers` is added to the
/// `http` block (more `server { ... }` blocks, e.g. a forward proxy or an
/// https listener); in both, `{prefix}` is replaced by the prefix
/// directory, and the log format `vigil` can be used.
public final class TestNginx: @unchecked Sendable {
    // Invariant: every stored property is set in init and never changes.
    public let port: Int
    public let prefix: String
    public let root: String
    public let accessLog: String
    private let process: Process

    public var baseURL: String { "http://127.0.0.1:\(port)" }

    public init(slowRate: String = "4m", locations: String = "", servers: String = "") throws {
        let prefix = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-nginx-\(UUID().uuidString)").path
        for sub in ["www", "logs", "tmp"] {
            try FileManager.default.createDirectory(atPath: prefix + "/" + sub, withIntermediateDirectories: true)
        }
        let port = try Self.freePort()
        let config = """
            user root;
            daemon off;
            master_process off;
            worker_processes 1;
            pid \(prefix)/nginx.pid;
            error_log \(prefix)/logs/error.log;
            events { worker_connections 64; }
            http {
                log_format vigil '$status $body_bytes_sent "$request" range="$http_range" if-range="$http_if_range" host="$http_host"';
                access_log \(prefix)/logs/access.log vigil;
                client_body_temp_path \(prefix)/tmp/body;
                proxy_temp_path \(prefix)/tmp/proxy;
                fastcgi_temp_path \(prefix)/tmp/fastcgi;
                uwsgi_temp_path \(prefix)/tmp/uwsgi;
                scgi_temp_path \(prefix)/tmp/scgi;
                sendfile on;
                default_type application/octet-stream;
                server {
                    listen 127.0.0.1:\(port);
                    root \(prefix)/www;
                    location /slow/ { alias \(prefix)/www/; limit_rate \(slowRate); }
                    location = /redirect { return 302 /; }
                    \(locations.replacingOccurrences(of: "{prefix}", with: prefix))
                }
                \(servers.replacingOccurrences(of: "{prefix}", with: prefix))
            }
            """
        try config.write(toFile: prefix + "/nginx.conf", atomically: true, encoding: .utf8)
        let process = ProcessRunner.process("/usr/sbin/nginx")
        process.arguments = ["-p", prefix, "-c", prefix + "/nginx.conf", "-e", prefix + "/logs/error.log"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        self.port = port
        self.prefix = prefix
        self.root = prefix + "/www"
        self.accessLog = prefix + "/logs/access.log"
        self.process = process
        try waitUntilListening()
    }

    /// Waits (at most 10 s) until nginx accepts connections.
    private func waitUntilListening() throws {
        for _ in 0..<1000 {
            if Self.canConnect(port: port) { return }
            guard process.isRunning else { break }
            usleep(10_000)
        }
        let errors = (try? String(contentsOfFile: prefix + "/logs/error.log", encoding: .utf8)) ?? ""
        stop()
        throw NSError(domain: "TestNginx", code: 1, userInfo: [NSLocalizedDescriptionKey: "nginx did not start listening on 127.0.0.1:\(port): \(errors)"])
    }

    /// The lines of the access log so far.
    public func requests() -> [String] {
        lines(ofLog: "access.log")
    }

    /// The lines so far of `<prefix>/logs/<name>` (a log an extra server writes).
    public func lines(ofLog name: String) -> [String] {
        ((try? String(contentsOfFile: prefix + "/logs/" + name, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// Writes `size` bytes of pseudo-random data (a fixed pattern seeded by
    /// `seed`, repeated) to `name` under the root, fast: one 1 MiB block
    /// written again and again, with its first 8 bytes varied per block so
    /// no two blocks are equal.
    @discardableResult
    public func makeFile(_ name: String, size: Int, seed: UInt64 = 1) throws -> String {
        let path = root + "/" + name
        var generator = SplitMix(seed: seed)
        let blockSize = 1 << 20
        var block = [UInt8](repeating: 0, count: blockSize)
        block.withUnsafeMutableBytes { raw in
            let words = raw.bindMemory(to: UInt64.self)
            for i in words.indices { words[i] = generator.next() }
        }
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        defer { close(fd) }
        var left = size
        var index: UInt64 = 0
        while left > 0 {
            block.withUnsafeMutableBytes { $0.storeBytes(of: index ^ seed << 32, as: UInt64.self) }
            let n = min(left, blockSize)
            let written = block.withUnsafeBytes { write(fd, $0.baseAddress, n) }
            guard written == n else { throw POSIXError(.EIO) }
            left -= n
            index += 1
        }
        return path
    }

    public func stop() {
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: prefix)
    }

    /// A TCP port on 127.0.0.1 that nothing is bound to now, for a server
    /// the test starts next.
    ///
    /// It comes from below the kernel's ephemeral range
    /// (`net.ipv4.ip_local_port_range`), so no connection's source port can
    /// take it before the server binds it. A port from `bind(0)` lies inside
    /// that range, and under load an outgoing loopback connection of another
    /// test took one in the moment between its release and the server's
    /// bind: `voip-pong-server.py` exited at start with EADDRINUSE
    /// (2026-12-03). Each port is handed out once per test process, so tests
    /// that run in parallel never get the same one.
    public static func freePort() throws -> Int {
        let low = ephemeralLowPort()
        guard low > 11_000 else { return try kernelPickedPort() }
        let range = 10_000..<low
        let start = Int.random(in: range)
        for offset in 0..<range.count {
            let port = range.lowerBound + (start - range.lowerBound + offset) % range.count
            let fresh = handedOut.withLock { ports in ports.insert(port).inserted }
            if fresh, isFree(port) { return port }
        }
        throw POSIXError(.EADDRINUSE)
    }

    private static let handedOut = Lock<Set<Int>>([])

    /// The first port of the kernel's ephemeral range (32768 by default).
    private static func ephemeralLowPort() -> Int {
        let text = (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8)) ?? ""
        return text.split(whereSeparator: { $0 == " " || $0 == "\t" || $0 == "\n" }).first.flatMap { Int($0) } ?? 32_768
    }

    /// Whether a TCP socket can bind 127.0.0.1:`port` now (no listener, no
    /// connection, nothing in TIME_WAIT on it).
    private static func isFree(_ port: Int) -> Bool {
        (try? bound(port: port)) == port
    }

    /// A port the kernel picks (bind to port 0, then released): for a
    /// machine whose ephemeral range leaves no room below it.
    private static func kernelPickedPort() throws -> Int {
        try bound(port: 0)
    }

    /// Binds a TCP socket to 127.0.0.1:`port`, closes it, and returns the port it had.
    private static func bound(port: Int) throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EIO) }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let result = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        guard result == 0 else { throw POSIXError(.EADDRINUSE) }
        let named = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        guard named == 0 else { throw POSIXError(.EIO) }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// True when something accepts TCP connections on `host` (IPv4, default 127.0.0.1) port `port`.
    public static func canConnect(port: Int, host: String = "127.0.0.1") -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr(host)
        address.sin_port = UInt16(port).bigEndian
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        } == 0
    }
}

/// A listening socket that never accepts and never answers: the kernel
/// completes the handshake, the client sends its request, nothing comes
/// back (a stalled server).
public final class SilentServer: @unchecked Sendable {
    // Invariant: set in init, closed once in stop().
    public let port: Int
    private let fd: Int32

    public init() throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw POSIXError(.EIO) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        guard bound == 0, listen(fd, 16) == 0 else { close(fd); throw POSIXError(.EADDRINUSE) }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        self.fd = fd
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    public func stop() { close(fd) }
}

/// SplitMix64: fast, seedable test data (and a benchmark's reproducible data).
public struct SplitMix {
    public var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
