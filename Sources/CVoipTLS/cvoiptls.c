#include "cvoiptls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

// The message of the first error on this thread's OpenSSL queue, after
// `what`; the queue is emptied.
static void take_error(const char *what, char *error, int size) {
    unsigned long code = ERR_get_error();
    char detail[256] = "no detail from OpenSSL";
    if (code != 0) ERR_error_string_n(code, detail, sizeof detail);
    ERR_clear_error();
    snprintf(error, (size_t)size, "%s: %s", what, detail);
}

// A socket BIO that sends with MSG_NOSIGNAL: a peer that closed gives
// EPIPE, never a SIGPIPE that would kill the host.
static int nosig_write(BIO *bio, const char *data, int length) {
    int fd = (int)(intptr_t)BIO_get_data(bio);
    BIO_clear_retry_flags(bio);
    ssize_t n;
    do { n = send(fd, data, (size_t)length, MSG_NOSIGNAL); } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_write(bio);
    return (int)n;
}

static int nosig_read(BIO *bio, char *data, int length) {
    int fd = (int)(intptr_t)BIO_get_data(bio);
    BIO_clear_retry_flags(bio);
    ssize_t n;
    do { n = recv(fd, data, (size_t)length, 0); } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) BIO_set_retry_read(bio);
    return (int)n;
}

static long nosig_ctrl(BIO *bio, int command, long number, void *pointer) {
    (void)bio; (void)number; (void)pointer;
    return command == BIO_CTRL_FLUSH ? 1 : 0;
}

static int nosig_create(BIO *bio) { BIO_set_init(bio, 1); return 1; }

static BIO_METHOD *shared_method;
static void make_method(void) {
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "vigil socket");
    if (m == NULL) return;
    BIO_meth_set_write(m, nosig_write);
    BIO_meth_set_read(m, nosig_read);
    BIO_meth_set_ctrl(m, nosig_ctrl);
    BIO_meth_set_create(m, nosig_create);
    shared_method = m;
}

void *vigil_tls_context_new(const char *ca_file, const char *cert_file, const char *key_file, char *error, int size) {
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) { take_error("cannot create a TLS context", error, size); return NULL; }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    // A peer that closes without close_notify ends the session like a clean close.
    SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    int ok = ca_file != NULL ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL) : SSL_CTX_set_default_verify_paths(ctx);
    if (ok != 1) {
        char what[512];
        snprintf(what, sizeof what, "cannot load the CA certificates %s%s", ca_file ? "from " : "of the system store", ca_file ? ca_file : "");
        take_error(what, error, size);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (cert_file != NULL) {
        char what[512];
        if (SSL_CTX_use_certificate_chain_file(ctx, cert_file) != 1) {
            snprintf(what, sizeof what, "cannot load the client certificate %s", cert_file);
            take_error(what, error, size);
            SSL_CTX_free(ctx);
            return NULL;
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key_file, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
            snprintf(what, sizeof what, "cannot use the client key %s with %s", key_file, cert_file);
            take_error(what, error, size);
            SSL_CTX_free(ctx);
            return NULL;
        }
    }
    return ctx;
}

void vigil_tls_context_free(void *context) { SSL_CTX_free(context); }

void *vigil_tls_session_new(void *context, int fd, const char *server_name, char *error, int size) {
    static CRYPTO_ONCE once = CRYPTO_ONCE_STATIC_INIT;
    ERR_clear_error();
    if (!CRYPTO_THREAD_run_once(&once, make_method) || shared_method == NULL) {
        take_error("cannot create the TLS socket method", error, size);
        return NULL;
    }
    SSL *ssl = SSL_new(context);
    if (ssl == NULL) { take_error("cannot create a TLS session", error, size); return NULL; }
    BIO *bio = BIO_new(shared_method);
    if (bio == NULL) { take_error("cannot create a TLS socket BIO", error, size); SSL_free(ssl); return NULL; }
    BIO_set_data(bio, (void *)(intptr_t)fd);
    SSL_set_bio(ssl, bio, bio);
    if (server_name != NULL && server_name[0] != 0) {
        unsigned char address[16];
        int is_ip = inet_pton(AF_INET, server_name, address) == 1 || inet_pton(AF_INET6, server_name, address) == 1;
        int ok = is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), server_name)
                       : (SSL_set_tlsext_host_name(ssl, server_name) == 1 && SSL_set1_host(ssl, server_name) == 1);
        if (ok != 1) {
            take_error("cannot set the TLS server name", error, size);
            SSL_free(ssl);
            return NULL;
        }
    }
    return ssl;
}

void vigil_tls_session_free(void *session) { SSL_free(session); }

// Maps an SSL_get_error code to our status, with the reason for errors.
static int status_of(SSL *ssl, int rc, const char *what, char *error, int size) {
    int e = SSL_get_error(ssl, rc);
    switch (e) {
    case SSL_ERROR_WANT_READ: return vigil_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE: return vigil_TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        snprintf(error, (size_t)size, "the peer closed the TLS session");
        return vigil_TLS_CLOSED;
    case SSL_ERROR_SYSCALL:
        if (ERR_peek_error() == 0) {
            if (errno == 0 || rc == 0) snprintf(error, (size_t)size, "%s: the peer closed the connection", what);
            else snprintf(error, (size_t)size, "%s: %s", what, strerror(errno));
            return errno == 0 || rc == 0 ? vigil_TLS_CLOSED : vigil_TLS_ERROR;
        }
        take_error(what, error, size);
        return vigil_TLS_ERROR;
    default:
        take_error(what, error, size);
        return vigil_TLS_ERROR;
    }
}

int vigil_tls_handshake(void *session, char *error, int size) {
    SSL *ssl = session;
    ERR_clear_error();
    errno = 0;
    int rc = SSL_connect(ssl);
    if (rc == 1) return vigil_TLS_OK;
    long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) {
        snprintf(error, (size_t)size, "TLS certificate verification failed: %s", X509_verify_cert_error_string(verify));
        ERR_clear_error();
        return vigil_TLS_VERIFY_FAILED;
    }
    return status_of(ssl, rc, "TLS handshake failed", error, size);
}

long vigil_tls_read(void *session, void *buffer, unsigned long size, int *status, char *error, int error_size) {
    SSL *ssl = session;
    ERR_clear_error();
    errno = 0;
    int cap = size > 0x7fffffff ? 0x7fffffff : (int)size;
    int n = SSL_read(ssl, buffer, cap);
    if (n > 0) { *status = vigil_TLS_OK; return n; }
    *status = status_of(ssl, n, "TLS read failed", error, error_size);
    return 0;
}

long vigil_tls_write(void *session, const void *bytes, unsigned long count, int *status, char *error, int error_size) {
    SSL *ssl = session;
    ERR_clear_error();
    errno = 0;
    int cap = count > 0x7fffffff ? 0x7fffffff : (int)count;
    int n = SSL_write(ssl, bytes, cap);
    if (n > 0) { *status = vigil_TLS_OK; return n; }
    *status = status_of(ssl, n, "TLS write failed", error, error_size);
    return 0;
}

const char *vigil_tls_version(void *session) { return SSL_get_version(session); }

void vigil_md5_hex(const void *data, unsigned long length, char *out33) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    EVP_Digest(data, length, digest, &size, EVP_md5(), NULL);
    for (unsigned int i = 0; i < size && i < 16; i++) snprintf(out33 + 2 * i, 3, "%02x", digest[i]);
    out33[32] = 0;
}
