#ifndef VIGIL_CVOIPSOCKET_H
#define VIGIL_CVOIPSOCKET_H
// What Swift's Glibc module does not export for the voip-socket strategy:
// epoll (its header is not in the module, and `struct epoll_event` is packed
// on x86-64) and the TCP socket options, kept in a few C functions so the
// errno handling lives in one place.
#include <stdint.h>
#include <sys/socket.h>

/// Readiness bits reported by `vigil_epoll_wait`.
static const uint32_t vigil_EV_IN = 0x001;
static const uint32_t vigil_EV_OUT = 0x004;
static const uint32_t vigil_EV_ERR = 0x008;
static const uint32_t vigil_EV_HUP = 0x010;
static const uint32_t vigil_EV_RDHUP = 0x2000;

/// One readiness report: the token given to `vigil_epoll_add` and the bits.
typedef struct {
    uint64_t token;
    uint32_t events;
} vigil_socket_event;

/// epoll_create1(EPOLL_CLOEXEC): the fd, or -1 with errno set.
int vigil_epoll_create(void);

/// Watches `fd` edge-triggered for input, output, errors and peer shutdown,
/// reporting `token`. 0, or -1 with errno set.
int vigil_epoll_add(int epfd, int fd, uint64_t token);

/// Watches `fd` level-triggered for input only (the loop's wake-up eventfd).
int vigil_epoll_add_level_in(int epfd, int fd, uint64_t token);

/// Stops watching `fd`. 0, or -1 with errno set.
int vigil_epoll_del(int epfd, int fd);

/// epoll_wait into `out` (at most `max`): the count, 0 on timeout, or -1
/// with errno set. `timeout_ms` -1 waits forever.
int vigil_epoll_wait(int epfd, vigil_socket_event *out, int max, int timeout_ms);

/// eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK): the fd, or -1 with errno set.
int vigil_eventfd(void);

/// A non-blocking, close-on-exec TCP socket of `family` (AF_INET or AF_INET6),
/// with TCP_NODELAY set: the fd, or -1 with errno set.
int vigil_tcp_socket(int family);

/// Starts a non-blocking connect: 0 when connected at once, otherwise the
/// errno (EINPROGRESS means: wait for the socket to become writable).
int vigil_connect(int fd, const struct sockaddr *address, socklen_t length);

/// send(2) with MSG_NOSIGNAL (a closed peer gives EPIPE, never SIGPIPE),
/// retrying EINTR: the count, or -1 with errno set.
long vigil_send(int fd, const void *bytes, unsigned long count);

/// recv(2) retrying EINTR: the count, 0 at end of stream, or -1 with errno set.
long vigil_recv(int fd, void *buffer, unsigned long size);

/// The pending error of `fd` (SO_ERROR), 0 for none.
int vigil_socket_error(int fd);

/// Turns on SO_KEEPALIVE with TCP_KEEPIDLE, TCP_KEEPINTVL (seconds) and
/// TCP_KEEPCNT. 0, or the errno of the first option that failed.
int vigil_set_tcp_keepalive(int fd, int idle_seconds, int interval_seconds, int count);

/// Sets TCP_USER_TIMEOUT (milliseconds; 0 = the kernel default). 0 or errno.
int vigil_set_user_timeout(int fd, unsigned int milliseconds);

/// Reads back an int-valued option at `level`/`name`, -1 on failure (tests).
int vigil_get_int_option(int fd, int level, int name);

static const int vigil_IPPROTO_TCP = 6;
/// Option numbers for `vigil_get_int_option`.
extern const int vigil_TCP_KEEPIDLE;
extern const int vigil_TCP_KEEPINTVL;
extern const int vigil_TCP_KEEPCNT;
extern const int vigil_TCP_USER_TIMEOUT;

/// Writes "1.2.3.4:80" or "[::1]:80" for an AF_INET/AF_INET6 address into
/// `buffer` (at least 64 bytes). 0, or -1 for another family.
int vigil_format_address(const struct sockaddr *address, char *buffer, int size);

/// The local (`peer` = 0) or remote (`peer` = 1) address of `fd`, formatted as
/// above. 0, or -1 with errno set.
int vigil_socket_address(int fd, int peer, char *buffer, int size);

/// Bytes malloc has handed out and not had back, over all arenas
/// (mallinfo2; benchmarks tell live memory from freed-but-kept pages).
long vigil_heap_in_use(void);

/// Puts thread `tid` on the cores in `mask` (bit n: core n, the first 64
/// cores; benchmarks keep the two ends of a loopback connection apart).
/// 0, or -1 with errno set.
int vigil_set_affinity(int tid, uint64_t mask);

/// The cores the calling thread may run on, as a mask of the first 64; 0
/// when they cannot be read.
uint64_t vigil_affinity(void);
#endif
