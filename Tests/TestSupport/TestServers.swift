import Foundation
import Glibc
import VigilKitTesting

/// A real server process (mosquitto, kamailio) the voip-socket tests start
/// in a temporary directory on loopback, and stop by its pid.
public final class TestServerProcess: @unchecked Sendable {
    // Invariant: `pid` is only changed by start/stop, which the test calls
    // from one task; the log file is read, never written, by the test.
    public let directory: String
    public let program: String
    public let arguments: [String]
    public let logFile: String
    public let ports: [Int]
    /// Where the server listens: 127.0.0.1, or its side of `network`.
    public let host: String
    public let network: TestNetwork?
    private var pid: pid_t = 0

    /// Starts `program`; inside `network`'s namespace when given.
    public init(program: String, arguments: [String], directory: String, ports: [Int], network: TestNetwork? = nil) throws {
        self.program = program
        self.arguments = arguments
        self.directory = directory
        self.ports = ports
        self.network = network
        host = network?.serverAddress ?? "127.0.0.1"
        logFile = directory + "/server.log"
        try start()
    }

    public func start() throws {
        // `ip netns exec` enters the namespace and execs the program: the pid stays the server's.
        let (path, argv) = network.map { ("/usr/sbin/ip", ["netns", "exec", $0.namespace, program] + arguments) } ?? (program, arguments)
        pid = try spawnQuietly(path, argv, environment: ["PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": directory],
                               stdout: logFile + ".out", stderr: logFile)
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            if ports.allSatisfy({ TestNginx.canConnect(port: $0, host: host) }) { return }
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                pid = 0
                throw DescribedError("\(program) exited at start: \(log)")
            }
            usleep(20_000)
        }
        stop()
        throw DescribedError("\(program) did not listen on \(ports) within 20 s: \(log)")
    }

    public func stop() {
        guard pid > 0 else { return }
        // Its children (kamailio's workers), known before they can be
        // orphaned: a server killed before it ended them leaves them running
        // past the suite (a stress run left a kamailio worker behind).
        let children = processes().dropFirst()
        defer {
            for child in children where [pid, 1].contains(Self.parent(of: child)) { kill(child, SIGKILL) }
            pid = 0
        }
        kill(pid, SIGTERM)
        var status: Int32 = 0
        for _ in 0..<200 {
            if waitpid(pid, &status, WNOHANG) == pid { return }
            usleep(10_000)
        }
        kill(pid, SIGKILL)
        waitpid(pid, &status, 0)
    }

    /// The parent of process `pid` (/proc/PID/stat), or nil if it is gone.
    private static func parent(of pid: pid_t) -> pid_t? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8), let close = stat.lastIndex(of: ")") else { return nil }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        return fields.count > 1 ? pid_t(fields[1]) : nil
    }

    /// Freezes (SIGSTOP) or thaws (SIGCONT) the server and its children
    /// (kamailio's workers), each by its pid.
    public func freeze(_ frozen: Bool) {
        for p in processes() { kill(p, frozen ? SIGSTOP : SIGCONT) }
    }

    /// Freezes the server and its children and returns once the kernel
    /// shows each stopped: `kill()` only queues SIGSTOP, and a server that
    /// runs on a little (a loaded machine) answers one more ping, which a
    /// test timing the detection from here would count.
    public func freezeUntilStopped() async {
        let pids = processes()
        for p in pids { kill(p, SIGSTOP) }
        for p in pids { _ = await processIsStopped(p) }
    }

    /// The server's pid and its children's.
    private func processes() -> [pid_t] {
        guard pid > 0 else { return [] }
        var pids = [pid]
        if let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc") {
            for entry in entries {
                if let child = pid_t(entry), Self.parent(of: child) == pid { pids.append(child) }
            }
        }
        return pids
    }

    public var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }

    public func lines(containing text: String) -> [String] { log.split(separator: "\n").map(String.init).filter { $0.contains(text) } }

    /// Waits (bounded) until the log has `count` lines containing `text`.
    /// The server is another process: its log file is the event to watch.
    public func waitForLog(_ text: String, count: Int = 1, timeout: Duration = .seconds(15)) async -> Bool {
        let end = ContinuousClock.now + timeout
        while ContinuousClock.now < end {
            if lines(containing: text).count >= count { return true }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return lines(containing: text).count >= count
    }

    deinit { stop() }
}

