#ifndef CCURL_SHIM_H
#define CCURL_SHIM_H
// Non-variadic wrappers for libcurl's variadic curl_easy_setopt and
// curl_easy_getinfo, which Swift cannot call.
#include <curl/curl.h>
#include <stddef.h>

typedef size_t (*ccurl_data_callback)(char *data, size_t size, size_t count, void *user);
typedef int (*ccurl_progress_callback)(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow);

CURLcode ccurl_setopt_long(CURL *handle, CURLoption option, long value);
CURLcode ccurl_setopt_offt(CURL *handle, CURLoption option, curl_off_t value);
CURLcode ccurl_setopt_string(CURL *handle, CURLoption option, const char *value);
CURLcode ccurl_setopt_pointer(CURL *handle, CURLoption option, void *value);
CURLcode ccurl_setopt_data_callback(CURL *handle, CURLoption option, ccurl_data_callback callback);
CURLcode ccurl_setopt_progress_callback(CURL *handle, ccurl_progress_callback callback);
CURLcode ccurl_getinfo_long(CURL *handle, CURLINFO info, long *value);
CURLcode ccurl_getinfo_offt(CURL *handle, CURLINFO info, curl_off_t *value);
CURLcode ccurl_getinfo_string(CURL *handle, CURLINFO info, const char **value);

// Option and info constants Swift may not import (enum values built from macros).
extern const CURLoption ccurl_opt_url, ccurl_opt_writefunction, ccurl_opt_writedata,
    ccurl_opt_headerfunction, ccurl_opt_headerdata, ccurl_opt_xferinfodata, ccurl_opt_noprogress,
    ccurl_opt_followlocation, ccurl_opt_maxredirs, ccurl_opt_connecttimeout_ms,
    ccurl_opt_low_speed_limit, ccurl_opt_low_speed_time, ccurl_opt_httpheader,
    ccurl_opt_errorbuffer, ccurl_opt_nosignal, ccurl_opt_buffersize, ccurl_opt_useragent,
    ccurl_opt_protocols_str, ccurl_opt_redir_protocols_str, ccurl_opt_failonerror;
extern const CURLINFO ccurl_info_response_code, ccurl_info_effective_url,
    ccurl_info_size_download_t, ccurl_info_request_size;

// SHA-256 through OpenSSL's EVP interface (libcurl here is built on OpenSSL).
typedef struct ccurl_sha256 ccurl_sha256;
ccurl_sha256 *ccurl_sha256_new(void);
int ccurl_sha256_update(ccurl_sha256 *ctx, const void *data, size_t count);
/// Writes 32 bytes to out and resets the context for new input.
int ccurl_sha256_final(ccurl_sha256 *ctx, unsigned char *out);
void ccurl_sha256_free(ccurl_sha256 *ctx);
#endif
