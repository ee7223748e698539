import ArgumentParser
import Foundation
import VigilCommon
import VigilDBus
import VigilKit

/// `vigilctl downloads`: the downloads of every download-session strategy,
/// with progress bars, rate and ETA.
struct DownloadsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "downloads",
        abstract: "Show the downloads of download-session strategies, with progress, rate and ETA.",
        discussion: """
            Lists every object with the org.vigil.Vigil1.Download interface (one per download \
            of a download-session strategy): its strategy and id, state (queued, active, \
            retrying, paused, completed, failed), a progress bar with bytes done and total, \
            the rate, the time left at that rate, and the destination. A download that failed \
            or is retrying shows its last error below the table.

            --watch prints the table again each time vigild announces a change \
            (PropertiesChanged, at most about once a second per download; no polling). It ends \
            with status 1 when vigild leaves the bus.

            Exit status: 0 when vigild answered, 1 when no vigild is running on the bus.
            """
    )

    static let downloadInterface = VigilAPI.downloadInterface

    @OptionGroup var busOptions: BusOptions

    @Flag(help: "Print the table again whenever a download changes.")
    var watch = false

    /// A download object: its strategy, its id and its properties
    /// (the contract's ``DownloadRow``).
    @dynamicMemberLookup
    struct Row: Equatable {
        var path: String
        var strategy: String
        var id: UInt64
        var properties: DownloadRow

        subscript<T>(dynamicMember keyPath: KeyPath<DownloadRow, T>) -> T { properties[keyPath: keyPath] }
    }

    func run() async throws {
        try await runReporting("downloads") {
            try await VigilBusClient.with(busOptions) { client in
                if watch {
                    try await follow(client)
                } else {
                    printLine(Self.table(try await Self.rows(client)), terminator: "")
                }
            }
        }
    }

    /// Every download object, from the root ObjectManager.
    static func rows(_ client: VigilBusClient) async throws -> [Row] {
        let reply = try await client.call("GetManagedObjects", interface: VigilAPI.objectManagerInterface)
        guard case let .dict(_, _, objects)? = reply.body.first else { return [] }
        var rows: [Row] = []
        for object in objects {
            guard case let .objectPath(path) = object.key, case let .dict(_, _, interfaces) = object.value,
                  let entry = interfaces.first(where: { $0.key == .string(downloadInterface) }),
                  let values = entry.value.dictionaryValue else { continue }
            let properties: DownloadRow
            do {
                properties = try DownloadRow(properties: values)
            } catch {
                throw VigilctlFailure("the download at \(path) is not what this vigilctl expects (\(error)); are vigild and vigilctl the same version?")
            }
            guard let (strategy, id) = VigilAPI.download(at: path) else { continue }
            rows.append(Row(path: path, strategy: strategy, id: id, properties: properties))
        }
        return rows.sorted { ($0.strategy, $0.id) < ($1.strategy, $1.id) }
    }

    static func table(_ rows: [Row]) -> String {
        guard !rows.isEmpty else { return "No downloads.\n" }
        typealias C = TableFormat.Column
        let cells = rows.map { r -> [String] in
            [
                r.strategy, String(r.id), r.state, bar(r), bytes(r.bytesDone) + "/" + (r.bytesTotal > 0 ? bytes(r.bytesTotal) : "?"),
                r.state == "active" ? bytes(UInt64(max(0, r.rate))) + "/s" : "-", eta(r), TableFormat.cell(r.dest),
            ]
        }
        var out = TableFormat.table(
            [C("STRATEGY"), C("ID", .right), C("STATE"), C("PROGRESS"), C("BYTES", .right), C("RATE", .right), C("ETA", .right), C("DEST")],
            cells)
        let errors = rows.filter { !$0.lastError.isEmpty && ($0.state == "failed" || $0.state == "retrying") }
        if !errors.isEmpty {
            out += "\nErrors:\n" + errors.map {
                TerminalText.escaped("  \($0.strategy)/\($0.id) (try \($0.attempts)): \($0.lastError)")
            }.joined(separator: "\n") + "\n"
        }
        return out
    }

    /// `[#########...........]  45%`
    static func bar(_ r: Row, width: Int = 20) -> String {
        let fraction: Double = r.state == "completed" ? 1 : (r.bytesTotal > 0 ? min(1, Double(r.bytesDone) / Double(r.bytesTotal)) : 0)
        let filled = Int((fraction * Double(width)).rounded(.down))
        let percent = r.bytesTotal > 0 || r.state == "completed" ? String(Int((fraction * 100).rounded(.down))) + "%" : "?"
        return "[" + String(repeating: "#", count: filled) + String(repeating: ".", count: width - filled) + "] " + percent
    }

    static func eta(_ r: Row) -> String {
        guard r.state == "active", r.rate > 0, r.bytesTotal > r.bytesDone else { return "-" }
        let seconds = Double(r.bytesTotal - r.bytesDone) / r.rate
        return TableFormat.duration(micros: UInt64(min(seconds, 1e9) * 1_000_000))
    }

    /// 1536 → "1.5 KiB".
    static func bytes(_ n: UInt64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var value = Double(n)
        var unit = 0
        while value >= 1024, unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(n) B" : String(format: "%.1f %@", value, units[unit])
    }

    private func follow(_ client: VigilBusClient) async throws {
        // Subscribe before listing, so no change falls between the two.
        let changes = try await client.connection.signals(matching: DBusMatchRule(
            sender: VigilBusClient.busName, interface: VigilAPI.propertiesInterface, member: "PropertiesChanged"))
        let objects = try await client.connection.signals(matching: DBusMatchRule(
            sender: VigilBusClient.busName, interface: VigilAPI.objectManagerInterface))
        let ownerChanges = try await client.connection.signals(matching: DBusMatchRule(
            sender: "org.freedesktop.DBus", interface: "org.freedesktop.DBus", member: "NameOwnerChanged"))
        let first = Self.table(try await Self.rows(client))
        printLine(first, terminator: "")
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                for await signal in ownerChanges {
                    guard signal.body.first == .string(VigilBusClient.busName),
                          signal.body.count == 3, signal.body[2] == .string("") else { continue }
                    throw VigilctlFailure("vigild left \(client.busDescription)")
                }
            }
            let (redraws, redraw) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
            group.addTask {
                for await signal in changes where signal.body.first == .string(Self.downloadInterface) { redraw.yield() }
            }
            group.addTask {
                // Objects appear and go (InterfacesAdded/Removed, sent from the root).
                for await signal in objects where signal.body.count == 2 { redraw.yield() }
            }
            group.addTask {
                var last = first
                for await _ in redraws {
                    let text = Self.table(try await Self.rows(client))
                    guard text != last else { continue }
                    last = text
                    printLine("--- \(TableFormat.timeOfDay())")
                    printLine(text, terminator: "")
                }
            }
            try await group.next()
            group.cancelAll()
        }
    }
}
