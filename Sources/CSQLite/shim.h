// The system's libsqlite3 (libsqlite3-dev), for the survival log's reader
// (Sources/Survival/Report): the same library GRDB links for the writer.
#include <sqlite3.h>

// SQLITE_TRANSIENT is a cast of -1 to a destructor pointer, a macro Swift
// cannot import: bound text is copied by SQLite before the call returns.
static inline int vigil_sqlite_bind_text(sqlite3_stmt *statement, int index, const char *text) {
    return sqlite3_bind_text(statement, index, text, -1, SQLITE_TRANSIENT);
}
