import Foundation
import VigilKit

// 1. The entry point the host looks up after dlopen.
@_cdecl("vigil_plugin_v1")
public func vigilPluginV1() -> UnsafeMutableRawPointer {
    VigilPlugin.export([HelloKind()])
}

// 2. The kind: validates a [[strategy]] table and builds the strategy.
struct HelloKind: StrategyKind {
    var name: String { "hello" }
    var summary: String { "append a greeting to a file at an interval, under a lease" }

    func makeStrategy(_ config: ConfigReader) throws -> any KeepAliveStrategy {
        let file = config.requireString("file")
        if !file.isEmpty && !file.hasPrefix("/") {
            config.problem("file", "expected an absolute path, found \"\(file)\"")
        }
        let every = config.positiveDuration("every", default: .seconds(1))
        let greeting = config.string("greeting", default: "hello")
        return Hello(file: file, every: every, greeting: greeting)
    }
}

// 3. The strategy: all work happens in run(in:), until cancelled.
struct Hello: KeepAliveStrategy {
    let file: String
    let every: Duration
    let greeting: String

    func run(in context: StrategyContext) async throws {
        var count = 0
        while true {
            let now = context.clock.now
            _ = try await context.scheduler.wake(WakeRequest(
                earliest: now + every, latest: now + every + every / 10, label: "\(context.name) hello"
            ))
            count += 1
            let line = "\(greeting) from \(context.name) #\(count)\n"
            try await context.leases.withLease(LeaseRequest(holds: "file \(file)", reason: "greeting #\(count)", budget: .seconds(10))) { _ in
                try append(line)
            }
            await context.events.record("greeted", ["count": String(count)])
            context.log.info("wrote greeting #\(count)")
        }
    }

    private func append(_ line: String) throws {
        if !FileManager.default.fileExists(atPath: file) {
            FileManager.default.createFile(atPath: file, contents: nil)
        }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: file))
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(line.utf8))
    }
}
