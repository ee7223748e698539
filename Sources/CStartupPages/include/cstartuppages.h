#ifndef VIGIL_CSTARTUPPAGES_H
#define VIGIL_CSTARTUPPAGES_H
// Drops the resident pages of the code and read-only data of every loaded
// ELF object (Sources/VigilHost/Supervisor/StartupPages.swift says why).
// In C because it walks the loader's list with dl_iterate_phdr, which
// Swift's Glibc module does not export, and because it must advise while
// the loader's list lock is held (see the .c file).
#include <stddef.h>

/// What one release did.
typedef struct {
    /// Bytes of address space advised (mapped, not necessarily resident).
    size_t advised_bytes;
    /// Loaded objects whose read-only segments were advised.
    int objects;
    /// Objects skipped: the vDSO, and objects with text relocations.
    int skipped;
    /// madvise calls that failed (e.g. EINVAL on a locked mapping).
    int failures;
} vigil_startup_pages_result;

/// madvise(MADV_DONTNEED) on every whole page of every non-writable
/// PT_LOAD segment (code, read-only data) of every loaded object, then
/// malloc_trim(0) (free heap pages back to the kernel).
vigil_startup_pages_result vigil_release_startup_pages(void);

#endif
