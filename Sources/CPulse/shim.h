// libpulse's asynchronous API (main loop, context, stream, introspection,
// subscriptions), linked only by the silent-audio plugin.
#include <pulse/pulseaudio.h>
// The plugin's own loop thread: an eventfd to wake it, prctl to name it.
#include <sys/eventfd.h>
#include <sys/prctl.h>

/// Names the calling thread (what /proc/<pid>/task/<tid>/comm shows; at most
/// 15 bytes are kept). prctl is variadic, so Swift cannot call it directly.
static inline int vigil_pulse_name_this_thread(const char *name) {
    return prctl(PR_SET_NAME, (unsigned long)name, 0UL, 0UL, 0UL);
}
