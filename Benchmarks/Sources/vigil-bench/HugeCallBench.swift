// dbus-huge-call: one call of the wrong signature with a huge `ay` body
// (64 MiB by default) to vigild's ListLeases, next to the same call sent to
// dbus-test-tool echo (C libdbus, which answers anything with an empty
// reply), on one private bus that lets 128 MiB messages through. Prints the
// time to the reply and each service's RSS, PSS, private dirty memory and
// peak RSS before and after.
import Foundation
import Glibc
import VigilDBus
import VigilHost
import VigilKit
import VigilTestSupport

func dbusHugeCallBench(_ args: [String]) async throws {
    let mib = args.first.flatMap(Int.init) ?? 64
    let bin = try hostBuildDirectory()
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-huge-call-\(getpid())")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: dir) }
    let bus = try TestDBusDaemon(prefix: "vigil-huge-call-bench") { directory in
        """
        <type>session</type><listen>unix:dir=\(directory)</listen><auth>EXTERNAL</auth>
        <policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/></policy>
        <limit name="max_message_size">134217728</limit>
        """
    }
    defer { bus.stop() }
    let echo = try startEchoService(on: bus.address)
    defer { kill(echo.processIdentifier, SIGKILL) }
    let vigild = try vigildProcess(bin, dir: dir, name: "vigil", config: """
        [host]
        state_dir = "\(dir.path)/state"
        bus = "\(bus.address)"
        """, logLevel: "warning")
    try vigild.run()
    defer { vigild.terminate(); vigild.waitUntilExit() }

    let client = try await DBusConnection.connect(to: .address(bus.address))
    for _ in 0..<1000 {
        let up = try await [VigilAPI.busName, BenchAPI.echoName].asyncAllSatisfy { try await client.nameHasOwner($0) }
        if up { break }
        try await Task.sleep(for: .milliseconds(10))
    }
    await client.close()

    print("dbus-huge-call: one \(mib) MiB `ay` sent to ListLeases (declared without arguments), by python3-dbus;")
    print("reference dbus-test-tool echo (C libdbus, answers anything); same bus, same run. 2 cores shared by all.")
    for (label, destination, pid) in [("vigild", VigilAPI.busName, vigild.processIdentifier),
                                      ("echo (C)", BenchAPI.echoName, echo.processIdentifier)] {
        let before = ProcessMemory(pid: pid), peakBefore = peakResidentKiB(pid)
        let outcome = try hugeCall(bus.address, BenchAPI.host(VigilAPI.Host.listLeases, destination: destination), mib: mib)
        let after = ProcessMemory(pid: pid), peakAfter = peakResidentKiB(pid)
        func span(_ before: Int, _ after: Int) -> String { "\(before / 1024) -> \(after / 1024) MiB" }
        print("  \(label.padding(toLength: 9, withPad: " ", startingAt: 0)) \(outcome)   RSS \(span(before.rssKiB, after.rssKiB))"
              + " (+\((after.rssKiB - before.rssKiB) / 1024) MiB), PSS \(span(before.pssKiB, after.pssKiB)),"
              + " private dirty \(span(before.privateDirtyKiB, after.privateDirtyKiB)), peak RSS \(span(peakBefore, peakAfter))")
    }
}

/// Sends `call` with a `mib` MiB `ay` body instead of its arguments, with
/// python3-dbus (its ByteArray marshals fast); returns "<reply or error
/// name> in <seconds> s".
private func hugeCall(_ address: String, _ call: BenchCall, mib: Int) throws -> String {
    let script = """
        import sys, time, dbus
        bus = dbus.bus.BusConnection(sys.argv[1])
        body = dbus.ByteArray(b"\\x1b" * (int(sys.argv[6]) << 20))
        start = time.monotonic()
        try:
            bus.call_blocking(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], "ay", (body,), timeout=300)
            outcome = "empty reply"
        except dbus.DBusException as e:
            outcome = e.get_dbus_name().split(".")[-1]
        print("%-12s in %.3f s" % (outcome, time.monotonic() - start))
        """
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
    process.arguments = ["-c", script, address, call.destination, call.path, call.interface, call.member, String(mib)]
    let out = Pipe()
    process.standardOutput = out
    try process.run()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
}

/// VmHWM (peak RSS) of `pid`, in KiB.
private func peakResidentKiB(_ pid: Int32) -> Int {
    let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
    let line = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") } ?? ""
    return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
}

private extension Array where Element: Sendable {
    func asyncAllSatisfy(_ predicate: (Element) async throws -> Bool) async rethrows -> Bool {
        for element in self where try await !predicate(element) { return false }
        return true
    }
}
