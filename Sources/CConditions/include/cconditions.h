#ifndef VIGIL_CCONDITIONS_H
#define VIGIL_CCONDITIONS_H
// What the host's condition watchers (Sources/VigilHost/Conditions) need
// from Linux that Swift's Glibc module does not export: netlink sockets
// (sockaddr_nl), setns and the proc connector's structures.
#include <sys/types.h>
#include <stddef.h>

static const unsigned vigil_rtmgrp_link = 1;          /* RTMGRP_LINK */
static const unsigned vigil_rtmgrp_ipv4_ifaddr = 0x10; /* RTMGRP_IPV4_IFADDR */
static const unsigned vigil_rtmgrp_ipv6_ifaddr = 0x100; /* RTMGRP_IPV6_IFADDR */
static const int vigil_netlink_route = 0;             /* NETLINK_ROUTE */
static const int vigil_netlink_kobject_uevent = 15;   /* NETLINK_KOBJECT_UEVENT */

/// A non-blocking, close-on-exec netlink socket of `protocol` bound to the
/// multicast `groups`: its fd, or -1 with errno set.
int vigil_netlink_open(int protocol, unsigned groups);

/// Moves the calling thread into the network namespace at `path`
/// (/run/netns/NAME): 0, or -1 with errno set. Tests only.
int vigil_setns_net(const char *path);

/// Names the calling thread (at most 15 bytes are kept), as `top -H` and
/// /proc/PID/task/TID/comm show it.
void vigil_name_thread(const char *name);

/// A proc connector socket listening for process events (needs
/// CAP_NET_ADMIN): its fd, or -1 with errno set.
int vigil_proc_connector_open(void);

/// One proc connector message: 1 = exec of `*pid`, 2 = exit of `*pid`,
/// 0 = another event or a malformed message.
int vigil_proc_event(const void *buffer, size_t length, pid_t *pid);

#endif
