#include <curl/curl.h>
#include <openssl/evp.h>
