// The survival store reader (VigilSurvival, Sources/Survival/Report:
// read-only GRDB through typed, throwing column reads) on damaged databases: a
// valid store, written once by SurvivalStore (runs killed, suspended and
// stopped, heartbeats with leases, wake events, costs), gets the input's
// bytes written over it, then is read as `vigilctl survival` (text, JSON,
// picture), `vigilctl cost` and the bus (SurvivalRunReader) read it. Any
// damage must end in a report or an error.
// Input: records of a 3-byte offset (big-endian, modulo the file's size),
// a length byte and that many bytes to write there.
import Dispatch
import Foundation
import VigilHost
import VigilKit
import VigilSurvival

/// The valid store's bytes and the file each input is written to.
/// `@unchecked Sendable`: written once, before the first input, by
/// `makeBase()` on the fuzzing thread, then only read.
final class Base: @unchecked Sendable {
    let bytes: [UInt8]
    let path: String

    init() {
        let dir = NSTemporaryDirectory() + "vigil-fuzz-survival-\(getpid())"
        try? FileManager.default.removeItem(atPath: dir)
        do {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            let seed = dir + "/seed.sqlite"
            try Self.writeStore(seed)
            bytes = Array(try Data(contentsOf: URL(fileURLWithPath: seed)))
        } catch {
            fatalError("cannot write the base survival store in \(dir): \(error)")
        }
        path = dir + "/survival.sqlite"
    }

    /// Three runs: killed, suspended for an hour and woken by an alarm (killed too), stopped.
    static func writeStore(_ path: String) throws {
        let done = DispatchSemaphore(value: 0)
        let failure = Failure()
        Task {
            do {
                var wall: Int64 = 1_700_000_000_000_000, mono: Int64 = 1_000_000, boot: Int64 = 1_000_000
                func readings() -> ClockReadings { ClockReadings(wallMicros: wall, monotonicMicros: mono, boottimeMicros: boot) }
                func tick(_ awake: Int64, asleep: Int64 = 0) { wall += awake + asleep; mono += awake; boot += awake + asleep }
                for run in 0..<3 {
                    // One store per run, as one per vigild process: the next finds a run without an end.
                    let store = try SurvivalStore(path: path, walCheckpointBytes: nil)
                    _ = try await store.beginRun(RunStart(runId: "run-\(run)", pid: 100 + Int32(run), bootID: "boot-a", version: "fuzz",
                                                          configPath: "/etc/vigil/vigil.toml", interval: .seconds(60), readings: readings()))
                    for beat in 0..<6 {
                        tick(60_000_000, asleep: run == 1 && beat == 3 ? 3_600_000_000 : 0)
                        if run == 1 && beat == 3 {
                            try await store.recordEvent(SystemWake.eventName, strategy: "tick", fields: ["cause": "vigil-alarm", "alarmStrategy": "tick", "alarmKind": "periodic-wake"], readings: readings())
                        }
                        var cost = StrategyCostRow()
                        cost.wakeups = UInt64(beat)
                        cost.sleepHeldUsec = UInt64(beat) * 60_000_000
                        try await store.heartbeat(readings(), leases: [HeartbeatLease(id: UInt64(beat), strategy: "task", holds: "logind", state: "active")],
                                                  costs: ["task": cost])
                    }
                    if run == 2 { try await store.endRun(reason: .stopped, readings: readings()) }
                    tick(5_000_000)
                }
            } catch {
                failure.error = error
            }
            done.signal()
        }
        done.wait()
        if let error = failure.error { throw error }
    }
}

/// `@unchecked Sendable`: set by the task before it signals, read after the wait.
final class Failure: @unchecked Sendable { var error: (any Error)? }

let base = Base()
let utc = TimeZone(identifier: "UTC") ?? .current

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSurvival(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data else { return 0 }
    var bytes = base.bytes
    var i = 0
    while i + 4 <= size {
        let offset = (Int(data[i]) << 16 | Int(data[i + 1]) << 8 | Int(data[i + 2])) % bytes.count
        let length = min(Int(data[i + 3]), size - i - 4, bytes.count - offset)
        for k in 0..<length { bytes[offset + k] = data[i + 4 + k] }
        i += 4 + Int(data[i + 3])
    }
    for suffix in ["-wal", "-shm"] { unlink(base.path + suffix) }
    guard FileManager.default.createFile(atPath: base.path, contents: Data(bytes)) else { fatalError("cannot write \(base.path)") }
    for warning in SurvivalReport.warnings(path: base.path) { _ = warning }
    guard let summaries = try? SurvivalReport.load(path: base.path, runs: nil, sinceWallMicros: nil) else { return 0 }
    _ = SurvivalReportFormat.text(summaries, width: 80, nowWall: 1_700_000_000_000_000, timeZone: utc)
    _ = SurvivalReportFormat.json(summaries)
    for summary in summaries.prefix(1) {
        _ = try? SurvivalReport.heartbeats(path: base.path, runId: summary.runId)
        _ = try? SurvivalReport.events(path: base.path, runId: summary.runId)
    }
    _ = try? SurvivalReport.recount(path: base.path)
    _ = try? CostReport.load(path: base.path, sinceWallMicros: nil)
    if let picture = try? SurvivalPicture.load(path: base.path, runs: nil, sinceWallMicros: nil) {
        _ = SurvivalPictureFormat.svg(picture, timeZone: utc, nowWall: 1_700_000_000_000_000)
    }
    // The bus's reader: a connection of its own, kept while it lives.
    _ = try? SurvivalRunReader(path: base.path).runs(startedSince: 0)
    return 0
}
