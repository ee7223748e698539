#define _GNU_SOURCE
#include "cleasefloor.h"

#include <dbus/dbus.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

// One server per process (vigil-bench runs it as a child): its state is
// file-scoped and touched by this one thread only.
#define FLOOR_SLOTS 4096
#define FLOOR_NAME_MAX 256

struct floor_lease {
    uint64_t id;        // 0: the slot is free
    int read_end;       // watched for the client's hang-up
    char owner[FLOOR_NAME_MAX];
};

static const struct vigil_floor_api *api;
static DBusConnection *conn;
static int hangups = -1;
static uint64_t next_id = 1;
static struct floor_lease leases[FLOOR_SLOTS];
static uint64_t last_announcement;
// The credentials of the last caller: the bus is asked once per caller.
static char known_caller[FLOOR_NAME_MAX];
static uint32_t known_uid, known_pid;

static uint64_t micros(clockid_t clock) {
    struct timespec now;
    clock_gettime(clock, &now);
    return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

static void lease_path(char *out, size_t size, uint64_t id) {
    snprintf(out, size, "%s%" PRIu64, api->lease_path_prefix, id);
}

static int ask_bus_u32(const char *method, const char *name, uint32_t *out) {
    DBusMessage *call = dbus_message_new_method_call(DBUS_SERVICE_DBUS, DBUS_PATH_DBUS, DBUS_INTERFACE_DBUS, method);
    if (!call) return -1;
    dbus_message_append_args(call, DBUS_TYPE_STRING, &name, DBUS_TYPE_INVALID);
    DBusError error;
    dbus_error_init(&error);
    DBusMessage *reply = dbus_connection_send_with_reply_and_block(conn, call, 5000, &error);
    dbus_message_unref(call);
    if (!reply) {
        dbus_error_free(&error);
        return -1;
    }
    dbus_uint32_t value = 0;
    int ok = dbus_message_get_args(reply, &error, DBUS_TYPE_UINT32, &value, DBUS_TYPE_INVALID);
    dbus_message_unref(reply);
    dbus_error_free(&error);
    if (!ok) return -1;
    *out = value;
    return 0;
}

static int credentials(const char *sender) {
    if (strcmp(sender, known_caller) == 0) return 0;
    if (ask_bus_u32("GetConnectionUnixUser", sender, &known_uid) != 0) return -1;
    if (ask_bus_u32("GetConnectionUnixProcessID", sender, &known_pid) != 0) return -1;
    snprintf(known_caller, sizeof known_caller, "%s", sender);
    return 0;
}

static void send_and_unref(DBusMessage *message) {
    if (!message) return;
    dbus_connection_send(conn, message, NULL);
    dbus_message_unref(message);
}

static void reply_error(DBusMessage *call, const char *name, const char *text) {
    send_and_unref(dbus_message_new_error(call, name, text));
}

/// What one lease property shows, for InterfacesAdded.
struct lease_values {
    uint64_t id, acquired, deadline;
    const char *name, *reason, *owner, *holds;
};

static void append_property(DBusMessageIter *dict, const struct vigil_floor_property *property, const struct lease_values *lease) {
    DBusMessageIter entry, variant;
    dbus_message_iter_open_container(dict, DBUS_TYPE_DICT_ENTRY, NULL, &entry);
    dbus_message_iter_append_basic(&entry, DBUS_TYPE_STRING, &property->name);
    if (property->type == 'd') {
        DBusMessageIter array;
        dbus_message_iter_open_container(&entry, DBUS_TYPE_VARIANT, "a{sv}", &variant);
        dbus_message_iter_open_container(&variant, DBUS_TYPE_ARRAY, "{sv}", &array);
        dbus_message_iter_close_container(&variant, &array);
    } else {
        char signature[2] = {property->type, 0};
        dbus_message_iter_open_container(&entry, DBUS_TYPE_VARIANT, signature, &variant);
        uint64_t number = 0;
        const char *text = "";
        switch (property->fill) {
        case vigil_FLOOR_ID: number = lease->id; break;
        case vigil_FLOOR_NOW: number = lease->acquired; break;
        case vigil_FLOOR_DEADLINE: number = lease->deadline; break;
        case vigil_FLOOR_UID: number = known_uid; break;
        case vigil_FLOOR_PID: number = known_pid; break;
        case vigil_FLOOR_TEXT: text = property->text ? property->text : ""; break;
        case vigil_FLOOR_HOLDS: text = lease->holds; break;
        case vigil_FLOOR_OWNER: text = lease->owner; break;
        case vigil_FLOOR_NAME: text = lease->name; break;
        case vigil_FLOOR_REASON: text = lease->reason; break;
        default: break;
        }
        if (property->type == 't') {
            dbus_uint64_t value = number;
            dbus_message_iter_append_basic(&variant, DBUS_TYPE_UINT64, &value);
        } else if (property->type == 'u') {
            dbus_uint32_t value = (dbus_uint32_t)number;
            dbus_message_iter_append_basic(&variant, DBUS_TYPE_UINT32, &value);
        } else {
            dbus_message_iter_append_basic(&variant, DBUS_TYPE_STRING, &text);
        }
    }
    dbus_message_iter_close_container(&entry, &variant);
    dbus_message_iter_close_container(dict, &entry);
}

static void interfaces_added(const char *path, const struct lease_values *lease) {
    DBusMessage *signal = dbus_message_new_signal(api->root_path, api->object_manager_interface, "InterfacesAdded");
    if (!signal) return;
    DBusMessageIter args, interfaces;
    dbus_message_iter_init_append(signal, &args);
    dbus_message_iter_append_basic(&args, DBUS_TYPE_OBJECT_PATH, &path);
    dbus_message_iter_open_container(&args, DBUS_TYPE_ARRAY, "{sa{sv}}", &interfaces);
    for (int i = 0; i < 2; i++) {
        const struct vigil_floor_interface *interface = &api->interfaces[i];
        DBusMessageIter entry, properties;
        dbus_message_iter_open_container(&interfaces, DBUS_TYPE_DICT_ENTRY, NULL, &entry);
        dbus_message_iter_append_basic(&entry, DBUS_TYPE_STRING, &interface->name);
        dbus_message_iter_open_container(&entry, DBUS_TYPE_ARRAY, "{sv}", &properties);
        for (int p = 0; p < interface->count; p++) append_property(&properties, &interface->properties[p], lease);
        dbus_message_iter_close_container(&entry, &properties);
        dbus_message_iter_close_container(&interfaces, &entry);
    }
    dbus_message_iter_close_container(&args, &interfaces);
    send_and_unref(signal);
}

/// Sends PropertiesChanged for one property of `interface` at `path`, its
/// value (of type `signature`) written by `fill` into the variant.
static void properties_changed(const char *path, const char *interface, const char *property, const char *signature,
                               void (*fill)(DBusMessageIter *variant, const void *data), const void *data) {
    DBusMessage *signal = dbus_message_new_signal(path, api->properties_interface, "PropertiesChanged");
    if (!signal) return;
    DBusMessageIter args, changed, entry, variant, invalidated;
    dbus_message_iter_init_append(signal, &args);
    dbus_message_iter_append_basic(&args, DBUS_TYPE_STRING, &interface);
    dbus_message_iter_open_container(&args, DBUS_TYPE_ARRAY, "{sv}", &changed);
    dbus_message_iter_open_container(&changed, DBUS_TYPE_DICT_ENTRY, NULL, &entry);
    dbus_message_iter_append_basic(&entry, DBUS_TYPE_STRING, &property);
    dbus_message_iter_open_container(&entry, DBUS_TYPE_VARIANT, signature, &variant);
    fill(&variant, data);
    dbus_message_iter_close_container(&entry, &variant);
    dbus_message_iter_close_container(&changed, &entry);
    dbus_message_iter_close_container(&args, &changed);
    dbus_message_iter_open_container(&args, DBUS_TYPE_ARRAY, "s", &invalidated);
    dbus_message_iter_close_container(&args, &invalidated);
    send_and_unref(signal);
}

static void fill_lease_paths(DBusMessageIter *variant, const void *data) {
    (void)data;
    DBusMessageIter paths;
    dbus_message_iter_open_container(variant, DBUS_TYPE_ARRAY, "o", &paths);
    char path[FLOOR_NAME_MAX];
    for (int i = 0; i < FLOOR_SLOTS; i++) {
        if (leases[i].id == 0) continue;
        lease_path(path, sizeof path, leases[i].id);
        const char *p = path;
        dbus_message_iter_append_basic(&paths, DBUS_TYPE_OBJECT_PATH, &p);
    }
    dbus_message_iter_close_container(variant, &paths);
}

static void fill_string(DBusMessageIter *variant, const void *data) {
    const char *text = data;
    dbus_message_iter_append_basic(variant, DBUS_TYPE_STRING, &text);
}

/// The root's lease list, at most once a second (as vigild paces it).
static void announce_leases(void) {
    uint64_t now = micros(CLOCK_MONOTONIC);
    if (now - last_announcement < 1000000u) return;
    last_announcement = now;
    properties_changed(api->root_path, api->host_interface, api->leases_property, "ao", fill_lease_paths, NULL);
}

static void begin(DBusMessage *call) {
    const char *name = NULL, *reason = NULL;
    dbus_uint64_t budget = 0;
    DBusError error;
    dbus_error_init(&error);
    if (!dbus_message_get_args(call, &error, DBUS_TYPE_STRING, &name, DBUS_TYPE_STRING, &reason,
                               DBUS_TYPE_UINT64, &budget, DBUS_TYPE_INVALID)) {
        reply_error(call, DBUS_ERROR_INVALID_ARGS, error.message);
        dbus_error_free(&error);
        return;
    }
    const char *sender = dbus_message_get_sender(call);
    if (!sender || strlen(sender) >= FLOOR_NAME_MAX || credentials(sender) != 0) {
        reply_error(call, DBUS_ERROR_FAILED, "the caller's credentials could not be read");
        return;
    }
    uint64_t id = next_id;
    struct floor_lease *slot = &leases[id % FLOOR_SLOTS];
    if (slot->id != 0) {
        reply_error(call, DBUS_ERROR_LIMITS_EXCEEDED, "too many leases at once");
        return;
    }
    int pipe_ends[2];
    if (pipe2(pipe_ends, O_CLOEXEC | O_NONBLOCK) != 0) {
        reply_error(call, DBUS_ERROR_FAILED, strerror(errno));
        return;
    }
    // No events asked for: a hang-up is reported anyway.
    struct epoll_event watch = {.events = 0, .data.u64 = id};
    if (epoll_ctl(hangups, EPOLL_CTL_ADD, pipe_ends[0], &watch) != 0) {
        close(pipe_ends[0]);
        close(pipe_ends[1]);
        reply_error(call, DBUS_ERROR_FAILED, strerror(errno));
        return;
    }
    next_id++;
    slot->id = id;
    slot->read_end = pipe_ends[0];
    snprintf(slot->owner, sizeof slot->owner, "%s", sender);

    char path[FLOOR_NAME_MAX], holds[2 * FLOOR_NAME_MAX];
    lease_path(path, sizeof path, id);
    snprintf(holds, sizeof holds, "background task \"%.100s\" of %s (uid %u, pid %u)", name, sender, known_uid, known_pid);
    uint64_t now = micros(CLOCK_REALTIME);
    struct lease_values values = {
        .id = id, .acquired = now, .deadline = now + budget,
        .name = name, .reason = reason[0] ? reason : name, .owner = sender, .holds = holds,
    };
    interfaces_added(path, &values);
    announce_leases();
    DBusMessage *acquired = dbus_message_new_signal(api->root_path, api->host_interface, api->acquired_signal);
    const char *p = path, *h = holds;
    if (acquired) dbus_message_append_args(acquired, DBUS_TYPE_OBJECT_PATH, &p, DBUS_TYPE_STRING, &api->strategy,
                                           DBUS_TYPE_STRING, &h, DBUS_TYPE_INVALID);
    send_and_unref(acquired);
    DBusMessage *reply = dbus_message_new_method_return(call);
    if (reply) dbus_message_append_args(reply, DBUS_TYPE_OBJECT_PATH, &p, DBUS_TYPE_UNIX_FD, &pipe_ends[1], DBUS_TYPE_INVALID);
    send_and_unref(reply);
    // The reply holds its own copy of the fd.
    close(pipe_ends[1]);
}

static void end_lease(struct floor_lease *slot, const char *reason) {
    char path[FLOOR_NAME_MAX];
    lease_path(path, sizeof path, slot->id);
    const char *p = path;
    properties_changed(path, api->interfaces[0].name, api->state_property, "s", fill_string, api->released_state);
    DBusMessage *released = dbus_message_new_signal(api->root_path, api->host_interface, api->released_signal);
    if (released) dbus_message_append_args(released, DBUS_TYPE_OBJECT_PATH, &p, DBUS_TYPE_STRING, &reason, DBUS_TYPE_INVALID);
    send_and_unref(released);
    DBusMessage *removed = dbus_message_new_signal(api->root_path, api->object_manager_interface, "InterfacesRemoved");
    if (removed) {
        DBusMessageIter args, names;
        dbus_message_iter_init_append(removed, &args);
        dbus_message_iter_append_basic(&args, DBUS_TYPE_OBJECT_PATH, &p);
        dbus_message_iter_open_container(&args, DBUS_TYPE_ARRAY, "s", &names);
        for (int i = 0; i < 2; i++) dbus_message_iter_append_basic(&names, DBUS_TYPE_STRING, &api->interfaces[i].name);
        dbus_message_iter_close_container(&args, &names);
        send_and_unref(removed);
    }
    epoll_ctl(hangups, EPOLL_CTL_DEL, slot->read_end, NULL);
    close(slot->read_end);
    slot->id = 0;
    announce_leases();
}

static void end(DBusMessage *call) {
    const char *path = dbus_message_get_path(call);
    size_t prefix = strlen(api->lease_path_prefix);
    uint64_t id = 0;
    if (path && strncmp(path, api->lease_path_prefix, prefix) == 0) id = strtoull(path + prefix, NULL, 10);
    struct floor_lease *slot = &leases[id % FLOOR_SLOTS];
    if (id == 0 || slot->id != id) {
        reply_error(call, api->lease_ended_error, "the lease has ended");
        return;
    }
    const char *sender = dbus_message_get_sender(call);
    if (!sender || strcmp(sender, slot->owner) != 0) {
        reply_error(call, DBUS_ERROR_ACCESS_DENIED, "the lease belongs to another client");
        return;
    }
    end_lease(slot, api->released_reason);
    send_and_unref(dbus_message_new_method_return(call));
}

static DBusHandlerResult filter(DBusConnection *connection, DBusMessage *message, void *data) {
    (void)connection;
    (void)data;
    if (dbus_message_get_type(message) != DBUS_MESSAGE_TYPE_METHOD_CALL) return DBUS_HANDLER_RESULT_HANDLED;
    if (dbus_message_is_method_call(message, api->host_interface, api->begin_method)
        && dbus_message_has_path(message, api->root_path)) {
        begin(message);
    } else if (dbus_message_is_method_call(message, api->interfaces[1].name, api->end_method)) {
        end(message);
    } else if (!dbus_message_get_no_reply(message)) {
        reply_error(message, DBUS_ERROR_UNKNOWN_METHOD, "the lease floor answers only BeginBackgroundTask and End");
    }
    return DBUS_HANDLER_RESULT_HANDLED;
}

static void ended_by_hangup(void) {
    struct epoll_event events[64];
    int count = epoll_wait(hangups, events, 64, 0);
    for (int i = 0; i < count; i++) {
        uint64_t id = events[i].data.u64;
        struct floor_lease *slot = &leases[id % FLOOR_SLOTS];
        if (slot->id == id) end_lease(slot, api->hangup_reason);
    }
}

int vigil_lease_floor_serve(const char *address, const struct vigil_floor_api *served) {
    api = served;
    DBusError error;
    dbus_error_init(&error);
    conn = dbus_connection_open_private(address, &error);
    if (!conn || !dbus_bus_register(conn, &error)) {
        fprintf(stderr, "lease floor: cannot connect to %s: %s\n", address, error.message ? error.message : "?");
        return 1;
    }
    dbus_connection_set_exit_on_disconnect(conn, FALSE);
    if (dbus_bus_request_name(conn, api->bus_name, DBUS_NAME_FLAG_DO_NOT_QUEUE, &error) != DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER) {
        fprintf(stderr, "lease floor: cannot own %s: %s\n", api->bus_name, error.message ? error.message : "taken");
        return 1;
    }
    // The parent waits for this line instead of asking the bus.
    printf("ready\n");
    fflush(stdout);
    hangups = epoll_create1(EPOLL_CLOEXEC);
    int bus_fd = -1;
    if (hangups < 0 || !dbus_connection_get_unix_fd(conn, &bus_fd)
        || !dbus_connection_add_filter(conn, filter, NULL, NULL)) {
        fprintf(stderr, "lease floor: cannot set up: %s\n", strerror(errno));
        return 1;
    }
    for (;;) {
        while (dbus_connection_dispatch(conn) == DBUS_DISPATCH_DATA_REMAINS) {}
        dbus_connection_flush(conn);
        struct pollfd ready[2] = {{.fd = bus_fd, .events = POLLIN}, {.fd = hangups, .events = POLLIN}};
        if (poll(ready, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (ready[0].revents && !dbus_connection_read_write(conn, 0)) break;
        if (!dbus_connection_get_is_connected(conn)) break;
        if (ready[1].revents) ended_by_hangup();
    }
    return 0;
}
