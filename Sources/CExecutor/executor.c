#define _GNU_SOURCE
#include "vigil_executor.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

// --- The runtime's side (swift/Runtime/Concurrency.h), swiftcall ABI -------

typedef struct SwiftJob SwiftJob;
typedef struct { void *identity; uintptr_t implementation; } SerialExecutorRef;

extern __attribute__((swiftcall)) void swift_job_run(SwiftJob *job, SerialExecutorRef executor);

extern __attribute__((swiftcall)) void (*swift_task_enqueueGlobal_hook)(SwiftJob *job, void *original);
extern __attribute__((swiftcall)) void (*swift_task_enqueueGlobalWithDelay_hook)(
    unsigned long long delay, SwiftJob *job, void *original);
extern __attribute__((swiftcall)) void (*swift_task_enqueueGlobalWithDeadline_hook)(
    long long sec, long long nsec, long long tsec, long long tnsec, int clock, SwiftJob *job, void *original);

// swift_clock_id: 1 = continuous (CLOCK_BOOTTIME on Linux), 2 = suspending (CLOCK_MONOTONIC).
enum { SWIFT_CLOCK_CONTINUOUS = 1 };

// --- Ready queue ----------------------------------------------------------

typedef struct Node { SwiftJob *job; struct Node *next; } Node;

static pthread_mutex_t ready_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready_cond = PTHREAD_COND_INITIALIZER;
static Node *ready_head, *ready_tail;
static uint64_t stat_jobs_run, stat_delayed, stat_timer_wakeups;

static void push_ready_locked(SwiftJob *job) {
    Node *n = malloc(sizeof *n);
    if (!n) abort();  // out of memory: an executor cannot drop a job
    n->job = job;
    n->next = NULL;
    if (ready_tail) ready_tail->next = n; else ready_head = n;
    ready_tail = n;
}

// Workers waiting for a job, and how many of them were signalled and have
// not yet taken the lock again. At most one wake is in flight: a woken
// worker that finds more jobs wakes the next (as Go's scheduler does), so
// a burst still spreads over every worker, while a job queued for a worker
// about to look anyway wakes nobody. Waking a worker per job woke the
// idle one for every continuation a running worker resumed; it found the
// queue empty, and the lock handoffs doubled the context switches of a
// D-Bus call. Signals are sent after unlocking, so the woken worker does
// not block on the lock its waker still holds.
static int idle_workers, wakes_pending;

// Lock held. Whether to signal a worker once the lock is released.
static int claim_wake_locked(void) {
    if (!ready_head || wakes_pending > 0 || idle_workers == 0) return 0;
    wakes_pending++;
    return 1;
}

static void push_ready(SwiftJob *job) {
    pthread_mutex_lock(&ready_lock);
    push_ready_locked(job);
    int wake = claim_wake_locked();
    pthread_mutex_unlock(&ready_lock);
    if (wake) pthread_cond_signal(&ready_cond);
}

static void *worker_main(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&ready_lock);
        while (!ready_head) {
            idle_workers++;
            pthread_cond_wait(&ready_cond, &ready_lock);
            idle_workers--;
            if (wakes_pending > 0) wakes_pending--;
        }
        Node *n = ready_head;
        ready_head = n->next;
        if (!ready_head) ready_tail = NULL;
        int wake = claim_wake_locked();
        pthread_mutex_unlock(&ready_lock);
        if (wake) pthread_cond_signal(&ready_cond);
        SwiftJob *job = n->job;
        free(n);
        __atomic_fetch_add(&stat_jobs_run, 1, __ATOMIC_RELAXED);
        swift_job_run(job, (SerialExecutorRef){ NULL, 0 });  // the generic executor
    }
    return NULL;
}

// --- Delayed jobs: one min-heap and one timerfd per clock -----------------

// A delayed entry is either a job to enqueue or a callback to call.
// Cancelled callbacks stay in the heap, marked, until they reach the top,
// where they are dropped without arming the timer for them.
typedef struct {
    int64_t deadline;
    uint64_t seq;       // FIFO among equal deadlines; also the callback's id
    SwiftJob *job;      // NULL for a callback
    void (*callback)(void *);
    void *context;
} Delayed;

typedef struct {
    int clock;
    int fd;
    pthread_mutex_t lock;
    Delayed *heap;
    size_t count, capacity;
    int64_t armed;   // deadline the timerfd is armed for, 0 if disarmed
    uint64_t seq;    // FIFO order among equal deadlines
    uint64_t *cancelled;      // ids of cancelled callbacks still in the heap
    size_t cancelled_count, cancelled_capacity;
} Timeline;

