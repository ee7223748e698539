#define _GNU_SOURCE
#include "vigil_loop.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

// --- The runtime's side (swift/Runtime/Concurrency.h), swiftcall ABI -------

typedef struct SwiftJob SwiftJob;
typedef struct { void *identity; uintptr_t implementation; } SerialExecutorRef;

extern __attribute__((swiftcall)) void swift_job_run(SwiftJob *job, SerialExecutorRef executor);
extern __attribute__((swiftcall)) SerialExecutorRef swift_task_getMainExecutor(void);

extern __attribute__((swiftcall)) void (*swift_task_enqueueGlobal_hook)(SwiftJob *job, void *original);
extern __attribute__((swiftcall)) void (*swift_task_enqueueGlobalWithDelay_hook)(
    unsigned long long delay, SwiftJob *job, void *original);
extern __attribute__((swiftcall)) void (*swift_task_enqueueGlobalWithDeadline_hook)(
    long long sec, long long nsec, long long tsec, long long tnsec, int clock, SwiftJob *job, void *original);
extern __attribute__((swiftcall)) void (*swift_task_enqueueMainExecutor_hook)(SwiftJob *job, void *original);
extern __attribute__((swiftcall)) void (*swift_task_asyncMainDrainQueue_hook)(void *original, void *override);

// swift_clock_id: 1 = continuous (CLOCK_BOOTTIME on Linux), 2 = suspending (CLOCK_MONOTONIC).
enum { SWIFT_CLOCK_CONTINUOUS = 1 };

static uint64_t stat_jobs_run, stat_delayed, stat_timer_wakeups, stat_loop_wakeups, stat_watch_events;

// --- The loop's queue: jobs and posted callbacks, in order ----------------

// A job of the global executor, a job of the main executor, or a callback.
typedef struct {
    SwiftJob *job;
    void (*callback)(void *);
    void *context;
    int main_executor;
} Work;

// A ring that grows: no allocation per job once it has its size.
static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static Work *queue;
static size_t queue_head, queue_count, queue_capacity;
// The loop is in (or about to enter) epoll_wait with nothing queued, and
// whether a wake through the eventfd is already on its way. Work queued
// while the loop runs costs no system call: it looks again before waiting.
static int loop_sleeping, wake_pending;

static int loop_epoll = -1, loop_wake = -1;
// Jobs run on the loop (vigil_executor_install(0)); the caller gives the
// loop its thread with vigil_loop_run.
static int loop_runs_jobs;
static pthread_once_t loop_once = PTHREAD_ONCE_INIT;
static int loop_ready;   // loop_init succeeded
static __thread int on_loop;

static void queue_push_locked(Work w) {
    if (queue_count == queue_capacity) {
        size_t cap = queue_capacity ? queue_capacity * 2 : 256;
        Work *q = malloc(cap * sizeof *q);
        if (!q) abort();  // out of memory: the loop cannot drop a job
        for (size_t i = 0; i < queue_count; i++) q[i] = queue[(queue_head + i) % queue_capacity];
        free(queue);
        queue = q;
        queue_head = 0;
        queue_capacity = cap;
    }
    queue[(queue_head + queue_count) % queue_capacity] = w;
    queue_count++;
}

static void loop_push(Work w) {
    pthread_mutex_lock(&queue_lock);
    queue_push_locked(w);
    int wake = loop_sleeping && !wake_pending;
    if (wake) wake_pending = 1;
    pthread_mutex_unlock(&queue_lock);
    if (wake) {
        uint64_t one = 1;
        ssize_t n = write(loop_wake, &one, sizeof one);
        (void)n;  // EAGAIN only when the counter is near overflow: still readable
    }
}

// --- The worker pool (vigil_executor_install(n > 0)) -----------------------

typedef struct Node { SwiftJob *job; struct Node *next; } Node;

static pthread_mutex_t ready_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ready_cond = PTHREAD_COND_INITIALIZER;
static Node *ready_head, *ready_tail;

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
// about to look anyway wakes nobody. Signals are sent after unlocking, so
// the woken worker does not block on the lock its waker still holds.
static int idle_workers, wakes_pending;

