// Runs the test bundle on vigild's global executor (Plugins/VigilKit/Sources/CVigilLoop) when
// VIGIL_TEST_EXECUTOR=1, so the suites prove the executor the host ships
// with, not only Swift's default one (Scripts/sanitize sets it). A
// constructor: the executor must be installed before the first task exists,
// and the test bundle's main is generated, not ours.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vigil_loop.h"
#include "vigil_test_executor.h"

static int installed;

__attribute__((constructor)) static void vigil_test_executor_install(void) {
    const char *wanted = getenv("VIGIL_TEST_EXECUTOR");
    if (!wanted || strcmp(wanted, "1") != 0) return;
    // vigild's own count on a 2-core machine (Sources/vigild: 2...8 workers).
    if (vigil_executor_install(4) != 0) {
        fprintf(stderr, "VIGIL_TEST_EXECUTOR=1: cannot install the executor: %s\n", strerror(errno));
        abort();
    }
    installed = 1;
}

int vigil_test_executor_installed(void) { return installed; }
