import CVoipTLS
import Glibc
import VigilKit

/// `tls = true`: one OpenSSL client context per strategy, shared by its
/// connections, and the name their certificates must carry.
struct TLSSettings: Sendable {
    let context: TLSContext
    /// Sent as SNI (unless an address) and verified against the certificate.
    let serverName: String
}

/// An OpenSSL `SSL_CTX`.
// Invariant: the context is configured in `make` only, before it is shared;
// afterwards it is only passed to SSL_new, which OpenSSL allows from any
// thread at once. It is freed when the last strategy and link let go.
final class TLSContext: @unchecked Sendable {
    let pointer: UnsafeMutableRawPointer

    private init(pointer: UnsafeMutableRawPointer) { self.pointer = pointer }

    /// The context for these files, shared by every strategy that names the
    /// same files with the same modification times: a context holds the
    /// parsed CA store (tens of KiB), and 10,000 connections to one server
    /// should not hold 10,000 copies. A changed file (a renewed CA) makes a
    /// new context; an unused one is freed.
    static func shared(caFile: String?, certFile: String?, keyFile: String?) -> Result<TLSContext, LinkError> {
        func stamp(_ path: String?) -> String {
            guard let path else { return "-" }
            var info = stat()
            guard stat(path, &info) == 0 else { return path }
            return "\(path)@\(info.st_mtim.tv_sec).\(info.st_mtim.tv_nsec):\(info.st_size)"
        }
        let key = [stamp(caFile), stamp(certFile), stamp(keyFile)].joined(separator: "|")
        return contextCache.withLock { cache in
            if let context = cache[key]?.context { return .success(context) }
            let made = make(caFile: caFile, certFile: certFile, keyFile: keyFile)
            if case .success(let context) = made {
                cache = cache.filter { $0.value.context != nil }
                cache[key] = WeakContext(context: context)
            }
            return made
        }
    }

    static func make(caFile: String?, certFile: String?, keyFile: String?) -> Result<TLSContext, LinkError> {
        var error = [CChar](repeating: 0, count: 512)
        guard let pointer = vigil_tls_context_new(caFile, certFile, keyFile, &error, Int32(error.count)) else {
            return .failure(LinkError(text(error)))
        }
        return .success(TLSContext(pointer: pointer))
    }

    deinit { vigil_tls_context_free(pointer) }
}

/// One connection's `SSL`, used only under its ``TCPLink``'s lock.
struct TLSSession: @unchecked Sendable {
    // Invariant: only touched inside the owning link's Lock (event thread
    // or a sender), never by two threads at once; freed once by `free`.
    let pointer: UnsafeMutableRawPointer
    /// Keeps the context alive as long as the session.
    let context: TLSContext

    static func make(_ settings: TLSSettings, fd: Int32) -> Result<TLSSession, LinkError> {
        var error = [CChar](repeating: 0, count: 512)
        guard let pointer = vigil_tls_session_new(settings.context.pointer, fd, settings.serverName, &error, Int32(error.count)) else {
            return .failure(LinkError(text(error)))
        }
        return .success(TLSSession(pointer: pointer, context: settings.context))
    }

    func free() { vigil_tls_session_free(pointer) }
}

private struct WeakContext {
    weak var context: TLSContext?
}

/// Contexts in use, by their files (see ``TLSContext/shared``).
private let contextCache = Lock<[String: WeakContext]>([:])