// Lock held. Whether to signal a worker once the lock is released.
static int claim_wake_locked(void) {
    if (!ready_head || wakes_pending > 0 || idle_workers == 0) return 0;
    wakes_pending++;
    return 1;
}

static void push_to_workers(SwiftJob *job) {
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

// A job ready to run, on whichever executor is installed.
static void push_ready(SwiftJob *job) {
    if (loop_runs_jobs) loop_push((Work){ job, NULL, NULL, 0 });
    else push_to_workers(job);
}

// --- Delayed jobs and timers: one min-heap and one timerfd per clock -----

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

// On the loop, when the timeline's timerfd is readable: runs what is due.
static void timeline_fire(Timeline *t) {
    uint64_t expirations;
    ssize_t n = read(t->fd, &expirations, sizeof expirations);
    (void)n;  // EAGAIN (re-armed since it became readable): the heap decides
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

// --- Watches ----------------------------------------------------------------

// epoll data: the eventfd, the two timelines, then watches as
// (generation << 32) | (slot + TOKEN_BASE): a slot reused by a new watch
// has a new generation, so an event read for the old one is dropped.
enum { TOKEN_WAKE = 0, TOKEN_TIMELINE = 1, TOKEN_BASE = 3 };

typedef struct {
    void (*callback)(void *, uint32_t);
    void *context;
    int fd;
    uint32_t generation;
    int live;
} Watch;

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static Watch *watches;
static size_t watch_count, watch_capacity;
static uint32_t *free_slots;
static size_t free_count, free_capacity;

static uint32_t to_epoll(uint32_t events) {
    return ((events & VIGIL_LOOP_IN) ? EPOLLIN : 0) | ((events & VIGIL_LOOP_OUT) ? EPOLLOUT : 0);
}

static uint32_t from_epoll(uint32_t events) {
    return ((events & EPOLLIN) ? VIGIL_LOOP_IN : 0) | ((events & EPOLLOUT) ? VIGIL_LOOP_OUT : 0)
         | ((events & (EPOLLHUP | EPOLLRDHUP)) ? VIGIL_LOOP_HUP : 0) | ((events & EPOLLERR) ? VIGIL_LOOP_ERR : 0);
}

// The live watch a token names, under the lock; NULL when it is gone.
static Watch *watch_for_locked(uint64_t token) {
    uint64_t slot = (token & 0xffffffffu);
    if (slot < TOKEN_BASE) return NULL;
    slot -= TOKEN_BASE;
    if (slot >= watch_count) return NULL;
    Watch *w = &watches[slot];
    if (!w->live || w->generation != (uint32_t)(token >> 32)) return NULL;
    return w;
}

// Puts a slot back on the free list, growing the list if needed. Out of
// memory, the slot is simply never reused. Lock held.
static void free_slot_locked(uint32_t slot) {
    if (free_count == free_capacity) {
        size_t cap = free_capacity ? free_capacity * 2 : 64;
        uint32_t *f = realloc(free_slots, cap * sizeof *f);
        if (f) { free_slots = f; free_capacity = cap; }
    }
    if (free_count < free_capacity) free_slots[free_count++] = slot;
}

static void loop_dispatch(uint64_t token, uint32_t events);

// --- The loop ---------------------------------------------------------------

static void *loop_thread_main(void *arg);

static void loop_init(void) {
    loop_epoll = epoll_create1(EPOLL_CLOEXEC);
    loop_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (loop_epoll < 0 || loop_wake < 0) return;
    struct epoll_event event = { .events = EPOLLIN, .data.u64 = TOKEN_WAKE };
    if (epoll_ctl(loop_epoll, EPOLL_CTL_ADD, loop_wake, &event) != 0) return;
    for (int i = 0; i < 2; i++) {
        timelines[i].fd = timerfd_create(timelines[i].clock, TFD_CLOEXEC | TFD_NONBLOCK);
        if (timelines[i].fd < 0) return;
        struct epoll_event timer = { .events = EPOLLIN, .data.u64 = TOKEN_TIMELINE + (uint64_t)i };
        if (epoll_ctl(loop_epoll, EPOLL_CTL_ADD, timelines[i].fd, &timer) != 0) return;
    }
    if (!loop_runs_jobs) {
        // No one gives the loop a thread (tests, a worker pool): its own.
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        pthread_t th;
        int started = pthread_create(&th, &attr, loop_thread_main, NULL);
        pthread_attr_destroy(&attr);
        if (started != 0) { errno = started; return; }
        pthread_setname_np(th, "vigil-loop");  // 15 chars max
    }
    loop_ready = 1;
}

static int loop_start(void) {
    pthread_once(&loop_once, loop_init);
    return loop_ready ? 0 : -1;
}

static void run_work(Work w) {
    if (w.job) {
        __atomic_fetch_add(&stat_jobs_run, 1, __ATOMIC_RELAXED);
        swift_job_run(w.job, w.main_executor ? swift_task_getMainExecutor() : (SerialExecutorRef){ NULL, 0 });
    } else {
        w.callback(w.context);
    }
}

static void drain_wake(void) {
    uint64_t count;
    ssize_t n = read(loop_wake, &count, sizeof count);
    (void)n;  // EAGAIN: already drained
    pthread_mutex_lock(&queue_lock);
    wake_pending = 0;
    pthread_mutex_unlock(&queue_lock);
}

static void loop_dispatch(uint64_t token, uint32_t events) {
    if (token == TOKEN_WAKE) { drain_wake(); return; }
    if (token < TOKEN_BASE) { timeline_fire(&timelines[token - TOKEN_TIMELINE]); return; }
    pthread_mutex_lock(&watch_lock);
    Watch *w = watch_for_locked(token);
    void (*callback)(void *, uint32_t) = w ? w->callback : NULL;
    void *context = w ? w->context : NULL;
    pthread_mutex_unlock(&watch_lock);
    if (!callback) return;  // unwatched since epoll_wait returned
    __atomic_fetch_add(&stat_watch_events, 1, __ATOMIC_RELAXED);
    callback(context, from_epoll(events));
}

static __attribute__((noreturn)) void loop_main(void) {
    on_loop = 1;
    struct epoll_event ready[64];
    for (;;) {
        // The work queued so far, and no more: a job that queues another
        // (a task yielding) must not keep the descriptors waiting.
        pthread_mutex_lock(&queue_lock);
        size_t batch = queue_count;
        pthread_mutex_unlock(&queue_lock);
        for (size_t i = 0; i < batch; i++) {
            pthread_mutex_lock(&queue_lock);
            Work w = queue[queue_head];
            queue_head = (queue_head + 1) % queue_capacity;
            queue_count--;
            pthread_mutex_unlock(&queue_lock);
            run_work(w);
        }
        pthread_mutex_lock(&queue_lock);
        int idle = queue_count == 0;
        loop_sleeping = idle;
        pthread_mutex_unlock(&queue_lock);
        int n = epoll_wait(loop_epoll, ready, 64, idle ? -1 : 0);
        if (idle) {
            pthread_mutex_lock(&queue_lock);
            loop_sleeping = 0;
            pthread_mutex_unlock(&queue_lock);
            __atomic_fetch_add(&stat_loop_wakeups, 1, __ATOMIC_RELAXED);
        }
        for (int i = 0; i < n; i++) loop_dispatch(ready[i].data.u64, ready[i].events);
    }
}

static void *loop_thread_main(void *arg) {
    (void)arg;
    loop_main();
}

void vigil_loop_run(void) {
    if (loop_start() != 0) abort();  // vigil_executor_install(0) started it: cannot fail here
    loop_main();
}

int vigil_loop_is_current(void) { return on_loop; }

void vigil_loop_post(void (*callback)(void *context), void *context) {
    if (loop_start() != 0) abort();  // no loop: the work could never run
    loop_push((Work){ NULL, callback, context, 0 });
}

uint64_t vigil_loop_watch(int fd, uint32_t events, void (*callback)(void *context, uint32_t events), void *context) {
    if (loop_start() != 0) return 0;
    pthread_mutex_lock(&watch_lock);
    uint32_t slot;
    if (free_count) {
        slot = free_slots[--free_count];
    } else {
        if (watch_count == watch_capacity) {
            size_t cap = watch_capacity ? watch_capacity * 2 : 64;
            Watch *w = realloc(watches, cap * sizeof *w);
            if (!w) { pthread_mutex_unlock(&watch_lock); errno = ENOMEM; return 0; }
            watches = w;
            watch_capacity = cap;
        }
        slot = (uint32_t)watch_count++;
        watches[slot].generation = 0;
    }
    Watch *w = &watches[slot];
    w->generation++;
    if (w->generation == 0) w->generation = 1;
    uint64_t token = ((uint64_t)w->generation << 32) | (slot + TOKEN_BASE);
    struct epoll_event event = { .events = to_epoll(events), .data.u64 = token };
    if (epoll_ctl(loop_epoll, EPOLL_CTL_ADD, fd, &event) != 0) {
        int code = errno;
        w->live = 0;
        free_slot_locked(slot);
        pthread_mutex_unlock(&watch_lock);
        errno = code;
        return 0;
    }
    w->callback = callback;
    w->context = context;
    w->fd = fd;
    w->live = 1;
    pthread_mutex_unlock(&watch_lock);
    return token;
}

int vigil_loop_rewatch(uint64_t id, uint32_t events) {
    pthread_mutex_lock(&watch_lock);
    Watch *w = watch_for_locked(id);
    if (!w) { pthread_mutex_unlock(&watch_lock); errno = ENOENT; return -1; }
    struct epoll_event event = { .events = to_epoll(events), .data.u64 = id };
    int r = epoll_ctl(loop_epoll, EPOLL_CTL_MOD, w->fd, &event);
    int code = errno;
    pthread_mutex_unlock(&watch_lock);
    errno = code;
    return r;
}

int vigil_loop_unwatch(uint64_t id, void (*released)(void *context)) {
    pthread_mutex_lock(&watch_lock);
    Watch *w = watch_for_locked(id);
    if (!w) { pthread_mutex_unlock(&watch_lock); return 0; }
    epoll_ctl(loop_epoll, EPOLL_CTL_DEL, w->fd, NULL);  // fails only for an fd already closed: gone anyway
    w->live = 0;
    void *context = w->context;
    free_slot_locked((uint32_t)((id & 0xffffffffu) - TOKEN_BASE));
    pthread_mutex_unlock(&watch_lock);
    // After the callbacks of the events already read (they run first, on
    // the loop, or are dropped as stale).
    if (released) loop_push((Work){ NULL, released, context, 0 });
    return 1;
}

// --- Timers and delayed jobs -----------------------------------------------

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

uint64_t vigil_timer_schedule(int awake, int64_t deadline_ns, void (*callback)(void *context), void *context) {
    if (loop_start() != 0) return 0;
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
    // Cancelled before and still in the heap (not yet on top): a second
    // cancel finds nothing to remove, or its caller would release the
    // callback's context twice.
    for (size_t i = 0; found && i < t->cancelled_count; i++) {
        if (t->cancelled[i] == id) found = 0;
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

// --- Hooks ----------------------------------------------------------------

__attribute__((swiftcall))
static void hook_enqueue(SwiftJob *job, void *original) {
    (void)original;
    push_ready(job);
}

__attribute__((swiftcall))
static void hook_enqueue_main(SwiftJob *job, void *original) {
    (void)original;
    loop_push((Work){ job, NULL, NULL, 1 });
}

__attribute__((swiftcall))
static void hook_async_main_drain(void *original, void *override) {
    (void)original; (void)override;
    vigil_loop_run();
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

int vigil_executor_install(int workers) {
    if (workers < 0) workers = 0;
    if (workers > 64) workers = 64;
    if (workers == 0) {
        // Before the loop starts: it then waits for vigil_loop_run's thread.
        if (loop_ready) { errno = EBUSY; return -1; }
        loop_runs_jobs = 1;
    }
    if (loop_start() != 0) return -1;
    if (workers > 0) {
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
    } else {
        // Main-actor jobs and an async main's drain go to the loop too: its
        // thread is the main thread.
        swift_task_enqueueMainExecutor_hook = hook_enqueue_main;
        swift_task_asyncMainDrainQueue_hook = hook_async_main_drain;
    }
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
        __atomic_load_n(&stat_loop_wakeups, __ATOMIC_RELAXED),
        __atomic_load_n(&stat_watch_events, __ATOMIC_RELAXED),
    };
    return s;
}

void vigil_name_thread(const char *name) {
    pthread_setname_np(pthread_self(), name);
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
