#include "cdbus_shim.h"

void cdbus_set_error_const(DBusError *error, const char *name, const char *message) {
    dbus_set_error_const(error, name, message);
}

// The dbus_validate_* functions take a DBusError that may be NULL; they do
// not abort on invalid input (only on NULL strings, which Swift never passes).
int cdbus_validate_path(const char *path) { return dbus_validate_path(path, NULL) ? 1 : 0; }
int cdbus_validate_interface(const char *name) { return dbus_validate_interface(name, NULL) ? 1 : 0; }
int cdbus_validate_member(const char *name) { return dbus_validate_member(name, NULL) ? 1 : 0; }
int cdbus_validate_bus_name(const char *name) { return dbus_validate_bus_name(name, NULL) ? 1 : 0; }
int cdbus_validate_error_name(const char *name) { return dbus_validate_error_name(name, NULL) ? 1 : 0; }
int cdbus_validate_utf8(const char *text) { return dbus_validate_utf8(text, NULL) ? 1 : 0; }
int cdbus_validate_signature(const char *signature) { return dbus_signature_validate(signature, NULL) ? 1 : 0; }
