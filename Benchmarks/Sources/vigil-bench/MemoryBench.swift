// vigil-bench idle-memory: the memory of an idle vigild (the host of
// hostBuildDirectory(), so run it through `Scripts/bench`, which builds it
// in release), with no strategy and then with one of each of the five
// kinds, next to two references measured in the same run: `dbus-test-tool
// echo` (a C libdbus service) and `sleep` (a C process doing nothing).
// Each row gives RSS, PSS and private dirty memory (/proc/PID/smaps_rollup)
// side by side: RSS counts every shared library page the process touched,
// PSS splits shared pages between the processes mapping them, and private
// dirty is what the process alone costs the machine. Also prints where the
// host's RSS goes, by mapping (the Swift runtime, Foundation, ICU, GRDB...).
// Argument: seconds to let each process idle before measuring (default 3;
// 130 covers two heartbeats of the default survival_interval).
import Foundation
import VigilHost
import VigilTestSupport

/// Memory figures of one process from /proc.
struct ProcessMemory {
    /// From smaps_rollup: resident, proportional (shared pages split
    /// between their users), private (clean + dirty), and private dirty
    /// (written by this process: what it alone costs).
    var rssKiB = 0, pssKiB = 0, privateKiB = 0, privateDirtyKiB = 0, threads = 0
    /// Minor page faults and CPU time (user + system) since it started:
    /// what faulting released pages back in costs.
    var minorFaults = 0, cpuMilliseconds = 0
    /// Resident KiB per mapped file (anonymous memory as "[anon]", heap as "[heap]").
    var byMapping: [String: Int] = [:]
    /// Resident and private dirty KiB per kind of memory (`MemoryGroup`):
    /// file-backed pages are shared with every process mapping the same
    /// library and can be dropped and re-read; dirty ones are the process's own.
    var byGroup: [MemoryGroup: Int] = [:]
    var dirtyByGroup: [MemoryGroup: Int] = [:]

    init(pid: Int32) {
        if let rollup = Self.read("/proc/\(pid)/smaps_rollup") {
            rssKiB = Self.field(rollup, "Rss:")
            pssKiB = Self.field(rollup, "Pss:")
            privateDirtyKiB = Self.field(rollup, "Private_Dirty:")
            privateKiB = Self.field(rollup, "Private_Clean:") + privateDirtyKiB
        }
        if let status = Self.read("/proc/\(pid)/status") {
            threads = Self.field(status, "Threads:")
        }
        if let stat = Self.read("/proc/\(pid)/stat"), let end = stat.lastIndex(of: ")") {
            // Fields after "(comm)": state is field 3; minflt 10, utime 14, stime 15.
            let fields = stat[stat.index(after: end)...].split(separator: " ")
            if fields.count > 12 {
                minorFaults = Int(fields[7]) ?? 0
                let ticks = (Int(fields[11]) ?? 0) + (Int(fields[12]) ?? 0)
                cpuMilliseconds = ticks * 1000 / max(1, sysconf(Int32(_SC_CLK_TCK)))
            }
        }
        if let smaps = Self.read("/proc/\(pid)/smaps") {
            var current = "[anon]"
            var size = 0
            var group = MemoryGroup.other
            for line in smaps.split(separator: "\n") {
                let parts = line.split(separator: " ", omittingEmptySubsequences: true)
                if let first = parts.first, first.contains("-"), parts.count >= 5 {
                    // A mapping header: address perms offset dev inode [path].
                    current = parts.count >= 6 ? String(parts[5]).components(separatedBy: "/").last ?? "?" : "[anon]"
                } else if line.hasPrefix("Size:") {
                    size = Int(parts[1]) ?? 0
                } else if line.hasPrefix("Rss:") {
                    let rss = Int(parts[1]) ?? 0
                    group = MemoryGroup(mapping: current, sizeKiB: size)
                    byMapping[current, default: 0] += rss
                    byGroup[group, default: 0] += rss
                } else if line.hasPrefix("Private_Dirty:") {
                    dirtyByGroup[group, default: 0] += Int(parts[1]) ?? 0
                }
            }
        }
    }