/// A network namespace joined to the test's by a veth pair: a server started
/// inside it (``TestServerProcess``) is reached at `serverAddress`, and
/// taking its link down makes that peer unreachable (its kernel neither
/// acknowledges nor resets) without touching loopback, which other tests
/// share. Removed (with both veth ends) by `remove()`.
public final class TestNetwork: Sendable {
    public let namespace: String
    public let serverAddress: String
    private let hostLink: String
    private let serverLink: String

    public init() throws {
        let tag = String(UInt32.random(in: 0...UInt32.max), radix: 16)
        namespace = "vigil-test-\(tag)"
        hostLink = "vgh\(tag)"
        serverLink = "vgn\(tag)"
        // A random /30 in 10.64.0.0/10, unlikely to meet another test's.
        let prefix = "10.\(Int.random(in: 64...127)).\(Int.random(in: 0...255))"
        let base = 4 * Int.random(in: 0...63)
        serverAddress = "\(prefix).\(base + 2)"
        try ProcessRunner.checkedOutput("/usr/sbin/ip", ["netns", "add", namespace])
        do {
            try ProcessRunner.checkedOutput("/usr/sbin/ip", ["link", "add", hostLink, "type", "veth", "peer", "name", serverLink, "netns", namespace])
            try ProcessRunner.checkedOutput("/usr/sbin/ip", ["addr", "add", "\(prefix).\(base + 1)/30", "dev", hostLink])
            try ProcessRunner.checkedOutput("/usr/sbin/ip", ["link", "set", hostLink, "up"])
            try inside(["ip", "addr", "add", "\(serverAddress)/30", "dev", serverLink])
            try inside(["ip", "link", "set", "lo", "up"])
            try inside(["ip", "link", "set", serverLink, "up"])
        } catch {
            remove()
            throw error
        }
    }

    /// Takes the server's link down (packets to it are dropped) or up again.
    public func setReachable(_ reachable: Bool) throws {
        try inside(["ip", "link", "set", serverLink, reachable ? "up" : "down"])
    }

    public func remove() {
        _ = try? ProcessRunner.run("/usr/sbin/ip", ["netns", "del", namespace])
    }

    private func inside(_ command: [String]) throws {
        try ProcessRunner.checkedOutput("/usr/sbin/ip", ["netns", "exec", namespace] + command)
    }
}

/// A temporary directory (the caller removes it).
public func makeTemporaryDirectory(_ prefix: String) throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// mosquitto on 127.0.0.1, or inside `network` (plain, and TLS with
/// `certificates`), logging every packet, optionally with one user and password.
public enum TestMosquitto {
    /// With `user`, clients that give a user name must give its password;
    /// clients without one are let in only with `anonymous`.
    /// `options`: more lines of mosquitto.conf, such as `max_keepalive 10`.
    public static func start(in directory: String, user: (String, String)? = nil, anonymous: Bool = false, certificates: TestCertificates? = nil,
                      port: Int? = nil, tlsPort: Int? = nil, network: TestNetwork? = nil,
                      options: [String] = []) throws -> (server: TestServerProcess, port: Int, tlsPort: Int?) {
        let port = try port ?? TestNginx.freePort()
        let host = network?.serverAddress ?? "127.0.0.1"
        var config = """
            user root
            log_dest stderr
            log_type all
            connection_messages true
            per_listener_settings false
            listener \(port) \(host)

            """
        for option in options { config += option + "\n" }
        var tls: Int?
        if let certificates {
            let p = try tlsPort ?? TestNginx.freePort()
            tls = p
            config += """
                listener \(p) \(host)
                cafile \(certificates.caCertificate)
                certfile \(certificates.serverCertificate)
                keyfile \(certificates.serverKey)

                """
        }
        if let (name, password) = user {
            let file = directory + "/passwords"
            try "".write(toFile: file, atomically: true, encoding: .utf8)
            try ProcessRunner.checkedOutput("/usr/bin/mosquitto_passwd", ["-b", file, name, password])
            config += "allow_anonymous \(anonymous)\npassword_file \(file)\n"
        } else {
            config += "allow_anonymous true\n"
        }
        try config.write(toFile: directory + "/mosquitto.conf", atomically: true, encoding: .utf8)
        let server = try TestServerProcess(
            program: "/usr/sbin/mosquitto", arguments: ["-c", directory + "/mosquitto.conf"], directory: directory,
            ports: [port] + (tls.map { [$0] } ?? []), network: network)
        return (server, port, tls)
    }

