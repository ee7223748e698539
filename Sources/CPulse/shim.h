// libpulse's asynchronous API (threaded main loop, context, stream,
// introspection, subscriptions), linked only by the silent-audio plugin.
#include <pulse/pulseaudio.h>
