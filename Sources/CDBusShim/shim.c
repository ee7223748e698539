#include "cdbus_shim.h"
