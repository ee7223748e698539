import CVoipTLS

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
    // Invariant: only touched inside the owning link's Mutex (event thread
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