    /// /proc files report size 0: read to EOF.
    private static func read(_ path: String) -> String? {
        guard let handle = FileHandle(forReadingAtPath: path) else { return nil }
        defer { try? handle.close() }
        return String(decoding: handle.readDataToEndOfFile(), as: UTF8.self)
    }

    private static func field(_ text: String, _ key: String) -> Int {
        for line in text.split(separator: "\n") where line.hasPrefix(key) {
            return Int(line.split(whereSeparator: { $0 == " " || $0 == "\t" }).dropFirst().first ?? "") ?? 0
        }
        return 0
    }
}

/// What a mapping is, for the breakdown of an idle vigild's RSS.
enum MemoryGroup: String, CaseIterable {
    case swiftRuntime = "Swift runtime, Concurrency, Dispatch"
    case foundation = "Foundation, FoundationEssentials"
    case icu = "FoundationInternationalization + ICU data"
    case vigil = "vigild (+ GRDB, TOMLKit), VigilKit (+ swift-log), plugins"
    case dbus = "libdbus (+ libsystemd, libgcrypt, libcap, zstd/lz4/lzma it loads)"
    case clibs = "libc, libstdc++, sqlite and other C libraries"
    case stacks = "thread stacks (8 MiB anonymous mappings)"
    case heap = "malloc heap and arenas, other anonymous memory"
    case other = "other"

    init(mapping name: String, sizeKiB: Int) {
        switch name {
        case _ where name.hasPrefix("libswift") || name.hasPrefix("libdispatch") || name.hasPrefix("libBlocksRuntime"):
            self = .swiftRuntime
        case _ where name.hasPrefix("libFoundationInternationalization") || name.hasPrefix("lib_FoundationICU"):
            self = .icu
        case _ where name.hasPrefix("libFoundation") || name.hasPrefix("lib_FoundationCollections"):
            self = .foundation
        case _ where name == "vigild" || name == "libVigilKit.so" || name.hasPrefix("libvigil-"):
            self = .vigil
        case _ where ["libdbus", "libsystemd", "libgcrypt", "libgpg-error", "libcap.", "libzstd", "liblz4", "liblzma"].contains(where: name.hasPrefix):
            self = .dbus
        case "[heap]":
            self = .heap
        case "[anon]", "[stack]":
            // pthread stacks are 8 MiB (+ guard) each; glibc arenas reserve 64 MiB.
            self = name == "[stack]" || (8_188...8_196).contains(sizeKiB) ? .stacks : .heap
        case _ where name.hasSuffix(".so") || name.contains(".so."):
            self = .clibs
        default:
            self = .other
        }
    }
}

