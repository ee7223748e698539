#ifndef VIGIL_LOOP_H
#define VIGIL_LOOP_H
// vigild's event loop, and Vigil's global executor for Swift Concurrency.
//
// One loop waits for everything the host waits on: one epoll set holding
// the descriptors registered with `vigil_loop_watch` (D-Bus sockets, lease
// pipes, timerfds, a signalfd, pidfds, hook output, the metrics listener),
// one timerfd per clock for the timers (`vigil_timer_schedule`, and every
// Task.sleep), and an eventfd that other threads write only when the loop
// sleeps and they hand it work. As in systemd's sd-event and in SwiftNIO.
//
// In vigild the loop's thread is the main thread and also the executor:
// `vigil_executor_install(0)` sends every job to the loop, and main then
// calls `vigil_loop_run()`. A timer that resumes a task, or a message read
// from a socket that completes a call, runs its continuation on the same
// thread without a context switch, and an idle host has no other thread to
// wake. Nothing that runs on the loop may block: see docs/architecture.md.
//
// Why not libdispatch: on Linux its worker pool's monitor wakes the process
// every second while the pool is in use (src/event/workqueue.c,
// _dispatch_workq_init_once), and each dispatch source costs a hop through
// its manager thread.
//
// Without `vigil_executor_install(0)` (the tests, a worker pool) the loop
// starts on a thread of its own ("vigil-loop") at its first use, and runs
// timers and watches only.
#include <stdint.h>

/// Installs the executor through the runtime's enqueue hooks. Call it before
/// any task is created (first thing in main). `workers` is clamped to 0...64:
/// 0 runs every job on the loop, whose thread the caller then gives with
/// `vigil_loop_run()` (the main executor's jobs run there too); more starts
/// that many worker threads, and the loop gets a thread of its own.
/// Returns 0, or -1 with errno set (the default executor stays in place).
int vigil_executor_install(int workers);

/// Runs the loop on the calling thread; never returns. Only after
/// `vigil_executor_install(0)`, and only once.
__attribute__((noreturn)) void vigil_loop_run(void);

/// Non-zero on the loop's thread.
int vigil_loop_is_current(void);

/// Readiness, as in epoll: what a watch waits for, and what it is told.
enum {
    VIGIL_LOOP_IN = 1,
    VIGIL_LOOP_OUT = 2,
    VIGIL_LOOP_HUP = 4,
    VIGIL_LOOP_ERR = 8,
};

/// Watches `fd` (level-triggered) for `events` (VIGIL_LOOP_IN, _OUT, or
/// none: hang-ups and errors are always reported); `callback(context,
/// events)` runs on the loop's thread each time it is ready. Returns the
/// watch's id, never 0; or 0 with errno set (epoll_ctl's, or ENOMEM).
/// Ids are not reused, so a stale id is harmless.
uint64_t vigil_loop_watch(int fd, uint32_t events, void (*callback)(void *context, uint32_t events), void *context);

/// Changes what a watch waits for. Returns 0, or -1 with errno set
/// (ENOENT for a watch that is gone).
int vigil_loop_rewatch(uint64_t id, uint32_t events);

/// Stops a watch: its callback is not called again once the loop has seen
/// this, and `released(context)` (when not NULL) then runs on the loop's
/// thread, after any call of the callback already under way. Close the fd
/// there, not before: the callback may still be reading it. Returns 1 if
/// the watch was live, 0 otherwise (nothing is released).
int vigil_loop_unwatch(uint64_t id, void (*released)(void *context));

/// Runs `callback(context)` on the loop's thread, after the work queued
/// before it.
void vigil_loop_post(void (*callback)(void *context), void *context);

/// Calls `callback(context)` on the loop's thread at `deadline_ns` on
/// CLOCK_BOOTTIME, or on CLOCK_MONOTONIC when `awake` is non-zero (a clock
/// that stops while the system is suspended: lease budgets count awake
/// time). At once if the deadline has passed. Returns an id for
/// `vigil_timer_cancel` (with the same `awake`), or 0 if the loop cannot be
/// started. Works whether or not the executor is installed.
uint64_t vigil_timer_schedule(int awake, int64_t deadline_ns, void (*callback)(void *context), void *context);

/// Cancels a scheduled callback. Returns 1 if it was removed before running
/// (it will never run), 0 if it already ran, is running, or was cancelled
/// already (so exactly one cancel of a callback that never ran returns 1).
int vigil_timer_cancel(int awake, uint64_t id);

/// Counters since the loop started.
typedef struct {
    uint64_t jobs_run;
    uint64_t delayed_jobs;
    uint64_t timer_wakeups;
    /// Times the loop woke from epoll_wait.
    uint64_t loop_wakeups;
    /// Watch callbacks called.
    uint64_t watch_events;
} vigil_executor_stats;

vigil_executor_stats vigil_executor_statistics(void);

/// Names the calling thread as /proc and tools show it (15 characters at most).
void vigil_name_thread(const char *name);

/// Under a finite address-space limit (RLIMIT_AS: prlimit --as, ulimit -v,
/// systemd LimitAS=), makes every thread created later reserve 1 MiB of
/// stack instead of RLIMIT_STACK's 8 MiB and limits malloc to 2 arenas (each
/// reserves 64 MiB), so the threads libdispatch starts on demand still fit:
/// a thread it cannot create makes it retry forever, signals unserved.
/// Call first thing in main. Returns the limit in bytes, 0 when unlimited.
unsigned long long vigil_fit_address_space(void);
#endif