static Timeline timelines[2] = {
    { .clock = CLOCK_BOOTTIME, .fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER },
    { .clock = CLOCK_MONOTONIC, .fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER },
};

static int64_t now_ns(int clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int earlier(const Delayed *a, const Delayed *b) {
    return a->deadline < b->deadline || (a->deadline == b->deadline && a->seq < b->seq);
}

static void heap_push(Timeline *t, Delayed d) {
    if (t->count == t->capacity) {
        size_t cap = t->capacity ? t->capacity * 2 : 64;
        Delayed *h = realloc(t->heap, cap * sizeof *h);
        if (!h) abort();
        t->heap = h;
        t->capacity = cap;
    }
    size_t i = t->count++;
    t->heap[i] = d;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!earlier(&t->heap[i], &t->heap[p])) break;
        Delayed tmp = t->heap[i]; t->heap[i] = t->heap[p]; t->heap[p] = tmp;
        i = p;
    }
}

static Delayed heap_pop(Timeline *t) {
    Delayed top = t->heap[0];
    t->heap[0] = t->heap[--t->count];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < t->count && earlier(&t->heap[l], &t->heap[m])) m = l;
        if (r < t->count && earlier(&t->heap[r], &t->heap[m])) m = r;
        if (m == i) break;
        Delayed tmp = t->heap[i]; t->heap[i] = t->heap[m]; t->heap[m] = tmp;
        i = m;
    }
    return top;
}

static int take_cancelled_locked(Timeline *t, uint64_t id) {
    for (size_t i = 0; i < t->cancelled_count; i++) {
        if (t->cancelled[i] == id) {
            t->cancelled[i] = t->cancelled[--t->cancelled_count];
            return 1;
        }
    }
    return 0;
}

// Drops cancelled callbacks from the top of the heap. Lock held.
static void drop_cancelled_top_locked(Timeline *t) {
    while (t->count && !t->heap[0].job && t->cancelled_count && take_cancelled_locked(t, t->heap[0].seq)) {
        heap_pop(t);
    }
}

// Arms the timerfd for the earliest live deadline, or disarms it. Lock held.
static void rearm_locked(Timeline *t) {
    drop_cancelled_top_locked(t);
    int64_t want = t->count ? t->heap[0].deadline : 0;
    if (want == t->armed) return;
    struct itimerspec spec;
    memset(&spec, 0, sizeof spec);
    if (want > 0) {
        spec.it_value.tv_sec = want / 1000000000LL;
        spec.it_value.tv_nsec = want % 1000000000LL;
    }
    timerfd_settime(t->fd, want > 0 ? TFD_TIMER_ABSTIME : 0, &spec, NULL);
    t->armed = want;
}

static void *timer_main(void *arg) {
    Timeline *t = arg;
    for (;;) {
        uint64_t expirations;
        // Blocks until the armed deadline; re-arming from another thread
        // moves the wakeup. A disarmed timerfd blocks indefinitely.
        ssize_t n = read(t->fd, &expirations, sizeof expirations);
        (void)n;  // EINTR or a spurious wakeup: the loop below re-checks the heap
        pthread_mutex_lock(&t->lock);
        __atomic_fetch_add(&stat_timer_wakeups, 1, __ATOMIC_RELAXED);
        t->armed = 0;
        int64_t now = now_ns(t->clock);
        for (;;) {
            drop_cancelled_top_locked(t);
            if (!t->count || t->heap[0].deadline > now) break;
            Delayed d = heap_pop(t);
            if (d.job) {
                push_ready(d.job);
            } else {
                // Run the callback without the lock: it may schedule again.
                pthread_mutex_unlock(&t->lock);
                d.callback(d.context);
                pthread_mutex_lock(&t->lock);
                now = now_ns(t->clock);
            }
        }
        rearm_locked(t);
        pthread_mutex_unlock(&t->lock);
    }
    return NULL;
}

static void enqueue_at(Timeline *t, int64_t deadline, SwiftJob *job) {
    if (deadline <= now_ns(t->clock)) {
        push_ready(job);
        return;
    }
    __atomic_fetch_add(&stat_delayed, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&t->lock);
    heap_push(t, (Delayed){ deadline, ++t->seq, job, NULL, NULL });
    rearm_locked(t);
    pthread_mutex_unlock(&t->lock);
}

// --- Hooks ----------------------------------------------------------------

