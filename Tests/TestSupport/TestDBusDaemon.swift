import Foundation
import Glibc
import VigilDBus
import VigilKitTesting

/// A private `dbus-daemon` started for one test and stopped by `stop()`.
///
/// `--nofork`: a forked daemon would keep our stdout pipe open; the daemon
/// prints its address on the pipe once it listens and stays our child.
/// `stop()` uses SIGKILL: a child spawned from a dispatch thread inherits a
/// signal mask that blocks SIGTERM.
public final class TestDBusDaemon: @unchecked Sendable {
    // Invariant: every stored property is set in init and never changes;
    // `process` is only used to wait for the exit in stop().
    public let address: String
    public let pid: pid_t
    /// The daemon's own temporary directory (config and sockets).
    public let directory: String
    private let process: Process

    /// A session-type bus that any user may connect to (access tests call
    /// as another uid), on which every peer may own names, send to anyone and
    /// eavesdrop (for monitors).
    ///
    /// `listen`: the address to listen on (default `unix:dir=` its own
    /// directory); a fixed `unix:path=` lets a second daemon take the same
    /// address after this one is gone. `limits`: extra `<limit>` elements
    /// (more connections per user than the default 256).
    public convenience init(listen: String? = nil, limits: String = "") throws {
        try self.init(prefix: "vigil-dbus") { directory in
            """
            <type>session</type>
            <listen>\(listen ?? "unix:dir=" + directory)</listen>
            <auth>EXTERNAL</auth>
            <policy context="default">
              <allow user="*"/>
              <allow send_destination="*" eavesdrop="true"/>
              <allow eavesdrop="true"/>
              <allow own="*"/>
            </policy>
            \(limits)
            """
        }
    }

    /// A bus whose `<busconfig>` body `busConfig(directory)` returns.
    public init(prefix: String, busConfig: (String) -> String) throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        chmod(directory, 0o755)  // peers running as other users must reach the socket
        let config = directory + "/bus.conf"
        try """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
        \(busConfig(directory))
        </busconfig>
        """.write(toFile: config, atomically: true, encoding: .utf8)
        let process = ProcessRunner.process("/usr/bin/dbus-daemon")
        process.arguments = ["--config-file=\(config)", "--print-address=1", "--nofork"]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        var buffer = Data()
        while !buffer.contains(UInt8(ascii: "\n")) {
            let chunk = out.fileHandleForReading.availableData
            if chunk.isEmpty { break }
            buffer.append(chunk)
        }
        let line = String(decoding: buffer, as: UTF8.self).split(separator: "\n").first.map(String.init) ?? ""
        guard line.hasPrefix("unix:") else {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            try? FileManager.default.removeItem(atPath: directory)
            throw DBusError.failed("dbus-daemon did not print an address: \(line)")
        }
        self.address = line
        self.pid = process.processIdentifier
        self.directory = directory
        self.process = process
    }

    public func stop() {
        kill(pid, SIGKILL)
        process.waitUntilExit()
        try? FileManager.default.removeItem(atPath: directory)
    }

    public func connect() async throws -> DBusConnection {
        try await DBusConnection.connect(to: .address(address))
    }
}
