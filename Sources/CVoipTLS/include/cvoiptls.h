#ifndef VIGIL_CVOIPTLS_H
#define VIGIL_CVOIPTLS_H
// OpenSSL for the voip-socket strategy, behind a few C functions: Swift
// cannot import OpenSSL's macros (SSL_set_tlsext_host_name, SSL_set_mode),
// and keeping the error queue handling here gives one place that turns
// OpenSSL's errors into text. No crypto is written here; OpenSSL does it.

/// Results of the non-blocking calls.
static const int vigil_TLS_OK = 0;
static const int vigil_TLS_WANT_READ = 1;
static const int vigil_TLS_WANT_WRITE = 2;
/// The peer closed the TLS session (close_notify) or the TCP stream.
static const int vigil_TLS_CLOSED = 3;
static const int vigil_TLS_ERROR = -1;
/// The handshake failed because the peer's certificate did not verify.
static const int vigil_TLS_VERIFY_FAILED = -2;

/// A client SSL_CTX verifying peers against `ca_file` (NULL: the system
/// store), with an optional client certificate chain and key (both or
/// neither). NULL on failure, with the reason in `error`.
void *vigil_tls_context_new(const char *ca_file, const char *cert_file, const char *key_file, char *error, int error_size);
void vigil_tls_context_free(void *context);

/// A client session on the connected non-blocking socket `fd` (which the
/// caller keeps and closes), sending `server_name` as SNI unless it is an
/// address, and verifying the certificate against it (a DNS name or an IP
/// address). NULL on failure, with the reason in `error`.
void *vigil_tls_session_new(void *context, int fd, const char *server_name, char *error, int error_size);
void vigil_tls_session_free(void *session);

/// One step of the handshake: OK, WANT_READ, WANT_WRITE, or an error
/// (ERROR, VERIFY_FAILED, CLOSED) with the reason in `error`.
int vigil_tls_handshake(void *session, char *error, int error_size);

/// SSL_read: the count (> 0), or 0 with `*status` set to WANT_READ,
/// WANT_WRITE, CLOSED or ERROR (reason in `error`).
long vigil_tls_read(void *session, void *buffer, unsigned long size, int *status, char *error, int error_size);

/// SSL_write: the count (> 0), or 0 with `*status` as for vigil_tls_read.
long vigil_tls_write(void *session, const void *bytes, unsigned long count, int *status, char *error, int error_size);

/// The negotiated protocol ("TLSv1.3").
const char *vigil_tls_version(void *session);

/// MD5 of `data` as 32 lower-case hex digits and a NUL (SIP digest
/// authentication, RFC 2617 / 8760 "MD5").
void vigil_md5_hex(const void *data, unsigned long length, char *out33);
#endif
