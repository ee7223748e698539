#ifndef VIGIL_TEST_EXECUTOR_H
#define VIGIL_TEST_EXECUTOR_H
/// 1 when the test bundle runs on vigild's executor (VIGIL_TEST_EXECUTOR=1).
int vigil_test_executor_installed(void);
#endif
