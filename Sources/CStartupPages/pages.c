#define _GNU_SOURCE
#include "cstartuppages.h"
#include <elf.h>
#include <link.h>
#include <malloc.h>
#include <stdint.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>

// Why MADV_DONTNEED on these segments and nothing else:
// - A non-writable PT_LOAD segment (r-x code, r-- rodata) is mapped private
//   from the file and never written after it is mapped, so every resident
//   page of it is a clean page of the page cache. Dropping it from the page
//   table loses nothing: the next access maps the same page-cache page again
//   (a minor fault, no disk read while the page stays cached).
// - RELRO (relocated, then made read-only) lives inside the writable
//   segment, so it is never touched here; neither is .data, .bss or the heap.
// - Objects with text relocations wrote to their code: skipped.
// - dl_iterate_phdr holds the loader's list lock while it calls us, and
//   dlclose removes an object from the list under that lock before it
//   unmaps it, so no segment we advise can be unmapped (and its addresses
//   reused for writable memory) while we advise it.
struct release_state {
    uintptr_t page;
    uintptr_t vdso;
    vigil_startup_pages_result result;
};

static int has_text_relocations(const struct dl_phdr_info *info) {
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_DYNAMIC) continue;
        const ElfW(Dyn) *dyn = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
        for (; dyn->d_tag != DT_NULL; dyn++) {
            if (dyn->d_tag == DT_TEXTREL) return 1;
            if (dyn->d_tag == DT_FLAGS && (dyn->d_un.d_val & DF_TEXTREL)) return 1;
        }
    }
    return 0;
}

static int release_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct release_state *state = data;
    uintptr_t headers = (uintptr_t)info->dlpi_phdr;
    // The vDSO is the kernel's own special mapping, not a file: leave it.
    if (state->vdso && headers >= state->vdso && headers < state->vdso + 4 * state->page) {
        state->result.skipped++;
        return 0;
    }
    if (has_text_relocations(info)) {
        state->result.skipped++;
        return 0;
    }
    int advised = 0;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || (ph->p_flags & PF_W)) continue;
        // Only whole pages of the file-backed part: a page shared with a
        // neighbouring segment is left alone.
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        uintptr_t end = start + ph->p_filesz;
        start = (start + state->page - 1) & ~(state->page - 1);
        end &= ~(state->page - 1);
        if (end <= start) continue;
        if (madvise((void *)start, end - start, MADV_DONTNEED) == 0) {
            state->result.advised_bytes += end - start;
            advised = 1;
        } else {
            state->result.failures++;
        }
    }
    state->result.objects += advised;
    return 0;
}

vigil_startup_pages_result vigil_release_startup_pages(void) {
    struct release_state state = {0};
    long page = sysconf(_SC_PAGESIZE);
    state.page = page > 0 ? (uintptr_t)page : 4096;
    state.vdso = (uintptr_t)getauxval(AT_SYSINFO_EHDR);
    dl_iterate_phdr(release_object, &state);
    // Start-up's freed heap too: malloc_trim gives the free pages of every
    // arena back to the kernel (glibc keeps them otherwise).
    (void)malloc_trim(0);
    return state.result;
}