__attribute__((swiftcall))
static void hook_enqueue(SwiftJob *job, void *original) {
    (void)original;
    push_ready(job);
}

__attribute__((swiftcall))
static void hook_enqueue_delay(unsigned long long delay, SwiftJob *job, void *original) {
    (void)original;
    Timeline *t = &timelines[1];
    enqueue_at(t, now_ns(t->clock) + (int64_t)delay, job);
}

__attribute__((swiftcall))
static void hook_enqueue_deadline(long long sec, long long nsec, long long tsec, long long tnsec,
                                  int clock, SwiftJob *job, void *original) {
    (void)tsec; (void)tnsec; (void)original;
    Timeline *t = &timelines[clock == SWIFT_CLOCK_CONTINUOUS ? 0 : 1];
    enqueue_at(t, sec * 1000000000LL + nsec, job);
}

static pthread_once_t timers_once = PTHREAD_ONCE_INIT;
static int timers_started;

static void start_timers(void) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 1 << 20);
    for (int i = 0; i < 2; i++) {
        timelines[i].fd = timerfd_create(timelines[i].clock, TFD_CLOEXEC);
        if (timelines[i].fd < 0) return;
    }
    pthread_t th;
    for (int i = 0; i < 2; i++) {
        if (pthread_create(&th, &attr, timer_main, &timelines[i]) != 0) return;
        pthread_setname_np(th, i == 0 ? "vigil-timer-bt" : "vigil-timer-mn");  // 15 chars max
    }
    pthread_attr_destroy(&attr);
    timers_started = 1;
}

uint64_t vigil_timer_schedule(int awake, int64_t deadline_ns, void (*callback)(void *context), void *context) {
    pthread_once(&timers_once, start_timers);
    if (!timers_started) return 0;
    Timeline *t = &timelines[awake ? 1 : 0];
    pthread_mutex_lock(&t->lock);
    uint64_t id = ++t->seq;
    heap_push(t, (Delayed){ deadline_ns, id, NULL, callback, context });
    // A deadline already past arms the timerfd in the past: it expires at once.
    rearm_locked(t);
    pthread_mutex_unlock(&t->lock);
    return id;
}

int vigil_timer_cancel(int awake, uint64_t id) {
    Timeline *t = &timelines[awake ? 1 : 0];
    pthread_mutex_lock(&t->lock);
    int found = 0;
    for (size_t i = 0; i < t->count; i++) {
        if (!t->heap[i].job && t->heap[i].seq == id) { found = 1; break; }
    }
    if (found) {
        if (t->cancelled_count == t->cancelled_capacity) {
            size_t cap = t->cancelled_capacity ? t->cancelled_capacity * 2 : 16;
            uint64_t *c = realloc(t->cancelled, cap * sizeof *c);
            if (!c) abort();
            t->cancelled = c;
            t->cancelled_capacity = cap;
        }
        t->cancelled[t->cancelled_count++] = id;
        rearm_locked(t);
    }
    pthread_mutex_unlock(&t->lock);
    return found;
}

int vigil_executor_install(int workers) {
    if (workers < 1) workers = 1;
    if (workers > 64) workers = 64;
    pthread_once(&timers_once, start_timers);
    if (!timers_started) return -1;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    // Swift async frames live on the heap; 1 MiB of C stack is plenty.
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_t th;
    for (int i = 0; i < workers; i++) {
        if (pthread_create(&th, &attr, worker_main, NULL) != 0) return -1;
        pthread_setname_np(th, "vigil-worker");
    }
    pthread_attr_destroy(&attr);
    swift_task_enqueueGlobalWithDeadline_hook = hook_enqueue_deadline;
    swift_task_enqueueGlobalWithDelay_hook = hook_enqueue_delay;
    swift_task_enqueueGlobal_hook = hook_enqueue;
    return 0;
}

vigil_executor_stats vigil_executor_statistics(void) {
    vigil_executor_stats s = {
        __atomic_load_n(&stat_jobs_run, __ATOMIC_RELAXED),
        __atomic_load_n(&stat_delayed, __ATOMIC_RELAXED),
        __atomic_load_n(&stat_timer_wakeups, __ATOMIC_RELAXED),
    };
    return s;
}

unsigned long long vigil_fit_address_space(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 0;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_setstacksize(&attr, 1 << 20);
        pthread_setattr_default_np(&attr);
        pthread_attr_destroy(&attr);
    }
    mallopt(M_ARENA_MAX, 2);
    return (unsigned long long)limit.rlim_cur;
}
