#include "ccurl_shim.h"
#include <openssl/evp.h>
#include <stdlib.h>

struct ccurl_sha256 { EVP_MD_CTX *md; };

ccurl_sha256 *ccurl_sha256_new(void) {
    ccurl_sha256 *ctx = malloc(sizeof *ctx);
    if (!ctx) return NULL;
    ctx->md = EVP_MD_CTX_new();
    if (!ctx->md || EVP_DigestInit_ex(ctx->md, EVP_sha256(), NULL) != 1) { EVP_MD_CTX_free(ctx->md); free(ctx); return NULL; }
    return ctx;
}
int ccurl_sha256_update(ccurl_sha256 *ctx, const void *data, size_t count) { return EVP_DigestUpdate(ctx->md, data, count); }
int ccurl_sha256_final(ccurl_sha256 *ctx, unsigned char *out) {
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx->md, out, &len) != 1) return 0;
    return EVP_DigestInit_ex(ctx->md, EVP_sha256(), NULL);
}
void ccurl_sha256_free(ccurl_sha256 *ctx) { if (ctx) { EVP_MD_CTX_free(ctx->md); free(ctx); } }

CURLcode ccurl_setopt_long(CURL *handle, CURLoption option, long value) { return curl_easy_setopt(handle, option, value); }
CURLcode ccurl_setopt_offt(CURL *handle, CURLoption option, curl_off_t value) { return curl_easy_setopt(handle, option, value); }
CURLcode ccurl_setopt_string(CURL *handle, CURLoption option, const char *value) { return curl_easy_setopt(handle, option, value); }
CURLcode ccurl_setopt_pointer(CURL *handle, CURLoption option, void *value) { return curl_easy_setopt(handle, option, value); }
CURLcode ccurl_setopt_data_callback(CURL *handle, CURLoption option, ccurl_data_callback callback) { return curl_easy_setopt(handle, option, callback); }
CURLcode ccurl_setopt_progress_callback(CURL *handle, ccurl_progress_callback callback) { return curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, callback); }
CURLcode ccurl_getinfo_long(CURL *handle, CURLINFO info, long *value) { return curl_easy_getinfo(handle, info, value); }
CURLcode ccurl_getinfo_offt(CURL *handle, CURLINFO info, curl_off_t *value) { return curl_easy_getinfo(handle, info, value); }
CURLcode ccurl_getinfo_string(CURL *handle, CURLINFO info, const char **value) { return curl_easy_getinfo(handle, info, (char **)value); }

const CURLoption ccurl_opt_url = CURLOPT_URL;
const CURLoption ccurl_opt_writefunction = CURLOPT_WRITEFUNCTION;
const CURLoption ccurl_opt_writedata = CURLOPT_WRITEDATA;
const CURLoption ccurl_opt_headerfunction = CURLOPT_HEADERFUNCTION;
const CURLoption ccurl_opt_headerdata = CURLOPT_HEADERDATA;
const CURLoption ccurl_opt_xferinfodata = CURLOPT_XFERINFODATA;
const CURLoption ccurl_opt_noprogress = CURLOPT_NOPROGRESS;
const CURLoption ccurl_opt_followlocation = CURLOPT_FOLLOWLOCATION;
const CURLoption ccurl_opt_maxredirs = CURLOPT_MAXREDIRS;
const CURLoption ccurl_opt_connecttimeout_ms = CURLOPT_CONNECTTIMEOUT_MS;
const CURLoption ccurl_opt_low_speed_limit = CURLOPT_LOW_SPEED_LIMIT;
const CURLoption ccurl_opt_low_speed_time = CURLOPT_LOW_SPEED_TIME;
const CURLoption ccurl_opt_httpheader = CURLOPT_HTTPHEADER;
const CURLoption ccurl_opt_errorbuffer = CURLOPT_ERRORBUFFER;
const CURLoption ccurl_opt_nosignal = CURLOPT_NOSIGNAL;
const CURLoption ccurl_opt_buffersize = CURLOPT_BUFFERSIZE;
const CURLoption ccurl_opt_useragent = CURLOPT_USERAGENT;
const CURLoption ccurl_opt_protocols_str = CURLOPT_PROTOCOLS_STR;
const CURLoption ccurl_opt_redir_protocols_str = CURLOPT_REDIR_PROTOCOLS_STR;
const CURLoption ccurl_opt_failonerror = CURLOPT_FAILONERROR;
const CURLINFO ccurl_info_response_code = CURLINFO_RESPONSE_CODE;
const CURLINFO ccurl_info_effective_url = CURLINFO_EFFECTIVE_URL;
const CURLINFO ccurl_info_size_download_t = CURLINFO_SIZE_DOWNLOAD_T;
const CURLINFO ccurl_info_request_size = CURLINFO_REQUEST_SIZE;
