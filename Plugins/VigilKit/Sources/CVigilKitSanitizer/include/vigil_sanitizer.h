#ifndef VIGIL_SANITIZER_H
#define VIGIL_SANITIZER_H
/// ThreadSanitizer's happens-before annotations, for locks it cannot see
/// (VigilKit's Lock). No-ops unless the process runs with TSan's runtime.
void vigil_tsan_acquire(void *address);
void vigil_tsan_release(void *address);
#endif