    /// Publishes `message` to `topic` with mosquitto_pub (a third-party
    /// client); `options` such as MQTT 5 and its properties go before. Waits
    /// on a thread of its own: blocking one of the cooperative pool's two
    /// threads here (this machine has two cores) delayed the in-process
    /// strategy's pings under CI's load.
    public static func publish(port: Int, topic: String, message: String, user: (String, String)? = nil, options: [String] = [],
                        clientID: String = "test-publisher") async throws {
        let arguments = options + ["-h", "127.0.0.1", "-p", String(port), "-t", topic, "-m", message, "-i", clientID]
            + (user.map { ["-u", $0.0, "-P", $0.1] } ?? [])
        let result = try await ProcessRunner.runDetached("/usr/bin/mosquitto_pub", arguments)
        guard result.status == 0 else { throw CommandFailure(command: ["/usr/bin/mosquitto_pub"] + arguments, result: result) }
    }
}

/// kamailio on 127.0.0.1 (or inside `network`) as a SIP registrar over TCP (and TLS with
/// `certificates`): REGISTER is saved in memory (usrloc), with a digest
/// challenge when `password` is set; `flowTimer` adds a Flow-Timer header
/// to the 200; MESSAGE requests are relayed to the registered contact.
/// Its bindings are read with `kamcmd ul.dump` over the ctl socket.
public enum TestKamailio {
    public static func start(in directory: String, password: String? = nil, flowTimer: Int? = nil,
                      certificates: TestCertificates? = nil, network: TestNetwork? = nil) throws -> (server: TestServerProcess, port: Int, tlsPort: Int?) {
        let port = try TestNginx.freePort()
        let tlsPort = try certificates.map { _ in try TestNginx.freePort() }
        let host = network?.serverAddress ?? "127.0.0.1"
        var listen = "listen=tcp:\(host):\(port)\n"
        var tlsModule = ""
        if let certificates, let tlsPort {
            listen += "listen=tls:\(host):\(tlsPort)\nenable_tls=yes\n"
            try """
                [server:default]
                method = TLSv1.2+
                verify_certificate = no
                require_certificate = no
                private_key = \(certificates.serverKey)
                certificate = \(certificates.serverCertificate)

                [client:default]
                verify_certificate = no
                require_certificate = no

                """.write(toFile: directory + "/tls.cfg", atomically: true, encoding: .utf8)
            tlsModule = "loadmodule \"tls.so\"\nmodparam(\"tls\", \"config\", \"\(directory)/tls.cfg\")\n"
        }
        let auth = password.map { p in
            """
                    if (!pv_www_authenticate("$td", "\(p)", "0")) {
                        www_challenge("$td", "1");
                        exit;
                    }

            """
        } ?? ""
        let flow = flowTimer.map { "        append_to_reply(\"Flow-Timer: \($0)\\r\\n\");\n" } ?? ""
        try """
            #!KAMAILIO
            debug=2
            log_stderror=yes
            fork=yes
            children=1
            tcp_children=2
            disable_sctp=yes
            auto_aliases=no
            alias="example.org"
            \(listen)
            mpath="/usr/lib/x86_64-linux-gnu/kamailio/modules/"
            loadmodule "tm.so"
            loadmodule "sl.so"
            loadmodule "pv.so"
            loadmodule "xlog.so"
            loadmodule "textops.so"
            loadmodule "usrloc.so"
            loadmodule "registrar.so"
            loadmodule "auth.so"
            loadmodule "ctl.so"
            \(tlsModule)
            modparam("ctl", "binrpc", "unix:\(directory)/kamailio.ctl")
            modparam("registrar", "min_expires", 1)
            modparam("registrar", "default_expires", 60)

            request_route {
                xlog("L_INFO", "received $rm from $si:$sp over $pr cseq $cs\\n");
                if (is_method("REGISTER")) {
            \(auth)\(flow)
                    if (!save("location")) {
                        sl_reply_error();
                    }
                    xlog("L_INFO", "registered $tu contact $ct expires $hdr(Expires)\\n");
                    exit;
                }
                if (is_method("MESSAGE")) {
                    if (!lookup("location")) {
                        sl_send_reply("404", "Not Found");
                        exit;
                    }
                    t_relay();
                    exit;
                }
                sl_send_reply("405", "Method Not Allowed");
            }

            """.write(toFile: directory + "/kamailio.cfg", atomically: true, encoding: .utf8)
        let server = try TestServerProcess(
            program: "/usr/sbin/kamailio",
            arguments: ["-f", directory + "/kamailio.cfg", "-DD", "-E", "-w", directory, "-Y", directory, "-P", directory + "/kamailio.pid"],
            directory: directory, ports: [port] + (tlsPort.map { [$0] } ?? []), network: network)
        return (server, port, tlsPort)
    }
}

