#ifndef VIGIL_CFDWATCH_H
#define VIGIL_CFDWATCH_H
// epoll(7) for the lease fd watcher: Swift's Glibc module does not export
// <sys/epoll.h>, whose epoll_event is a packed struct on x86_64. Tokens
// are the epoll data (u64); events are reported as VIGIL_FDWATCH_* bits.
#include <stdint.h>

enum {
    VIGIL_FDWATCH_IN = 1,
    VIGIL_FDWATCH_HUP = 2,
    VIGIL_FDWATCH_ERR = 4,
};

/// epoll_create1(EPOLL_CLOEXEC): the set's fd, or -1 with errno set.
int vigil_fdwatch_create(void);

/// Adds `fd` to the set, level-triggered, for input, named `token`:
/// 0, or -1 with errno set.
int vigil_fdwatch_add(int set, int fd, uint64_t token);

/// Takes `fd` out of the set: 0, or -1 with errno set.
int vigil_fdwatch_remove(int set, int fd);

/// Waits (without a timeout) for up to `max` ready fds and stores each
/// one's token and VIGIL_FDWATCH_* bits. Returns how many, or -1 with
/// errno set.
int vigil_fdwatch_wait(int set, uint64_t *tokens, uint32_t *events, int max);

#endif
