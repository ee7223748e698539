import CCurlShim
import Foundation
import VigilKit

public struct DownloadSession: KeepAliveStrategy {
    let settings: DownloadSettings

    public func run(in context: StrategyContext) async throws {
        let manager = DownloadManager(settings: settings, context: context)
        try await manager.start()
        // Park until cancelled (shutdown, reload): an AsyncStream that never
        // yields ends its iteration when the task is cancelled, with no timer.
        let (forever, keep) = AsyncStream<Void>.makeStream()
        for await _ in forever {}
        _ = keep
        await manager.stop()
    }
}

/// Owns the downloads of one strategy instance: their records in the
/// host's store, their D-Bus objects, and one worker task per active
/// download (at most `max_parallel`).
actor DownloadManager {
    let settings: DownloadSettings
    let context: StrategyContext
    private var records: [UInt64: DownloadRecord] = [:]
    private var nextID: UInt64 = 1
    private var workers: [UInt64: Task<Void, Never>] = [:]
    private var objects: [UInt64: any BusObjectHandle] = [:]
    /// Live figures of active downloads: rate in bytes/s.
    private var rates: [UInt64: Double] = [:]
    private var stopping = false

    init(settings: DownloadSettings, context: StrategyContext) {
        self.settings = settings
        self.context = context
    }

    private var log: Logger { context.log }

    // MARK: life cycle

    func start() async throws {
        var isDir: ObjCBool = false
        if !FileManager.default.fileExists(atPath: settings.dir, isDirectory: &isDir) {
            try FileManager.default.createDirectory(atPath: settings.dir, withIntermediateDirectories: true)
        } else if !isDir.boolValue {
            throw DownloadError("dir \(settings.dir) exists and is not a directory")
        }
        try await load()
        try await reconcileWithConfig()
        for id in records.keys.sorted() { await exportObject(id) }
        try await registerBusMethods()
        let unfinished = records.values.filter { $0.state.isUnfinished }.count
        log.info("\(records.count) download\(records.count == 1 ? "" : "s") known, \(unfinished) to do, in \(settings.dir)")
        pump()
    }

    func stop() async {
        stopping = true
        let running = workers
        for task in running.values { task.cancel() }
        for task in running.values { await task.value }
        workers = [:]
    }

    private func load() async throws {
        let stored = try await context.store.all()
        for (key, value) in stored {
            if key == "next-id" {
                nextID = max(nextID, UInt64(String(decoding: value, as: UTF8.self)) ?? 1)
                continue
            }
            guard key.hasPrefix("download/") else { continue }
            do {
                var record = try JSONDecoder().decode(DownloadRecord.self, from: Data(value))
                if record.state == .active { record.state = .queued }
                if record.state != .completed { record.bytesDone = partSize(record) }
                records[record.id] = record
                nextID = max(nextID, record.id + 1)
            } catch {
                log.warning("ignoring unreadable stored record \(key): \(error)")
            }
        }
    }

    /// Adds configured downloads that are new, replaces changed ones and
    /// drops those no longer configured.
    private func reconcileWithConfig() async throws {
        let configured = Dictionary(settings.downloads.map { ($0.dest, $0) }, uniquingKeysWith: { a, _ in a })
        for record in records.values where record.origin == "config" {
            guard let wanted = configured[record.dest] else {
                log.info("download \(record.id) (\(record.dest)) is no longer configured; dropped")
                try await forget(record.id, removePart: true)
                continue
            }
            if wanted.url != record.url || wanted.sha256 != record.sha256 || wanted.size != record.size {
                log.info("download \(record.id) (\(record.dest)) changed in the config; starting it again")
                try await forget(record.id, removePart: true)
            }
        }
        let present = Set(records.values.filter { $0.origin == "config" }.map(\.dest))
        for download in settings.downloads where !present.contains(download.dest) {
            var record = DownloadRecord(id: allocateID(), url: download.url, dest: download.dest, sha256: download.sha256,
                                        size: download.size, origin: "config", state: .queued)
            if let path = try? DestinationPath.resolve(download.dest, in: settings.dir, create: false),
               FileManager.default.fileExists(atPath: path) {
                // Already there (published before the store knew it): keep it.
                record.state = .completed
                record.bytesDone = Int64((try? FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0)
            }
            records[record.id] = record
            try await save(record)
        }
        try await context.store.put("next-id", Array(String(nextID).utf8))
    }

    private func allocateID() -> UInt64 {
        defer { nextID += 1 }
        return nextID
    }

    // MARK: D-Bus

    /// `org.vigil.Vigil1.DownloadSession` on the strategy's object, as the
    /// contract declares it (VigilKit's ``VigilAPI/DownloadSession``); all
    /// four methods are mutating.
    private func registerBusMethods() async throws {
        let objectPath = context.bus.objectPath
        let api = VigilAPI.DownloadSession.self
        let stopped = BusMethodError.failed("the download session has stopped")
        try await context.bus.register(VigilAPI.downloadSession, methods: [
            api.enqueue.bind(mutating: true) { [weak self] caller, url, dest, options in
                guard let self else { throw stopped }
                let id = try await self.enqueue(url: url, dest: dest, options: options, caller: caller)
                return BusTuple(ObjectPath(objectPath + "/" + VigilAPI.downloadRelativePath(id)))
            },
            api.cancel.bind(mutating: true) { [weak self] _, download in
                guard let self else { throw stopped }
                try await self.cancel(try Self.downloadID(download, objectPath))
                return BusTuple()
            },
            api.pause.bind(mutating: true) { [weak self] _, download in
                guard let self else { throw stopped }
                try await self.pause(try Self.downloadID(download, objectPath))
                return BusTuple()
            },
            api.resume.bind(mutating: true) { [weak self] _, download in
                guard let self else { throw stopped }
                try await self.resume(try Self.downloadID(download, objectPath))
                return BusTuple()
            },
        ])
    }

    static func downloadID(_ download: ObjectPath, _ objectPath: String) throws -> UInt64 {
        guard let id = VigilAPI.downloadID(path: download.rawValue, strategyPath: objectPath) else {
            throw BusMethodError.unknownObject("\(ClientText.excerpt(download.rawValue)) is not a download of this session (expected \(objectPath)/\(VigilAPI.downloadRelativePath(0).dropLast())<id>)")
        }
        return id
    }

    /// The download object's properties (``DownloadRow``).
    private func busValues(_ r: DownloadRecord) -> [String: BusValue] {
        var row = DownloadRow()
        row.url = r.url
        row.dest = absolutePath(r)
        row.state = r.state.rawValue
        row.bytesDone = UInt64(max(0, r.bytesDone))
        row.bytesTotal = UInt64(max(0, r.validators?.totalLength ?? r.size ?? 0))
        row.rate = rates[r.id] ?? 0
        row.attempts = UInt32(clamping: r.attempts)
        row.lastError = r.lastError
        row.sha256 = r.digest
        return row.properties
    }

    private func exportObject(_ id: UInt64) async {
        guard let record = records[id], objects[id] == nil else { return }
        do {
            objects[id] = try await context.bus.exportObject(
                relativePath: VigilAPI.downloadRelativePath(id), interface: VigilAPI.downloadInterface,
                properties: VigilAPI.download.properties, values: busValues(record))
        } catch {
            log.warning("cannot export download \(id) on D-Bus: \(error)")
        }
    }

    private func publish(_ id: UInt64, immediately: Bool = true) async {
        guard let record = records[id], let object = objects[id] else { return }
        await object.update(busValues(record), immediately: immediately)
    }

    // MARK: requests

    func enqueue(url: String, dest: String, options: [String: BusValue], caller: BusCaller) async throws -> UInt64 {
        try ClientInputLimit.downloadURL.check(url)
        try ClientInputLimit.downloadDestination.check(dest)
        try ClientInputLimit.optionEntries.check(count: options.count)
        let urlPath: String
        switch URLCheck.validate(url) {
        case .failure(let message): throw BusMethodError.invalidArgs(message)
        case .success(let p): urlPath = p
        }
        var sha256: String?
        var size: Int64?
        for (key, value) in options {
            switch key {
            case "sha256":
                guard let s = value.stringValue, Hex.isSHA256(s) else { throw BusMethodError.invalidArgs("option sha256: expected a string of 64 hexadecimal digits") }
                sha256 = s.lowercased()
            case "size":
                guard let n = value.integerValue, n >= 0 else { throw BusMethodError.invalidArgs("option size: expected a non-negative integer") }
                size = n
            default:
                throw BusMethodError.invalidArgs("unknown option \"\(ClientText.excerpt(key))\"; expected sha256 (s) or size (t)")
            }
        }
        var name = dest
        if name.isEmpty {
            guard let derived = DestinationPath.defaultName(urlPath: urlPath) else {
                throw BusMethodError.invalidArgs("cannot take a file name from \"\(ClientText.excerpt(url))\"; give dest")
            }
            name = derived
        }
        let path: String
        do {
            path = try DestinationPath.resolve(name, in: settings.dir, create: false)
        } catch {
            throw BusMethodError(VigilAPI.destinationRefusedError, error.message)
        }
        if let other = records.values.first(where: { $0.state != .completed && $0.state != .failed && absolutePath($0) == path }) {
            throw BusMethodError.invalidArgs("\(path) is already the destination of download \(other.id) (\(other.state.rawValue))")
        }
        let record = DownloadRecord(id: allocateID(), url: url, dest: name, sha256: sha256, size: size, origin: "bus", state: .queued)
        // The destination is taken from before the first suspension point
        // (a concurrent Enqueue to it is refused) and given back if the
        // record cannot be stored.
        records[record.id] = record
        do {
            try await context.store.put("next-id", Array(String(nextID).utf8))
            try await save(record)
        } catch {
            records[record.id] = nil
            throw error
        }
        await exportObject(record.id)
        log.info("download \(record.id) enqueued by uid \(caller.uid): \(url) -> \(path)")
        await context.events.record("download-enqueued", ["id": String(record.id), "url": url, "dest": path])
        pump()
        return record.id
    }

    func cancel(_ id: UInt64) async throws {
        guard records[id] != nil else { throw BusMethodError.unknownObject("no download \(id)") }
        log.info("download \(id) cancelled")
        try await forget(id, removePart: true)
        pump()
    }

    func pause(_ id: UInt64) async throws {
        guard var record = records[id] else { throw BusMethodError.unknownObject("no download \(id)") }
        guard record.state.isUnfinished else {
            throw BusMethodError.invalidArgs("download \(id) is \(record.state.rawValue); only queued, active or retrying downloads can be paused")
        }
        record.state = .paused
        records[id] = record
        if let task = workers.removeValue(forKey: id) {
            task.cancel()
            await task.value
        }
        rates[id] = nil
        guard let current = records[id] else { throw BusMethodError.unknownObject("download \(id) was cancelled while pausing") }
        // The worker may have finished (published or failed) while it was
        // being stopped: that outcome stands, a completed file is not paused.
        if current.state == .completed || current.state == .failed {
            throw BusMethodError.invalidArgs("download \(id) \(current.state.rawValue) before it could be paused")
        }
        record = current
        record.state = .paused
        record.bytesDone = partSize(record)
        try await update(record)
        log.info("download \(id) paused at \(record.bytesDone) bytes")
        pump()
    }

    func resume(_ id: UInt64) async throws {
        guard var record = records[id] else { throw BusMethodError.unknownObject("no download \(id)") }
        guard record.state == .paused || record.state == .failed else {
            throw BusMethodError.invalidArgs("download \(id) is \(record.state.rawValue); only paused or failed downloads can be resumed")
        }
        record.state = .queued
        if record.lastError.isEmpty == false, record.attempts >= settings.maxTries { record.attempts = 0 }
        try await update(record)
        pump()
    }

    /// Removes a download: its worker, record, object and (optionally) part file.
    private func forget(_ id: UInt64, removePart: Bool) async throws {
        if let task = workers.removeValue(forKey: id) {
            task.cancel()
            await task.value
        }
        guard let record = records.removeValue(forKey: id) else { return }
        rates[id] = nil
        if removePart { unlink(absolutePath(record) + ".part") }
        try await context.store.delete(record.storeKey)
        await objects.removeValue(forKey: id)?.remove()
    }

    // MARK: scheduling

    /// Starts queued downloads while slots are free, oldest first.
    private func pump() {
        guard !stopping else { return }
        for id in records.keys.sorted() where workers.count < settings.maxParallel {
            guard let record = records[id], record.state == .queued, workers[id] == nil else { continue }
            // Unstructured task: kept in `workers`; cancelled (and awaited) when its download is
            // paused or removed, and by stop().
            workers[id] = Task { await self.work(id) }
        }
    }

    private func workerFinished(_ id: UInt64) {
        workers[id] = nil
        rates[id] = nil
        pump()
    }

    // MARK: one download

    private func work(_ id: UInt64) async {
        defer { if !Task.isCancelled { workerFinished(id) } }
        guard let first = records[id] else { return }
        let lease: (any LeaseHandle)?
        do {
            lease = try await context.leases.acquire(LeaseRequest(
                holds: "download \(first.dest)", reason: "downloading \(first.url)", power: PowerHold()))
        } catch {
            log.warning("download \(id): cannot take a lease (\(error)); downloading without one")
            lease = nil
        }
        // Unstructured task: not cancelled: one release, which ends by itself (a defer cannot
        // await); the lease must go even when the worker was cancelled.
        defer { if let lease { Task { await lease.release() } } }
        while !Task.isCancelled {
            guard var record = records[id], record.state != .paused else { return }
            let path: String
            do {
                path = try DestinationPath.resolve(record.dest, in: settings.dir, create: true)
            } catch {
                await fail(id, error.message)
                return
            }
            record.attempts += 1
            record.state = .active
            guard (try? await update(record)) != nil else { return }
            let part = path + ".part"
            let partExists = access(part, F_OK) == 0
            let askedIfRange = partExists ? record.ifRange : nil
            log.info("download \(id) try \(record.attempts): GET \(record.url)\(partExists && record.ifRange != nil ? " from byte \(partSize(record))" : "")")
            let transfer = CurlTransfer(TransferRequest(
                url: record.url, partPath: part, ifRange: askedIfRange,
                expectedTotal: partExists && record.ifRange != nil ? record.validators?.totalLength : nil,
                connectTimeout: settings.connectTimeout, stallTimeout: settings.stallTimeout, writeChunk: settings.writeChunk,
                caFile: settings.caFile),
                cost: context.cost,
                onResponse: { validators, discarded in
                    // Unstructured task: not cancelled: one hop into the actor per response, from
                    // the transfer thread.
                    Task { await self.noteResponse(id, validators, discarded: discarded, asked: askedIfRange) }
                })
            // Unstructured task: cancelled right below, once the transfer has returned.
            let monitor = Task { await self.monitor(id, transfer, lease) }
            let outcome = await Self.onThread({ transfer.perform() }, onCancel: { transfer.cancel() })
            monitor.cancel()
            if Task.isCancelled { return }
            let retry: String
            var wait: Duration?
            switch outcome {
            case .complete(let length, let digest, let validators, let resumedFrom):
                if resumedFrom > 0 { log.info("download \(id) resumed at byte \(resumedFrom)") }
                await finish(id, path: path, length: length, digest: digest, validators: validators)
                return
            case .rangeNotSatisfiable(let complete):
                let have = partSize(record)
                if let complete, complete == have, have > 0 {
                    // The part already holds the whole file (killed between
                    // the last byte and the rename).
                    let digest = await Self.onThread({ FileDigest.sha256(part) }, onCancel: {})
                    guard case .success(let hex) = digest else {
                        if case .failure(let message) = digest { await fail(id, message) }
                        return
                    }
                    await finish(id, path: path, length: have, digest: hex, validators: record.validators ?? ResponseValidators())
                    return
                }
                unlink(part)
                retry = "the server answered 416 to a resume at byte \(have) (complete length \(complete.map(String.init) ?? "unknown")); starting from zero"
                wait = .zero
            case .badContentRange(let message):
                unlink(part)
                retry = "discarded a 206 answer: \(message); starting from zero"
            case .httpStatus(let status, let retryAfter):
                if status == 429 || status == 503, let retryAfter,
                   let delay = RetryAfter.parse(retryAfter, nowWallMicros: context.clock.wallMicroseconds) {
                    wait = min(delay, settings.maxRetryAfter)
                    retry = "HTTP \(status); the server asked to retry after \(retryAfter)"
                } else if status == 408 || status == 429 || status >= 500 {
                    retry = "HTTP \(status)"
                } else {
                    await fail(id, "HTTP \(status) from \(record.url)")
                    return
                }
            case .transport(let code, let message):
                if let permanent = TransportFailure.permanentMessage(code: code, message: message, url: record.url, caFile: settings.caFile) {
                    // Trying again gets the same answer: fail now, clearly.
                    await fail(id, permanent)
                    return
                }
                retry = "transfer failed: \(message) (curl error \(code))"
            case .writeFailed(let message):
                await fail(id, message)
                return
            case .noSpace(let message):
                // A kept part would leave the filesystem full.
                unlink(part)
                await fail(id, "\(message); the partial file was removed to give the space back (enqueue it again when there is room)")
                return
            case .cancelled:
                return
            }
            guard var now = records[id] else { return }
            now.bytesDone = partSize(now)
            now.lastError = retry
            if now.attempts >= settings.maxTries {
                await fail(id, "gave up after \(now.attempts) tr\(now.attempts == 1 ? "y" : "ies"): \(retry)")
                return
            }
            let delay = wait ?? settings.backoff.delay(attempt: now.attempts - 1)
            now.state = .retrying
            guard (try? await update(now)) != nil else { return }
            log.warning("download \(id): \(retry); try \(now.attempts + 1) of \(settings.maxTries) in \(delay.vigilDescription)")
            await context.events.record("download-retry", ["id": String(id), "error": retry, "delay_ms": String(delay.microseconds / 1000)])
            if delay > .zero {
                do { try await context.clock.sleep(for: delay) } catch { return }
            }
        }
    }

    /// Verifies, fsyncs, renames and fsyncs the directory.
    private func finish(_ id: UInt64, path: String, length: Int64, digest: String, validators: ResponseValidators) async {
        guard var record = records[id] else { return }
        let part = path + ".part"
        record.validators = validators
        record.bytesDone = length
        if let total = validators.totalLength, total != length {
            unlink(part)
            await fail(id, "length mismatch for \(path): the server announced \(total) bytes and sent \(length); the file was not published")
            return
        }
        if let size = record.size, size != length {
            unlink(part)
            await fail(id, "size mismatch for \(path): expected \(size) bytes, received \(length); the file was not published")
            return
        }
        if let expected = record.sha256, expected != digest {
            unlink(part)
            await fail(id, "sha256 mismatch for \(path): expected \(expected), got \(digest); the file was not published")
            return
        }
        if let message = Self.publish(part: part, to: path) {
            await fail(id, message)
            return
        }
        record.state = .completed
        record.digest = digest
        record.lastError = ""
        try? await update(record)
        log.info("download \(id) completed: \(path) (\(length) bytes, sha256 \(digest))")
        await context.events.record("download-completed", ["id": String(id), "dest": path, "bytes": String(length), "sha256": digest])
        if let argv = settings.onComplete {
            let result = await context.hooks.run(HookCommand(argv: argv, timeout: settings.hookTimeout), event: "complete",
                                                 variables: ["url": record.url, "dest": path, "sha256": digest, "size": String(length), "download_id": String(id)])
            if !result.exit.succeeded { log.warning("on_complete for download \(id) \(result.exit)") }
        }
    }

    private func fail(_ id: UInt64, _ message: String) async {
        guard var record = records[id] else { return }
        // An empty part (redirect loop, refused before any byte) is noise.
        if partSize(record) == 0 { unlink(absolutePath(record) + ".part") }
        record.state = .failed
        record.lastError = message
        record.bytesDone = partSize(record)
        try? await update(record)
        log.error("download \(id) failed: \(message)")
        await context.events.record("download-failed", ["id": String(id), "url": record.url, "error": message])
        if let argv = settings.onFail {
            let result = await context.hooks.run(HookCommand(argv: argv, timeout: settings.hookTimeout), event: "fail",
                                                 variables: ["url": record.url, "dest": absolutePath(record), "error": message, "download_id": String(id)])
            if !result.exit.succeeded { log.warning("on_fail for download \(id) \(result.exit)") }
        }
    }

    /// Refreshes the lease status and the D-Bus object of an active
    /// download once per `progress_interval`, and stores new validators as
    /// soon as the response brings them (so a resume after `kill -9` can
    /// send If-Range).
    private func monitor(_ id: UInt64, _ transfer: CurlTransfer, _ lease: (any LeaseHandle)?) async {
        let clock = context.clock
        var lastBytes: Int64 = -1
        var lastTime = clock.now
        var rate = 0.0
        while !Task.isCancelled {
            let progress = transfer.progress
            let now = clock.now
            if lastBytes >= 0 {
                let seconds = (now - lastTime).seconds
                if seconds > 0 {
                    let instant = Double(progress.bytesDone - lastBytes) / seconds
                    rate = rate == 0 ? instant : 0.5 * rate + 0.5 * instant
                }
            }
            lastBytes = progress.bytesDone
            lastTime = now
            await noteProgress(id, progress, rate: rate, lease: lease)
            do { try await clock.sleep(for: settings.progressInterval) } catch { return }
        }
    }

    private func noteResponse(_ id: UInt64, _ validators: ResponseValidators, discarded: Int64, asked ifRange: String?) async {
        if discarded > 0 {
            // Once per attempt that threw its part away: the server
            // answered the resume with the whole file.
            let why = ifRange != nil && ifRange == validators.ifRange
                ? "the server ignores Range" : "If-Range did not match: the file changed on the server"
            log.notice("download \(id): \(why) (200 to a resume at byte \(discarded)); discarded the partial file and restarted from zero, fetching \(discarded) bytes again")
        }
        guard var record = records[id], record.state == .active, record.validators != validators else { return }
        record.validators = validators
        records[id] = record
        try? await save(record)
    }

    private func noteProgress(_ id: UInt64, _ progress: TransferProgress, rate: Double, lease: (any LeaseHandle)?) async {
        guard var record = records[id], record.state == .active else { return }
        record.bytesDone = progress.bytesDone
        rates[id] = rate
        if let validators = progress.validators, validators != record.validators {
            record.validators = validators
            try? await save(record)
        }
        records[id] = record
        let total = record.validators?.totalLength ?? record.size ?? 0
        await lease?.setStatus([
            "Url": .string(record.url), "Dest": .string(absolutePath(record)),
            "BytesDone": .uint(UInt64(max(0, progress.bytesDone))), "BytesTotal": .uint(UInt64(max(0, total))),
            "Rate": .double(rate),
        ])
        await publish(id, immediately: false)
    }

    // MARK: helpers

    private func update(_ record: DownloadRecord) async throws {
        records[record.id] = record
        do {
            try await save(record)
        } catch {
            log.error("cannot store download \(record.id): \(error)")
            throw error
        }
        await publish(record.id)
    }

    private func save(_ record: DownloadRecord) async throws {
        try await context.store.put(record.storeKey, Array(try JSONEncoder().encode(record)))
    }

    private func absolutePath(_ record: DownloadRecord) -> String {
        (DestinationPath.realPath(settings.dir) ?? settings.dir) + "/" + record.dest
    }

    private func partSize(_ record: DownloadRecord) -> Int64 {
        var st = stat()
        return stat(absolutePath(record) + ".part", &st) == 0 ? Int64(st.st_size) : 0
    }

    /// fsync the part, rename it over the destination, fsync the directory.
    /// Returns a message on failure.
    static func publish(part: String, to path: String) -> String? {
        var st = stat()
        if lstat(path, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR {
            return "destination \(path) is a directory; the download stays in \(part)"
        }
        let fd = open(part, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return "cannot open \(part): \(String(cString: strerror(errno)))" }
        let synced = fsync(fd) == 0
        let syncError = errno
        close(fd)
        guard synced else { return "cannot fsync \(part): \(String(cString: strerror(syncError)))" }
        guard rename(part, path) == 0 else { return "cannot rename \(part) to \(path): \(String(cString: strerror(errno)))" }
        let dir = (path as NSString).deletingLastPathComponent
        let dirFD = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dirFD >= 0 {
            defer { close(dirFD) }
            if fsync(dirFD) != 0 { return "cannot fsync directory \(dir): \(String(cString: strerror(errno)))" }
        }
        return nil
    }

    /// Runs blocking work on a dedicated thread (never on the executor's
    /// workers): libcurl's easy interface blocks for the whole transfer.
    static func onThread<T: Sendable>(_ work: @escaping @Sendable () -> T, onCancel: @escaping @Sendable () -> Void) async -> T {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<T, Never>) in
                let thread = Thread { continuation.resume(returning: work()) }
                thread.name = "vigil-download"
                thread.start()
            }
        } onCancel: {
            onCancel()
        }
    }
}

struct DownloadError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// SHA-256 of a whole file (for a part that was already complete).
enum FileDigest {
    static func sha256(_ path: String) -> Checked<String> {
        guard let hasher = ccurl_sha256_new() else { return .failure("SHA-256 is unavailable") }
        defer { ccurl_sha256_free(hasher) }
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return .failure("cannot read \(path): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 { if errno == EINTR { continue }; return .failure("cannot read \(path): \(String(cString: strerror(errno)))") }
            if n == 0 { break }
            buffer.withUnsafeBytes { _ = ccurl_sha256_update(hasher, $0.baseAddress, n) }
        }
        var digest = [UInt8](repeating: 0, count: 32)
        guard ccurl_sha256_final(hasher, &digest) == 1 else { return .failure("SHA-256 failed") }
        return .success(digest.map { String(format: "%02x", $0) }.joined())
    }
}
