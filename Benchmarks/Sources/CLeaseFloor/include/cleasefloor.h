#ifndef VIGIL_CLEASEFLOOR_H
#define VIGIL_CLEASEFLOOR_H
// vigil-bench's floor for BeginBackgroundTask+End: a minimal server in C on
// libdbus (as dbus-test-tool echo is) that answers the two calls and sends
// the messages vigild's API asks for per lease, with nothing else: no
// registry, no actors, no survival log. What it reaches is what any
// implementation of the API could reach on the same bus and machine.
//
// It knows none of vigild's names: the bus name, paths, interfaces,
// members and the lease properties (name, D-Bus type, what to fill in)
// come from the caller, which takes them from VigilKit's declaration of
// the API. Only the freedesktop standard members (PropertiesChanged,
// InterfacesAdded, InterfacesRemoved, the bus driver's) are written here.
#include <stdint.h>

/// What a lease property holds in the floor's InterfacesAdded.
enum vigil_floor_fill {
    vigil_FLOOR_ID = 0,        // the lease id (t)
    vigil_FLOOR_TEXT = 1,      // `text`, a constant (s)
    vigil_FLOOR_NOW = 2,       // the wall time of acquisition, µs (t)
    vigil_FLOOR_DEADLINE = 3,  // acquisition + budget, µs (t)
    vigil_FLOOR_ZERO = 4,      // 0 (t or u)
    vigil_FLOOR_HOLDS = 5,     // what the lease holds, from name, owner, uid, pid (s)
    vigil_FLOOR_OWNER = 6,     // the caller's unique name (s)
    vigil_FLOOR_UID = 7,       // the caller's uid (u)
    vigil_FLOOR_PID = 8,       // the caller's pid (u)
    vigil_FLOOR_NAME = 9,      // the name argument of BeginBackgroundTask (s)
    vigil_FLOOR_REASON = 10,   // the reason argument, or the name when empty (s)
    vigil_FLOOR_EMPTY_DICT = 11, // an empty a{sv}
};

struct vigil_floor_property {
    const char *name;
    /// 't', 'u', 's', or 'd' for an a{sv} (always empty).
    char type;
    int fill;
    const char *text;
};

struct vigil_floor_interface {
    const char *name;
    const struct vigil_floor_property *properties;
    int count;
};

struct vigil_floor_api {
    const char *bus_name;               // the floor's own name on the bus
    const char *root_path;
    const char *lease_path_prefix;      // the lease id follows it
    const char *host_interface;
    const char *begin_method;           // (s name, s reason, t budget_usec) -> (o, h)
    const char *acquired_signal;        // (o lease, s strategy, s holds)
    const char *released_signal;        // (o lease, s reason)
    const char *leases_property;        // the root's ao of leases, announced at most once a second
    const char *strategy;               // the strategy client leases show
    const char *end_method;             // on client_lease_interface, no arguments
    const char *state_property;         // on lease_interface
    const char *released_state;
    const char *released_reason;        // LeaseReleased's reason for End
    const char *hangup_reason;          // ... when the client closed its fd
    const char *lease_ended_error;
    const char *object_manager_interface;
    const char *properties_interface;
    /// [0]: the lease interface (State), [1]: the client lease interface (End).
    struct vigil_floor_interface interfaces[2];
};

/// Serves `api` on the bus at `address` until the connection closes,
/// printing `ready` on stdout once it owns its name. Returns 0 then, or 1
/// (with a message on stderr) if it could not start.
int vigil_lease_floor_serve(const char *address, const struct vigil_floor_api *api);

#endif
