#ifndef VIGIL_CFDWATCH_H
#define VIGIL_CFDWATCH_H
// epoll(7) and eventfd(2) for the threads that wait on descriptors (the
// lease fd watcher, the D-Bus connections' loops): Swift's Glibc module
// exports neither <sys/epoll.h> (whose epoll_event is a packed struct on
// x86_64) nor <sys/eventfd.h>. Tokens are the epoll data (u64); events are
// VIGIL_FDWATCH_* bits.
#include <stdint.h>

enum {
    VIGIL_FDWATCH_IN = 1,
    VIGIL_FDWATCH_OUT = 2,
    VIGIL_FDWATCH_HUP = 4,
    VIGIL_FDWATCH_ERR = 8,
};

/// epoll_create1(EPOLL_CLOEXEC): the set's fd, or -1 with errno set.
int vigil_fdwatch_create(void);

/// Adds `fd` to the set, level-triggered, for `events` (IN and OUT bits;
/// hang-ups and errors are always reported), named `token`: 0, or -1 with
/// errno set.
int vigil_fdwatch_add(int set, int fd, uint64_t token, uint32_t events);

/// Changes what `fd`, already in the set, is watched for: 0, or -1.
int vigil_fdwatch_modify(int set, int fd, uint64_t token, uint32_t events);

/// Takes `fd` out of the set: 0, or -1 with errno set.
int vigil_fdwatch_remove(int set, int fd);

/// Waits up to `timeout_ms` (-1: no timeout) for up to `max` ready fds
/// and stores each one's token and VIGIL_FDWATCH_* bits. Returns how many
/// (0 on timeout), or -1 with errno set.
int vigil_fdwatch_wait(int set, uint64_t *tokens, uint32_t *events, int max, int timeout_ms);

/// eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK): the fd, or -1 with errno set.
int vigil_fdwatch_eventfd(void);

/// Adds 1 to an eventfd's counter (wakes its reader).
void vigil_fdwatch_eventfd_signal(int fd);

/// Reads an eventfd's counter back to 0.
void vigil_fdwatch_eventfd_drain(int fd);

/// Names the calling thread (at most 15 bytes show): pthread_setname_np,
/// which Swift's Glibc module does not export either.
void vigil_fdwatch_name_thread(const char *name);

#endif