func idleMemoryBench(_ args: [String]) async throws {
    let settle = args.first.flatMap(Double.init) ?? 3
    let bin = try hostBuildDirectory()
    let dir = FileManager.default.temporaryDirectory.appendingPathComponent("vigil-memory-\(getpid())")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: dir) }

    /// Starts an idle vigild on a bus of its own and returns once it
    /// serves the bus; it is measured with the others after `settle`.
    func host(_ label: String, strategies: String, hostKeys: String = "") throws -> (vigild: Process, bus: TestDBusDaemon) {
        let bus = try TestDBusDaemon()
        let state = dir.appendingPathComponent(label).path
        let config = """
        [host]
        bus = "\(bus.address)"
        state_dir = "\(state)"
        power = "none"
        \(hostKeys)
        \(strategies)
        """
        let p = try vigildProcess(bin, dir: dir, name: label, config: config, logLevel: "notice")
        let err = Pipe()
        p.standardError = err
        do {
            try p.run()
            // Ready once it serves the bus (its notice line).
            var seen = Data()
            while !String(decoding: seen, as: UTF8.self).contains("serving org.vigil.Vigil1") {
                let chunk = err.fileHandleForReading.availableData
                if chunk.isEmpty { throw BenchError("vigild exited before serving the bus: \(String(decoding: seen, as: UTF8.self))") }
                seen.append(chunk)
            }
        } catch {
            if p.isRunning { p.terminate(); p.waitUntilExit() }
            bus.stop()
            throw error
        }
        return (p, bus)
    }

    let all = """
    [[strategy]]
    name = "wake"
    kind = "periodic-wake"
    every = "10m"
    run = ["true"]

    [[strategy]]
    name = "task"
    kind = "background-task"
    max_duration = "1h"

    [[strategy]]
    name = "audio"
    kind = "silent-audio"
    server = "unix:\(dir.path)/no-pulse"

    [[strategy]]
    name = "sip"
    kind = "voip-socket"
    connect = "127.0.0.1:9"

    [[strategy]]
    name = "fetch"
    kind = "download-session"
    dir = "\(dir.path)/downloads"
    """

    // All measured together after the same idle time (a heartbeat every
    // 60 s: pass 130 to include two).
    var hosts: [(vigild: Process, bus: TestDBusDaemon)] = []
    defer {
        for h in hosts {
            if h.vigild.isRunning { h.vigild.terminate(); h.vigild.waitUntilExit() }
            h.bus.stop()
        }
    }
    hosts.append(try host("none", strategies: ""))
    hosts.append(try host("five", strategies: all))

    // References, on the same machine in the same run.
    let echo = Process()
    echo.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-test-tool")
    echo.arguments = ["echo", "--name=org.vigil.BenchEcho"]
    echo.environment = ["DBUS_SESSION_BUS_ADDRESS": hosts[0].bus.address]
    let sleeper = Process()
    sleeper.executableURL = URL(fileURLWithPath: "/bin/sleep")
    sleeper.arguments = ["1000"]
    try echo.run()
    try sleeper.run()
    // SIGKILL: the references hold nothing worth a clean stop.
    defer { for p in [echo, sleeper] where p.isRunning { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() } }
    FileHandle.standardError.write(Data("idling \(settle) s\n".utf8))
    try await Task.sleep(for: .seconds(settle))
    let none = ProcessMemory(pid: hosts[0].vigild.processIdentifier)
    let five = ProcessMemory(pid: hosts[1].vigild.processIdentifier)
    let echoMemory = ProcessMemory(pid: echo.processIdentifier)
    let sleepMemory = ProcessMemory(pid: sleeper.processIdentifier)

    func row(_ label: String, _ m: ProcessMemory) {
        let padded = label.padding(toLength: 44, withPad: " ", startingAt: 0)
        print(padded + String(format: " RSS %6.1f MB  PSS %6.1f MB  private dirty %6.1f MB  private %6.1f MB  threads %2d  minor faults %6d  CPU %5d ms",
                     Double(m.rssKiB) / 1024, Double(m.pssKiB) / 1024, Double(m.privateDirtyKiB) / 1024, Double(m.privateKiB) / 1024,
                     m.threads, m.minorFaults, m.cpuMilliseconds))
    }
    row("vigild, no strategy", none)
    row("vigild, all five kinds", five)
    row("dbus-test-tool echo (C libdbus, reference)", echoMemory)
    row("sleep (C, reference)", sleepMemory)
    print("\nwhere an idle vigild's RSS goes, by kind of memory (dirty: the process's own pages; the rest is")
    print("library code and data shared with every process that maps it):")
    print("  no strategy          all five kinds")
    print("      RSS    dirty        RSS    dirty")
    for group in MemoryGroup.allCases {
        let a = none.byGroup[group] ?? 0, b = five.byGroup[group] ?? 0
        guard a + b > 0 else { continue }
        let da = none.dirtyByGroup[group] ?? 0, db = five.dirtyByGroup[group] ?? 0
        print(String(format: "  %5.1f MB %5.1f MB   %5.1f MB %5.1f MB  %@",
                     Double(a) / 1024, Double(da) / 1024, Double(b) / 1024, Double(db) / 1024, group.rawValue as NSString))
    }
    print("\ntop mappings (no strategy):")
    for (name, kib) in none.byMapping.sorted(by: { $0.value > $1.value }).prefix(12) {
        print(String(format: "  %7.1f MB  %@", Double(kib) / 1024, name as NSString))
    }
}
