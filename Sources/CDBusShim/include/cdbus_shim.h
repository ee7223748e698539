#ifndef VIGIL_CDBUS_SHIM_H
#define VIGIL_CDBUS_SHIM_H
#include <dbus/dbus.h>
#endif
