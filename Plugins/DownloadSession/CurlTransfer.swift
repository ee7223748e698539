import CCurl
import CCurlShim
import Foundation
import VigilKit

/// libcurl is initialised once per process, before any handle exists.
enum CurlGlobal {
    // 3 is CURL_GLOBAL_ALL (SSL | WIN32), a macro Swift cannot import.
    static let initialised: Bool = curl_global_init(3) == CURLE_OK
}

/// What one HTTP attempt asks for.
struct TransferRequest: Sendable {
    var url: String
    /// The `.part` file; created if missing. Its size is where a resume starts.
    var partPath: String
    /// `If-Range` value (a strong ETag or an HTTP date) when resuming; nil
    /// means no resume: the part is truncated and the transfer starts at 0.
    var ifRange: String?
    /// The resource's full length as the response that began the part said;
    /// a 206 that gives another total is refused (only with `ifRange`).
    var expectedTotal: Int64? = nil
    var connectTimeout: Duration
    /// Abort when on average less than 1 byte a second arrived over this
    /// window (libcurl's low-speed limit).
    var stallTimeout: Duration
    /// libcurl's receive buffer: the largest write to the part file.
    var writeChunk: Int
    /// PEM file of trusted CAs for https; nil: libcurl's default store.
    var caFile: String? = nil
}

/// Validators and length of the response that wrote the part file.
struct ResponseValidators: Sendable, Hashable, Codable {
    var etag: String?
    var lastModified: String?
    /// The full length of the resource, when the server said.
    var totalLength: Int64?

    /// The If-Range value for a resume: a strong ETag, else the
    /// Last-Modified date; nil when the part cannot safely be resumed.
    var ifRange: String? {
        if let etag, !etag.hasPrefix("W/") { return etag }
        return lastModified
    }
}

/// How an attempt ended.
enum TransferOutcome: Sendable {
    /// The body was received entirely: the part holds `length` bytes whose
    /// SHA-256 is `digest` (lowercase hex).
    case complete(length: Int64, digest: String, validators: ResponseValidators, resumedFrom: Int64)
    /// The server answered with an error status (not 2xx, not 416).
    case httpStatus(Int, retryAfter: String?)
    /// 416 to a resume: `completeLength` is the length the server reports
    /// (`Content-Range: bytes */N`), when it said.
    case rangeNotSatisfiable(completeLength: Int64?)
    /// A 206 whose Content-Range does not start where we asked.
    case badContentRange(String)
    /// libcurl failed: connect, timeout, stall, TLS, protocol...
    case transport(code: Int, message: String)
    /// Writing the part file failed (file-size limit, I/O error, ...).
    case writeFailed(String)
    /// The part file's filesystem is full (ENOSPC, EDQUOT).
    case noSpace(String)
    case cancelled
}

/// Progress of a running transfer, read by the async side once a second.
struct TransferProgress: Sendable {
    var bytesDone: Int64 = 0
    var bytesTotal: Int64 = 0
    var validators: ResponseValidators?
}

/// One HTTP GET into a part file, run by libcurl's easy interface on a
/// dedicated thread (never the Swift executor's threads: `curl_easy_perform`
/// blocks for the whole transfer).
///
/// `@unchecked Sendable`: the mutable state below is split in two. Fields
/// under "transfer thread only" are touched only by the thread running
/// `perform()` (libcurl calls the callbacks on it). `shared` is a lock,
/// read from other threads for progress and written by `cancel()`.
final class CurlTransfer: @unchecked Sendable {
    let request: TransferRequest

    private struct Shared {
        var progress = TransferProgress()
        var cancelRequested = false
    }
    private let shared = Lock(Shared())

    // MARK: transfer thread only
    private var fd: Int32 = -1
    private var resumeFrom: Int64 = 0
    private var written: Int64 = 0
    private var head = ResponseHead()
    private var bodyDecided = false
    /// Bytes of the part a 200 to a resume threw away.
    private var discarded: Int64 = 0
    /// The body goes to the file (2xx); otherwise it is read and dropped.
    private var bodyToFile = false
    private var failure: TransferOutcome?
    private let hasher: OpaquePointer?

