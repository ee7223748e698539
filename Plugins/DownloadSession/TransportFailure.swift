import CCurl

/// Which libcurl failures are permanent, and what to tell people about them.
///
/// Most transport failures (refused connections, resets, stalls, DNS
/// hiccups) are worth another try after the backoff. These are not: the
/// server or the configuration gives the same answer every time, so the
/// download fails at once with a message that says what to change.
enum TransportFailure {
    /// A message for `LastError` when `code` is permanent; nil when the
    /// attempt should be retried.
    static func permanentMessage(code: Int, message: String, url: String, caFile: String?) -> String? {
        switch code {
        case Int(CURLE_TOO_MANY_REDIRECTS.rawValue):
            return "too many redirects (a redirect loop?) from \(url): \(message)"
        case Int(CURLE_UNSUPPORTED_PROTOCOL.rawValue):
            // The configured URL was checked to be http or https, so this is a redirect.
            return "refused a redirect to an unsupported scheme from \(url) (only http and https are followed): \(message)"
        case Int(CURLE_PEER_FAILED_VERIFICATION.rawValue):
            let trust = caFile.map { "the CA file \($0)" } ?? "the system CA store (set ca_file to trust another CA)"
            return "TLS certificate of \(url) is not trusted by \(trust): \(message)"
        case Int(CURLE_SSL_CACERT_BADFILE.rawValue):
            return "cannot use the CA file \(caFile ?? "(system store)") for \(url): \(message)"
        default:
            return nil
        }
    }
}
