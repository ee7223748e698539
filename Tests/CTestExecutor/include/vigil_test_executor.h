#ifndef VIGIL_TEST_EXECUTOR_H
#define VIGIL_TEST_EXECUTOR_H
/// 1 when the test bundle runs on vigild's executor (VIGIL_TEST_EXECUTOR=1).
int vigil_test_executor_installed(void);

// Included here, not only found in this umbrella directory: a build that
// already compiled the module notices a changed header, not a new one.
#include "vigil_test_probe.h"
#endif
