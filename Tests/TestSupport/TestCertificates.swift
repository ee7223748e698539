import Foundation
import VigilKitTesting

/// A throw-away certificate authority and a server certificate it signed
/// for `IP:127.0.0.1`, made with the `openssl` command-line tool (EC P-256
/// keys, valid for two days) in a temporary directory.
public struct TestCertificates: Sendable {
    /// The directory holding the files; removed by `remove()`.
    public let directory: String
    /// The CA certificate (PEM): trust this to accept the server.
    public var caCertificate: String { directory + "/ca.pem" }
    /// The server's certificate chain (PEM) and key, for nginx `ssl_certificate(_key)`.
    public var serverCertificate: String { directory + "/server.pem" }
    public var serverKey: String { directory + "/server.key" }

    public init() throws {
        directory = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-tls-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try """
            basicConstraints = critical, CA:FALSE
            keyUsage = critical, digitalSignature
            extendedKeyUsage = serverAuth
            subjectAltName = IP:127.0.0.1
            """.write(toFile: directory + "/server.ext", atomically: true, encoding: .utf8)
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        try Self.openssl(["req", "-x509"] + ec + ["-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                         "-subj", "/CN=Vigil test CA",
                         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"], in: directory)
        try Self.openssl(["req"] + ec + ["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1"], in: directory)
        try Self.openssl(["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                          "-out", "server.pem", "-days", "2", "-extfile", "server.ext"], in: directory)
    }

    public func remove() { try? FileManager.default.removeItem(atPath: directory) }

    private static func openssl(_ arguments: [String], in directory: String) throws {
        let result = try ProcessRunner.run("/usr/bin/openssl", arguments, cwd: directory)
        guard result.status == 0 else {
            throw NSError(domain: "TestCertificates", code: Int(result.status), userInfo: [
                NSLocalizedDescriptionKey: "openssl \(arguments.joined(separator: " ")) failed: \(result.stderr)"])
        }
    }
}
