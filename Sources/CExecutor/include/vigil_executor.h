#ifndef VIGIL_EXECUTOR_H
#define VIGIL_EXECUTOR_H
// Vigil's global executor for Swift Concurrency.
//
// Why: on Linux the default global executor runs jobs on libdispatch's
// worker pool, whose monitor wakes the process every second while that pool
// is in use (src/event/workqueue.c, _dispatch_workq_init_once). An idle host
// would wake every second. This executor runs jobs on a few threads parked on
// a condition variable, and delayed jobs (Task.sleep) through timerfds armed
// for the earliest deadline only: no thread wakes unless a job is due.
#include <stdint.h>

/// Installs the executor through the runtime's enqueue hooks. Call it before
/// any task is created (first thing in main). `workers` is clamped to 1...64.
/// Returns 0, or -1 with errno set (the default executor stays in place).
int vigil_executor_install(int workers);

/// Calls `callback(context)` on a timer thread at `deadline_ns` on
/// CLOCK_BOOTTIME, or on CLOCK_MONOTONIC when `awake` is non-zero (a clock
/// that stops while the system is suspended: lease budgets count awake
/// time). At once if the deadline has passed. Returns an id for
/// `vigil_timer_cancel` (with the same `awake`), or 0 if the timer thread
/// cannot be started. Works whether or not the executor is installed.
uint64_t vigil_timer_schedule(int awake, int64_t deadline_ns, void (*callback)(void *context), void *context);

/// Cancels a scheduled callback. Returns 1 if it was removed before running
/// (it will never run), 0 if it already ran or is running.
int vigil_timer_cancel(int awake, uint64_t id);

/// Counters since installation.
typedef struct {
    uint64_t jobs_run;
    uint64_t delayed_jobs;
    uint64_t timer_wakeups;
} vigil_executor_stats;

vigil_executor_stats vigil_executor_statistics(void);

/// Under a finite address-space limit (RLIMIT_AS: prlimit --as, ulimit -v,
/// systemd LimitAS=), makes every thread created later reserve 1 MiB of
/// stack instead of RLIMIT_STACK's 8 MiB and limits malloc to 2 arenas (each
/// reserves 64 MiB), so the threads libdispatch starts on demand still fit:
/// a thread it cannot create makes it retry forever, signals unserved.
/// Call first thing in main. Returns the limit in bytes, 0 when unlimited.
unsigned long long vigil_fit_address_space(void);
#endif