    /// Called on the transfer thread when a 2xx response starts writing
    /// the part file, with its validators (stored before much is written,
    /// so a resume after `kill -9` can send If-Range) and the bytes of the
    /// part it threw away (a 200 to a resume: the download starts again
    /// from zero).
    private let onResponse: @Sendable (_ validators: ResponseValidators, _ discarded: Int64) -> Void

    /// Where the bytes of the exchange are counted (the strategy's
    /// BytesReceived as they arrive, BytesSent when the attempt ends).
    private let cost: any CostRecording

    init(_ request: TransferRequest, cost: any CostRecording = UncountedCost(),
         onResponse: @escaping @Sendable (ResponseValidators, Int64) -> Void = { _, _ in }) {
        self.cost = cost
        self.request = request
        self.onResponse = onResponse
        self.hasher = ccurl_sha256_new()
    }

    deinit { ccurl_sha256_free(hasher) }

    var progress: TransferProgress { shared.withLock { $0.progress } }

    /// Asks the transfer to stop; `perform()` returns `.cancelled` soon after.
    func cancel() { shared.withLock { $0.cancelRequested = true } }

    private var isCancelled: Bool { shared.withLock { $0.cancelRequested } }

    /// Runs the attempt to its end. Blocking: call on a dedicated thread.
    func perform() -> TransferOutcome {
        _ = CurlGlobal.initialised
        fd = open(request.partPath, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o644)
        guard fd >= 0 else { return .writeFailed("cannot open \(request.partPath): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { return .writeFailed("cannot stat \(request.partPath): \(String(cString: strerror(errno)))") }
        resumeFrom = request.ifRange == nil ? 0 : Int64(st.st_size)
        if resumeFrom == 0, st.st_size > 0, ftruncate(fd, 0) != 0 {
            return .writeFailed("cannot truncate \(request.partPath): \(String(cString: strerror(errno)))")
        }
        if resumeFrom > 0, let failure = hashExistingPrefix() { return failure }
        shared.withLock { $0.progress.bytesDone = resumeFrom }

        guard let handle = curl_easy_init() else { return .transport(code: -1, message: "curl_easy_init failed") }
        defer { curl_easy_cleanup(handle) }
        var errorBuffer = [CChar](repeating: 0, count: Int(CURL_ERROR_SIZE) + 1)
        var headerList: UnsafeMutablePointer<curl_slist>?
        defer { curl_slist_free_all(headerList) }
        if resumeFrom > 0, let ifRange = request.ifRange {
            headerList = curl_slist_append(headerList, "If-Range: \(ifRange)")
        }
        let me = Unmanaged.passUnretained(self).toOpaque()
        let code: CURLcode = errorBuffer.withUnsafeMutableBufferPointer { errors in
            ccurl_setopt_string(handle, ccurl_opt_url, request.url)
            ccurl_setopt_long(handle, ccurl_opt_nosignal, 1)
            ccurl_setopt_long(handle, ccurl_opt_followlocation, 1)
            ccurl_setopt_long(handle, ccurl_opt_maxredirs, 10)
            ccurl_setopt_string(handle, ccurl_opt_protocols_str, "http,https")
            ccurl_setopt_string(handle, ccurl_opt_redir_protocols_str, "http,https")
            ccurl_setopt_string(handle, ccurl_opt_useragent, "vigil-download-session/1 (libcurl)")
            ccurl_setopt_long(handle, ccurl_opt_connecttimeout_ms, max(1, Int(request.connectTimeout.components.seconds * 1000 + request.connectTimeout.components.attoseconds / 1_000_000_000_000_000)))
            ccurl_setopt_long(handle, ccurl_opt_low_speed_limit, 1)
            ccurl_setopt_long(handle, ccurl_opt_low_speed_time, max(1, Int(request.stallTimeout.components.seconds)))
            ccurl_setopt_long(handle, ccurl_opt_buffersize, request.writeChunk)
            ccurl_setopt_pointer(handle, ccurl_opt_errorbuffer, errors.baseAddress)
            if let caFile = request.caFile { ccurl_setopt_string(handle, CURLOPT_CAINFO, caFile) }
            if resumeFrom > 0 {
                ccurl_setopt_string(handle, CURLOPT_RANGE, "\(resumeFrom)-")
            }
            if let headerList { ccurl_setopt_pointer(handle, ccurl_opt_httpheader, headerList) }
            ccurl_setopt_data_callback(handle, ccurl_opt_headerfunction) { data, size, count, user in
                guard let data, let user else { return 0 }
                let me = Unmanaged<CurlTransfer>.fromOpaque(user).takeUnretainedValue()
                me.header(UnsafeRawBufferPointer(start: data, count: size * count))
                return size * count
            }
            ccurl_setopt_pointer(handle, ccurl_opt_headerdata, me)
            ccurl_setopt_data_callback(handle, ccurl_opt_writefunction) { data, size, count, user in
                guard let data, let user else { return 0 }
                let me = Unmanaged<CurlTransfer>.fromOpaque(user).takeUnretainedValue()
                return me.body(UnsafeRawBufferPointer(start: data, count: size * count)) ? size * count : 0
            }
            ccurl_setopt_pointer(handle, ccurl_opt_writedata, me)
            ccurl_setopt_long(handle, ccurl_opt_noprogress, 0)
            ccurl_setopt_progress_callback(handle) { user, _, _, _, _ in
                guard let user else { return 0 }
                return Unmanaged<CurlTransfer>.fromOpaque(user).takeUnretainedValue().isCancelled ? 1 : 0
            }
            ccurl_setopt_pointer(handle, ccurl_opt_xferinfodata, me)
            let code = curl_easy_perform(handle)
            // What went out: every request libcurl sent (a redirect's too).
            var sent = 0
            ccurl_getinfo_long(handle, ccurl_info_request_size, &sent)
            cost.networkBytes(sent: UInt64(max(0, sent)), received: 0)
            return code
        }
        if isCancelled { return .cancelled }
        if let failure { return failure }
        if code != CURLE_OK {
            let detail = String(decoding: errorBuffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            let message = detail.isEmpty ? String(cString: curl_easy_strerror(code)) : detail
            return .transport(code: Int(code.rawValue), message: message)
        }
        var finalStatus = 0
        ccurl_getinfo_long(handle, ccurl_info_response_code, &finalStatus)
        if finalStatus == 416 {
            return .rangeNotSatisfiable(completeLength: ResponseHead.completeLength(head["content-range"]))
        }
        guard (200...299).contains(finalStatus), bodyToFile || finalStatus == 204 || written == 0 else {
            return .httpStatus(finalStatus, retryAfter: head["retry-after"])
        }
        if !bodyDecided, let failure = decideBody() { return failure }
        var digest = [UInt8](repeating: 0, count: 32)
        guard ccurl_sha256_final(hasher, &digest) == 1 else { return .writeFailed("SHA-256 failed") }
        return .complete(length: resumeFrom + written, digest: digest.map { String(format: "%02x", $0) }.joined(),
                         validators: validators(), resumedFrom: resumeFrom)
    }

    // MARK: callbacks (transfer thread)

    private func header(_ bytes: UnsafeRawBufferPointer) {
        cost.networkBytes(sent: 0, received: UInt64(bytes.count))
        head.take(line: bytes)
    }

    /// Decides where the body goes from the final response's status and
    /// headers. Returns a failure to abort the transfer.
    private func decideBody() -> TransferOutcome? {
        bodyDecided = true
        switch head.status {
        case 206:
            if let problem = head.partialContentProblem(resumeFrom: resumeFrom, expectedTotal: request.expectedTotal) {
                return .badContentRange(problem)
            }
            bodyToFile = true
        case 200...299:
            discarded = resumeFrom
            if resumeFrom > 0 {
                // The resource changed (If-Range did not match) or the server
                // ignores ranges: start again from zero.
                resumeFrom = 0
                guard ftruncate(fd, 0) == 0, lseek(fd, 0, SEEK_SET) == 0 else {
                    return .writeFailed("cannot truncate \(request.partPath): \(String(cString: strerror(errno)))")
                }
                // Finalising resets the hasher for the new content.
                var scratch = [UInt8](repeating: 0, count: 32)
                _ = ccurl_sha256_final(hasher, &scratch)
            }
            bodyToFile = true
        default:
            bodyToFile = false
        }
        if bodyToFile {
            guard lseek(fd, off_t(resumeFrom), SEEK_SET) >= 0 else {
                return .writeFailed("cannot seek in \(request.partPath): \(String(cString: strerror(errno)))")
            }
            let total = head.totalLength(resumeFrom: resumeFrom)
            let found = validators(total: total)
            shared.withLock {
                $0.progress.validators = found
                $0.progress.bytesTotal = total ?? 0
                $0.progress.bytesDone = resumeFrom
            }
            onResponse(found, discarded)
        }
        return nil
    }

    private func body(_ bytes: UnsafeRawBufferPointer) -> Bool {
        cost.networkBytes(sent: 0, received: UInt64(bytes.count))
        if !bodyDecided, let failure = decideBody() {
            self.failure = failure
            return false
        }
        guard bodyToFile else { return true }
        var offset = 0
        while offset < bytes.count {
            let n = write(fd, bytes.baseAddress! + offset, bytes.count - offset)  // base is non-nil: count > 0
            if n < 0 {
                if errno == EINTR { continue }
                let message = "cannot write \(request.partPath): \(String(cString: strerror(errno)))"
                failure = errno == ENOSPC || errno == EDQUOT ? .noSpace(message) : .writeFailed(message)
                return false
            }
            offset += n
        }
        ccurl_sha256_update(hasher, bytes.baseAddress, bytes.count)
        written += Int64(bytes.count)
        let done = resumeFrom + written
        shared.withLock { $0.progress.bytesDone = done }
        return true
    }

    /// Feeds the bytes already in the part file to the hasher.
    private func hashExistingPrefix() -> TransferOutcome? {
        let reader = open(request.partPath, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard reader >= 0 else { return .writeFailed("cannot read \(request.partPath): \(String(cString: strerror(errno)))") }
        defer { close(reader) }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var left = resumeFrom
        while left > 0 {
            if isCancelled { return .cancelled }
            let n = buffer.withUnsafeMutableBytes { read(reader, $0.baseAddress, min($0.count, Int(clamping: left))) }
            if n < 0 { if errno == EINTR { continue }; return .writeFailed("cannot read \(request.partPath): \(String(cString: strerror(errno)))") }
            if n == 0 { break }
            buffer.withUnsafeBytes { _ = ccurl_sha256_update(hasher, $0.baseAddress, n) }
            left -= Int64(n)
        }
        return nil
    }

    private func validators(total: Int64? = nil) -> ResponseValidators {
        ResponseValidators(etag: head["etag"], lastModified: head["last-modified"],
                           totalLength: total ?? shared.withLock { $0.progress.bytesTotal > 0 ? $0.progress.bytesTotal : nil })
    }
}

/// URL checks done before anything is queued, with libcurl's own parser.
enum URLCheck {
    /// The URL's path, if `url` is an absolute http or https URL; a
    /// message for people otherwise.
    static func validate(_ url: String) -> Checked<String> {
        _ = CurlGlobal.initialised
        guard let handle = curl_url() else { return .failure("cannot parse URLs (out of memory)") }
        defer { curl_url_cleanup(handle) }
        let rc = curl_url_set(handle, CURLUPART_URL, url, 0)
        guard rc == CURLUE_OK else {
            return .failure("malformed URL \"\(ClientText.excerpt(url))\": \(String(cString: curl_url_strerror(rc)))")
        }
        func part(_ which: CURLUPart) -> String? {
            var out: UnsafeMutablePointer<CChar>?
            guard curl_url_get(handle, which, &out, 0) == CURLUE_OK, let out else { return nil }
            defer { curl_free(out) }
            return String(cString: out)
        }
        let scheme = part(CURLUPART_SCHEME)?.lowercased() ?? ""
        guard scheme == "http" || scheme == "https" else {
            return .failure("unsupported URL scheme \"\(ClientText.excerpt(scheme))\" in \"\(ClientText.excerpt(url))\"; expected http or https")
        }
        guard let host = part(CURLUPART_HOST), !host.isEmpty else {
            return .failure("malformed URL \"\(ClientText.excerpt(url))\": no host")
        }
        return .success(part(CURLUPART_PATH) ?? "/")
    }
}

/// A value or a message for people.
enum Checked<T: Sendable>: Sendable {
    case success(T)
    case failure(String)
}
