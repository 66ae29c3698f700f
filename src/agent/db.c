/* db.c - the agent's SQLite file: failure memory, task history and the review queue. */
#include "agent/agent-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define BUSY_TIMEOUT_MS 10000

static const char schema[] =
    /* The memory of earlier versions kept fixes as code and was shared by every task; it
     * goes, with what it held. */
    "DROP TABLE IF EXISTS failures;"
    "CREATE TABLE IF NOT EXISTS failure_facts ("
    " sig TEXT NOT NULL, env TEXT NOT NULL, scope TEXT NOT NULL, type TEXT NOT NULL,"
    " message TEXT NOT NULL, line TEXT NOT NULL, example TEXT,"
    " count INTEGER NOT NULL DEFAULT 0, unfixable INTEGER NOT NULL DEFAULT 0,"
    " fixed INTEGER NOT NULL DEFAULT 0, fixed_by TEXT, first_seen TEXT NOT NULL,"
    " last_seen TEXT NOT NULL, PRIMARY KEY (sig, env, scope));"
    "CREATE TABLE IF NOT EXISTS tasks ("
    " fp TEXT NOT NULL, env TEXT NOT NULL, runs INTEGER NOT NULL DEFAULT 0,"
    " exhausted INTEGER NOT NULL DEFAULT 0, last_reason TEXT, last_exhausted INTEGER NOT NULL"
    " DEFAULT 0, last_code TEXT, last_error TEXT, last_seen TEXT NOT NULL,"
    " PRIMARY KEY (fp, env));"
    "CREATE TABLE IF NOT EXISTS reviews ("
    " id TEXT PRIMARY KEY, created_at TEXT NOT NULL, status TEXT NOT NULL, reason TEXT,"
    " task TEXT, record TEXT NOT NULL, resolved_at TEXT, note TEXT);"
    "CREATE INDEX IF NOT EXISTS reviews_created ON reviews (created_at);";

int db_fail(sqlite3 *db, const char *what)
{
    return err_set(EIO, "%s: %s", what, db ? sqlite3_errmsg(db) : "no database");
}

void db_now(char out[32])
{
    format_time_iso(now_realtime_ms(), out);
}

char *db_text(sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    return t ? xstrdup((const char *)t) : NULL;
}

int agent_db_open(const char *data_dir, sqlite3 **ret)
{
    if (!data_dir)
        return err_set(EINVAL, "no data directory for the agent's database");
    if (mkdir_p(data_dir, 0700) < 0)
        return err_set(errno, "cannot create the data directory %s: %s", data_dir, strerror(errno));
    _cleanup_free_ char *path = xasprintf("%s/%s", data_dir, AGENT_DB_NAME);
    /* Nobody else needs to read transcripts. */
    int r = db_file_make_private(path);
    if (r < 0)
        return r;
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX, NULL) !=
        SQLITE_OK) {
        r = err_set(EIO, "cannot open %s: %s", path, db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close(db);
        return r;
    }
    sqlite3_busy_timeout(db, BUSY_TIMEOUT_MS);
    /* WAL lets the review commands read while a server writes. */
    sqlite3_exec(db, "PRAGMA journal_mode=WAL", NULL, NULL, NULL);
    if (sqlite3_exec(db, schema, NULL, NULL, NULL) != SQLITE_OK) {
        r = err_set(EIO, "cannot set up %s: %s", path, sqlite3_errmsg(db));
        sqlite3_close(db);
        return r;
    }
    *ret = db;
    return 0;
}

void agent_db_close(sqlite3 *db)
{
    sqlite3_close(db);
}

int db_prepare(const char *data_dir, const char *sql, const char *what, sqlite3 **ret_db,
               sqlite3_stmt **ret_st)
{
    sqlite3 *db;
    int rc = agent_db_open(data_dir, &db);
    if (rc < 0)
        return rc;
    if (sqlite3_prepare_v2(db, sql, -1, ret_st, NULL) != SQLITE_OK) {
        rc = db_fail(db, what);
        sqlite3_close(db);
        return rc;
    }
    *ret_db = db;
    return 0;
}

int db_write(sqlite3 *db, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_fail(db, what);
    db_done(db, st);
    return rc;
}

void db_done(sqlite3 *db, sqlite3_stmt *st)
{
    sqlite3_finalize(st);
    sqlite3_close(db);
}

void db_bind_texts(sqlite3_stmt *st, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 1; i <= n; i++)
        sqlite3_bind_text(st, i, va_arg(ap, const char *), -1, SQLITE_STATIC);
    va_end(ap);
}
