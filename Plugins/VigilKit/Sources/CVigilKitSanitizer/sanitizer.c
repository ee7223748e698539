#include "vigil_sanitizer.h"

// Weak: defined only when the executable links ThreadSanitizer's runtime
// (`-sanitize=thread`), which exports them to every library it loads.
void __tsan_acquire(void *address) __attribute__((weak));
void __tsan_release(void *address) __attribute__((weak));

void vigil_tsan_acquire(void *address) {
    if (__tsan_acquire) __tsan_acquire(address);
}

void vigil_tsan_release(void *address) {
    if (__tsan_release) __tsan_release(address);
}
