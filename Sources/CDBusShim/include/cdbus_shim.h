#ifndef VIGIL_CDBUS_SHIM_H
#define VIGIL_CDBUS_SHIM_H
#include <dbus/dbus.h>

// libdbus defines its type codes and flags as macros such as ((int) 's'),
// which Swift cannot import. They are re-exported here as constants.
static const int CDBUS_TYPE_INVALID = DBUS_TYPE_INVALID;
static const int CDBUS_TYPE_BYTE = DBUS_TYPE_BYTE;
static const int CDBUS_TYPE_BOOLEAN = DBUS_TYPE_BOOLEAN;
static const int CDBUS_TYPE_INT16 = DBUS_TYPE_INT16;
static const int CDBUS_TYPE_UINT16 = DBUS_TYPE_UINT16;
static const int CDBUS_TYPE_INT32 = DBUS_TYPE_INT32;
static const int CDBUS_TYPE_UINT32 = DBUS_TYPE_UINT32;
static const int CDBUS_TYPE_INT64 = DBUS_TYPE_INT64;
static const int CDBUS_TYPE_UINT64 = DBUS_TYPE_UINT64;
static const int CDBUS_TYPE_DOUBLE = DBUS_TYPE_DOUBLE;
static const int CDBUS_TYPE_STRING = DBUS_TYPE_STRING;
static const int CDBUS_TYPE_OBJECT_PATH = DBUS_TYPE_OBJECT_PATH;
static const int CDBUS_TYPE_SIGNATURE = DBUS_TYPE_SIGNATURE;
static const int CDBUS_TYPE_UNIX_FD = DBUS_TYPE_UNIX_FD;
static const int CDBUS_TYPE_ARRAY = DBUS_TYPE_ARRAY;
static const int CDBUS_TYPE_VARIANT = DBUS_TYPE_VARIANT;
static const int CDBUS_TYPE_STRUCT = DBUS_TYPE_STRUCT;
static const int CDBUS_TYPE_DICT_ENTRY = DBUS_TYPE_DICT_ENTRY;

static const int CDBUS_MESSAGE_TYPE_INVALID = DBUS_MESSAGE_TYPE_INVALID;
static const int CDBUS_MESSAGE_TYPE_METHOD_CALL = DBUS_MESSAGE_TYPE_METHOD_CALL;
static const int CDBUS_MESSAGE_TYPE_METHOD_RETURN = DBUS_MESSAGE_TYPE_METHOD_RETURN;
static const int CDBUS_MESSAGE_TYPE_ERROR = DBUS_MESSAGE_TYPE_ERROR;
static const int CDBUS_MESSAGE_TYPE_SIGNAL = DBUS_MESSAGE_TYPE_SIGNAL;

static const unsigned int CDBUS_NAME_FLAG_ALLOW_REPLACEMENT = DBUS_NAME_FLAG_ALLOW_REPLACEMENT;
static const unsigned int CDBUS_NAME_FLAG_REPLACE_EXISTING = DBUS_NAME_FLAG_REPLACE_EXISTING;
static const unsigned int CDBUS_NAME_FLAG_DO_NOT_QUEUE = DBUS_NAME_FLAG_DO_NOT_QUEUE;
static const unsigned int CDBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER = DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER;
static const unsigned int CDBUS_REQUEST_NAME_REPLY_IN_QUEUE = DBUS_REQUEST_NAME_REPLY_IN_QUEUE;
static const unsigned int CDBUS_REQUEST_NAME_REPLY_EXISTS = DBUS_REQUEST_NAME_REPLY_EXISTS;
static const unsigned int CDBUS_REQUEST_NAME_REPLY_ALREADY_OWNER = DBUS_REQUEST_NAME_REPLY_ALREADY_OWNER;

static const int CDBUS_TIMEOUT_USE_DEFAULT = DBUS_TIMEOUT_USE_DEFAULT;
static const int CDBUS_TIMEOUT_INFINITE = DBUS_TIMEOUT_INFINITE;

/// Sets a DBusError to a constant name and message (dbus_set_error is variadic).
void cdbus_set_error_const(DBusError *error, const char *name, const char *message);

/// Returns 1 when `path` is a valid D-Bus object path (checked without
/// libdbus's fatal assertions).
int cdbus_validate_path(const char *path);
/// Returns 1 when `name` is a valid interface name.
int cdbus_validate_interface(const char *name);
/// Returns 1 when `name` is a valid member (method, property, signal) name.
int cdbus_validate_member(const char *name);
/// Returns 1 when `name` is a valid bus name (unique or well-known).
int cdbus_validate_bus_name(const char *name);
/// Returns 1 when `name` is a valid error name.
int cdbus_validate_error_name(const char *name);
/// Returns 1 when the NUL-terminated `text` is valid UTF-8 acceptable to D-Bus.
int cdbus_validate_utf8(const char *text);
/// Returns 1 when `signature` is a valid signature (any number of complete types).
int cdbus_validate_signature(const char *signature);
#endif