extension TestKamailio {
    /// The Contact addresses kamailio holds now for every AOR (`kamcmd ul.dump`).
    public static func bindings(of server: TestServerProcess) throws -> [String] {
        let out = try ProcessRunner.checkedOutput("/usr/sbin/kamcmd", ["-s", "unix:\(server.directory)/kamailio.ctl", "ul.dump"])
        return out.split(separator: "\n").compactMap { line in
            let text = line.trimmingCharacters(in: .whitespaces)
            return text.hasPrefix("Address: ") ? String(text.dropFirst(9)) : nil
        }
    }

    /// Registers `contact` for sip:alice@example.org for `expires` seconds
    /// from a client of its own (python3's socket module: another device),
    /// without credentials; returns the registrar's answer.
    @discardableResult
    public static func registerAnotherDevice(port: Int, contact: String, expires: Int) throws -> String {
        let callID = "other-\(UInt32.random(in: 0...UInt32.max))"
        let script = """
            import socket, sys
            s = socket.create_connection(("127.0.0.1", \(port)))
            local = "%s:%d" % s.getsockname()
            request = ("REGISTER sip:example.org SIP/2.0\\r\\nVia: SIP/2.0/TCP " + local + ";branch=z9hG4bK" + sys.argv[1] + "\\r\\n"
                "Max-Forwards: 70\\r\\nFrom: <sip:alice@example.org>;tag=o1\\r\\nTo: <sip:alice@example.org>\\r\\n"
                "Call-ID: " + sys.argv[1] + "\\r\\nCSeq: 1 REGISTER\\r\\nContact: " + sys.argv[2] + "\\r\\n"
                "Expires: " + sys.argv[3] + "\\r\\nContent-Length: 0\\r\\n\\r\\n")
            s.sendall(request.encode())
            answer = b""
            while b"\\r\\n\\r\\n" not in answer:
                chunk = s.recv(4096)
                if not chunk: break
                answer += chunk
            sys.stdout.write(answer.decode())
            s.close()
            """
        return try ProcessRunner.checkedOutput("/usr/bin/python3", ["-c", script, callID, contact, String(expires)])
    }
}

/// Tests/Fixtures/voip-pong-server.py as a ``TestServerProcess``: the raw
/// protocol's peer (CRLFCRLF ping, CRLF pong), over TLS with `certificates`;
/// `rcvbuf` shrinks its sockets' receive buffers (a frozen server's window
/// then fills at once); `contacts` makes it a registrar whose 200 to
/// REGISTER carries these Contact header lines ("{ours}": the request's
/// Contact, "{instance}": its +sip.instance).
public enum TestPongServer {
    public static func start(in directory: String, certificates: TestCertificates? = nil, network: TestNetwork? = nil,
                      rcvbuf: Int? = nil, contacts: [String] = []) throws -> (server: TestServerProcess, port: Int) {
        let port = try TestNginx.freePort()
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Fixtures/voip-pong-server.py").path
        let tls = certificates.map { ["--tls", $0.serverCertificate, $0.serverKey] } ?? []
        let buffer = rcvbuf.map { ["--rcvbuf", String($0)] } ?? []
        let registrar = contacts.flatMap { ["--contact", $0] }
        let server = try TestServerProcess(
            program: "/usr/bin/python3", arguments: [script, "--host", network?.serverAddress ?? "127.0.0.1", "--port", String(port)] + tls + buffer + registrar,
            directory: directory, ports: [port], network: network)
        return (server, port)
    }
}

/// A test's failure with its own words.
public struct DescribedError: Error, CustomStringConvertible {
    public var description: String
    public init(_ d: String) { description = d }
}

/// Runs a program to its end; returns what it printed (stdout, then
/// stderr) and its exit status.

/// Whether process `pid` is stopped ("T" in /proc/PID/stat), waiting up to
/// 10 s for it: a SIGSTOP is queued by `kill()` and taken later.
public func processIsStopped(_ pid: pid_t) async -> Bool {
    for _ in 0..<10_000 {
        if let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
           let end = stat.lastIndex(of: ")"), stat[end...].dropFirst(2).first == "T" {
            return true
        }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return false
}
