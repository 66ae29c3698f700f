/* meta.c - the record of every session a server has had, in SQLite (DATA/sessions.db), so
 * that a restarted server still knows them. */
#include "store/store.h"

#include <errno.h>
#include <pthread.h>
#include <sqlite3.h>
#include <string.h>

#define BUSY_TIMEOUT_MS 10000
/* An execution's update of its session's row (meta_touch) is written at once when none was
 * written this long before; later ones wait for the next write, at most this long, and go
 * in one transaction. */
#define TOUCH_WRITE_MS 1000

struct touch {
    char *id;
    uint64_t last_used_ms;
    long count;
};

struct meta_db {
    sqlite3 *db;
    char *path;
    pthread_mutex_t lock; /* one statement sequence at a time; keeps errmsg meaningful */
    /* exec_stmt's statements, prepared once each (keyed by the SQL text's address: each is
     * a literal of one call site), so that an execution's update parses nothing. */
    struct {
        const char *sql;
        sqlite3_stmt *st;
    } prepared[8];
    /* Touches not yet written, one per session (the newest), and the thread that writes
     * them TOUCH_WRITE_MS after the last write; started at the first touch kept back. */
    struct touch *owed;
    size_t n_owed, owed_alloc;
    uint64_t written_ms; /* now_ms() of the last write of touches */
    pthread_cond_t wake;
    pthread_t writer;
    bool writer_running, stopping;
};

static const char *const state_names[] = {
    [META_LIVE] = "live",     [META_EXPIRED] = "expired", [META_CHECKPOINTED] = "checkpointed",
    [META_CLOSED] = "closed", [META_STOPPED] = "stopped",
};

const char *meta_state_name(enum meta_state s)
{
    return (size_t)s < ARRAY_SIZE(state_names) ? state_names[s] : "unknown";
}

static enum meta_state state_from_name(const char *name)
{
    for (size_t i = 0; i < ARRAY_SIZE(state_names); i++)
        if (name && !strcmp(name, state_names[i]))
            return (enum meta_state)i;
    return META_STOPPED;
}

static const char schema[] = "PRAGMA journal_mode=WAL;"
                             "PRAGMA synchronous=NORMAL;"
                             "CREATE TABLE IF NOT EXISTS sessions ("
                             "  id TEXT PRIMARY KEY,"
                             "  owner TEXT,"
                             "  options TEXT NOT NULL,"
                             "  resumed_from TEXT,"
                             "  checkpoint TEXT,"
                             "  created_ms INTEGER NOT NULL,"
                             "  last_used_ms INTEGER NOT NULL,"
                             "  execution_count INTEGER NOT NULL DEFAULT 0,"
                             "  state TEXT NOT NULL,"
                             "  persist INTEGER NOT NULL,"
                             "  has_variables INTEGER NOT NULL DEFAULT 0);"
                             "CREATE INDEX IF NOT EXISTS sessions_state ON sessions(state);";

static int db_error(struct meta_db *m, const char *what)
{
    return err_set(EIO, "session records %s: %s: %s", m->path, what, sqlite3_errmsg(m->db));
}

static void *writer_main(void *arg);

int meta_open(const char *path, struct meta_db **ret)
{
    struct meta_db *m = xcalloc(1, sizeof(*m));
    char *errmsg = NULL;
    m->path = xstrdup(path);
    pthread_mutex_init(&m->lock, NULL);
    pthread_cond_init(&m->wake, NULL);
    /* The records name owners and hold variables' checkpoints: for the server's user only. */
    int r0 = db_file_make_private(path);
    if (r0 < 0) {
        meta_close(m);
        return r0;
    }
    int rc = sqlite3_open_v2(
        path, &m->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL);
    if (rc != SQLITE_OK) {
        int r = err_set(EIO, "cannot open the session records %s: %s", path,
                        m->db ? sqlite3_errmsg(m->db) : sqlite3_errstr(rc));
        meta_close(m);
        return r;
    }
    /* Another process (a repl) may be writing: wait for it rather than fail. */
    sqlite3_busy_timeout(m->db, BUSY_TIMEOUT_MS);
    if (sqlite3_exec(m->db, schema, NULL, NULL, &errmsg) != SQLITE_OK) {
        int r = err_set(EIO, "cannot set up the session records %s: %s", path,
                        errmsg ? errmsg : "unknown error");
        sqlite3_free(errmsg);
        meta_close(m);
        return r;
    }
    /* The writer of delayed touches starts here, from the thread that opens the records:
     * started later by an execution, it would inherit that thread's lower priority of
     * session work (nice is per thread) and keep it. Without it, touches are written at
     * once (meta_touch). */
    m->writer_running = pthread_create(&m->writer, NULL, writer_main, m) == 0;
    *ret = m;
    return 0;
}

static int write_owed_locked(struct meta_db *m);

void meta_close(struct meta_db *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&m->lock);
    m->stopping = true;
    pthread_cond_broadcast(&m->wake);
    pthread_mutex_unlock(&m->lock);
    if (m->writer_running)
        pthread_join(m->writer, NULL);
    if (m->db) {
        pthread_mutex_lock(&m->lock);
        write_owed_locked(m);
        pthread_mutex_unlock(&m->lock);
    }
    for (size_t i = 0; i < m->n_owed; i++)
        free(m->owed[i].id);
    free(m->owed);
    for (size_t i = 0; i < ARRAY_SIZE(m->prepared); i++)
        sqlite3_finalize(m->prepared[i].st);
    sqlite3_close_v2(m->db);
    pthread_mutex_destroy(&m->lock);
    pthread_cond_destroy(&m->wake);
    free(m->path);
    free(m);
}

void meta_session_release(struct meta_session *s)
{
    free(s->id);
    free(s->owner);
    free(s->options);
    free(s->resumed_from);
    free(s->checkpoint);
    memset(s, 0, sizeof(*s));
}

static void bind_text(sqlite3_stmt *st, int i, const char *v)
{
    if (v)
        sqlite3_bind_text(st, i, v, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, i);
}

/* sql's statement, prepared at its first use and kept (a full cache: prepared for this one
 * use, *ret_own set, for the caller to finalize). Caller holds the lock. */
static sqlite3_stmt *prepared(struct meta_db *m, const char *sql, bool *ret_own)
{
    size_t i = 0;
    *ret_own = false;
    for (; i < ARRAY_SIZE(m->prepared) && m->prepared[i].sql; i++)
        if (m->prepared[i].sql == sql)
            return m->prepared[i].st;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v3(m->db, sql, -1, SQLITE_PREPARE_PERSISTENT, &st, NULL) != SQLITE_OK)
        return NULL;
    if (i == ARRAY_SIZE(m->prepared)) {
        *ret_own = true;
    } else {
        m->prepared[i].sql = sql;
        m->prepared[i].st = st;
    }
    return st;
}

/* Lets bind fill in sql's parameters and runs it to completion. Caller holds the lock. */
static int exec_stmt(struct meta_db *m, const char *sql, const char *what,
                     void (*bind)(sqlite3_stmt *st, const void *ctx), const void *ctx)
{
    bool own;
    sqlite3_stmt *st = prepared(m, sql, &own);
    if (!st)
        return db_error(m, what);
    bind(st, ctx);
    int rc = sqlite3_step(st);
    int r = rc == SQLITE_DONE ? 0 : db_error(m, what); /* before the reset clears errmsg */
    if (own) {
        sqlite3_finalize(st);
    } else {
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
    }
    return r;
}

/* Takes the lock, the touches owed written first: a reader sees them, and a later write
 * (a state, a whole record) comes after them as it came after them in time. */
static void lock_written(struct meta_db *m)
{
    pthread_mutex_lock(&m->lock);
    write_owed_locked(m);
}

static void bind_put(sqlite3_stmt *st, const void *ctx)
{
    const struct meta_session *s = ctx;
    bind_text(st, 1, s->id);
    bind_text(st, 2, s->owner);
    bind_text(st, 3, s->options ? s->options : "{}");
    bind_text(st, 4, s->resumed_from);
    bind_text(st, 5, s->checkpoint);
    sqlite3_bind_int64(st, 6, (sqlite3_int64)s->created_ms);
    sqlite3_bind_int64(st, 7, (sqlite3_int64)s->last_used_ms);
    sqlite3_bind_int64(st, 8, s->execution_count);
    bind_text(st, 9, meta_state_name(s->state));
    sqlite3_bind_int(st, 10, s->persist);
    sqlite3_bind_int(st, 11, s->has_variables);
}

int meta_put(struct meta_db *m, const struct meta_session *s)
{
    lock_written(m);
    int r = exec_stmt(m,
                      "INSERT OR REPLACE INTO sessions (id, owner, options, resumed_from, "
                      "checkpoint, created_ms, last_used_ms, execution_count, state, persist, "
                      "has_variables) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                      "cannot record a session", bind_put, s);
    pthread_mutex_unlock(&m->lock);
    return r;
}

static void bind_touch(sqlite3_stmt *st, const void *ctx)
{
    const struct touch *t = ctx;
    sqlite3_bind_int64(st, 1, (sqlite3_int64)t->last_used_ms);
    sqlite3_bind_int64(st, 2, t->count);
    bind_text(st, 3, t->id);
}

static int exec_plain(struct meta_db *m, const char *sql, const char *what)
{
    return sqlite3_exec(m->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : db_error(m, what);
}

/* Writes the owed touches, several in one transaction. What could not be written stays
 * owed (the next write tries again) and is logged. Caller holds the lock. */
static int write_owed_locked(struct meta_db *m)
{
    if (!m->n_owed)
        return 0;
    bool several = m->n_owed > 1;
    int r = several ? exec_plain(m, "BEGIN IMMEDIATE", "cannot update the sessions") : 0;
    for (size_t i = 0; !r && i < m->n_owed; i++)
        r = exec_stmt(m, "UPDATE sessions SET last_used_ms=?, execution_count=? WHERE id=?",
                      "cannot update a session", bind_touch, &m->owed[i]);
    if (several && !r)
        r = exec_plain(m, "COMMIT", "cannot update the sessions");
    if (several && r < 0)
        sqlite3_exec(m->db, "ROLLBACK", NULL, NULL, NULL);
    m->written_ms = now_ms();
    if (r < 0) {
        log_warn("msg=\"cannot update the sessions' records; tried again later\" sessions=%zu "
                 "error=%s",
                 m->n_owed, log_quote(err_msg()));
        return r;
    }
    for (size_t i = 0; i < m->n_owed; i++)
        free(m->owed[i].id);
    m->n_owed = 0;
    return 0;
}

static void *writer_main(void *arg)
{
    struct meta_db *m = arg;
    pthread_mutex_lock(&m->lock);
    while (!m->stopping) {
        uint64_t since = ms_since(now_ms(), m->written_ms);
        if (!m->n_owed) {
            pthread_cond_wait(&m->wake, &m->lock);
        } else if (since < TOUCH_WRITE_MS) {
            struct timespec until;
            realtime_after_ms(&until, TOUCH_WRITE_MS - since);
            pthread_cond_timedwait(&m->wake, &m->lock, &until);
        } else {
            write_owed_locked(m);
        }
    }
    pthread_mutex_unlock(&m->lock);
    return NULL;
}

/* The session's owed touch, made if there is none. Caller holds the lock. */
static struct touch *owed_touch(struct meta_db *m, const char *id)
{
    for (size_t i = 0; i < m->n_owed; i++)
        if (!strcmp(m->owed[i].id, id))
            return &m->owed[i];
    if (m->n_owed == m->owed_alloc) {
        m->owed_alloc = m->owed_alloc ? 2 * m->owed_alloc : 16;
        m->owed = xrealloc(m->owed, m->owed_alloc * sizeof(*m->owed));
    }
    struct touch *t = &m->owed[m->n_owed++];
    t->id = xstrdup(id);
    return t;
}

int meta_touch(struct meta_db *m, const char *id, uint64_t last_used_ms, long execution_count)
{
    pthread_mutex_lock(&m->lock);
    bool none_owed = !m->n_owed;
    struct touch *t = owed_touch(m, id);
    t->last_used_ms = last_used_ms;
    t->count = execution_count;
    int r = 0;
    if (ms_since(now_ms(), m->written_ms) >= TOUCH_WRITE_MS) {
        r = write_owed_locked(m);
    } else if (!m->writer_running) { /* no thread (meta_open could not start it) */
        r = write_owed_locked(m);
    } else if (none_owed) { /* the thread waits for the first */
        pthread_cond_signal(&m->wake);
    }
    pthread_mutex_unlock(&m->lock);
    return r;
}

struct set_state {
    const char *id;
    enum meta_state state;
    bool has_variables;
    const char *checkpoint;
};

static void bind_state(sqlite3_stmt *st, const void *ctx)
{
    const struct set_state *s = ctx;
    bind_text(st, 1, meta_state_name(s->state));
    sqlite3_bind_int(st, 2, s->has_variables);
    bind_text(st, 3, s->checkpoint);
    bind_text(st, 4, s->id);
}

int meta_set_state(struct meta_db *m, const char *id, enum meta_state state, bool has_variables,
                   const char *checkpoint)
{
    struct set_state s = {
        .id = id, .state = state, .has_variables = has_variables, .checkpoint = checkpoint};
    lock_written(m);
    int r = exec_stmt(m,
                      "UPDATE sessions SET state=?, has_variables=?, "
                      "checkpoint=COALESCE(?3, checkpoint) WHERE id=?4",
                      "cannot update a session", bind_state, &s);
    pthread_mutex_unlock(&m->lock);
    return r;
}

static char *column_text(sqlite3_stmt *st, int i)
{
    const unsigned char *t = sqlite3_column_text(st, i);
    return t ? xstrdup((const char *)t) : NULL;
}

static const char select_cols[] =
    "SELECT id, owner, options, resumed_from, checkpoint, created_ms, last_used_ms, "
    "execution_count, state, persist, has_variables FROM sessions ";

static void row_to_session(sqlite3_stmt *st, struct meta_session *s)
{
    const unsigned char *state = sqlite3_column_text(st, 8);
    *s = (struct meta_session){
        .id = column_text(st, 0),
        .owner = column_text(st, 1),
        .options = column_text(st, 2),
        .resumed_from = column_text(st, 3),
        .checkpoint = column_text(st, 4),
        .created_ms = (uint64_t)sqlite3_column_int64(st, 5),
        .last_used_ms = (uint64_t)sqlite3_column_int64(st, 6),
        .execution_count = (long)sqlite3_column_int64(st, 7),
        .state = state_from_name((const char *)state),
        .persist = sqlite3_column_int(st, 9) != 0,
        .has_variables = sqlite3_column_int(st, 10) != 0,
    };
}

int meta_get(struct meta_db *m, const char *id, struct meta_session *ret)
{
    _cleanup_free_ char *sql = xasprintf("%sWHERE id=?", select_cols);
    sqlite3_stmt *st = NULL;
    int r = 0;
    lock_written(m);
    if (sqlite3_prepare_v2(m->db, sql, -1, &st, NULL) != SQLITE_OK) {
        r = db_error(m, "cannot read a session");
        goto out;
    }
    bind_text(st, 1, id);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        row_to_session(st, ret);
    else if (rc == SQLITE_DONE)
        r = err_set(ENOENT, "no record of session %s", id);
    else
        r = db_error(m, "cannot read a session");
out:
    sqlite3_finalize(st);
    pthread_mutex_unlock(&m->lock);
    return r;
}

/* Reads the selected rows into a vector first: callbacks then run without the lock. */
static int select_rows(struct meta_db *m, const char *where, size_t limit,
                       struct meta_session **ret, size_t *ret_n)
{
    _cleanup_free_ char *sql = xasprintf("%s%s", select_cols, where);
    sqlite3_stmt *st = NULL;
    struct meta_session *v = NULL;
    size_t n = 0, alloc = 0;
    int rc, r = 0;
    lock_written(m);
    if (sqlite3_prepare_v2(m->db, sql, -1, &st, NULL) != SQLITE_OK) {
        r = db_error(m, "cannot list sessions");
        goto out;
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && (!limit || n < limit)) {
        if (n == alloc) {
            alloc = alloc ? 2 * alloc : 16;
            v = xrealloc(v, alloc * sizeof(*v));
        }
        row_to_session(st, &v[n++]);
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        r = db_error(m, "cannot list sessions");
out:
    sqlite3_finalize(st);
    pthread_mutex_unlock(&m->lock);
    *ret = v;
    *ret_n = n;
    return r;
}

static void free_rows(struct meta_session *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        meta_session_release(&v[i]);
    free(v);
}

int meta_foreach(struct meta_db *m, size_t limit,
                 void (*fn)(void *ctx, const struct meta_session *s), void *ctx)
{
    struct meta_session *v;
    size_t n;
    int r = select_rows(m, "ORDER BY created_ms DESC, id", limit, &v, &n);
    for (size_t i = 0; !r && i < n; i++)
        fn(ctx, &v[i]);
    free_rows(v, n);
    return r;
}

int meta_recover(struct meta_db *m, bool (*alive)(const char *owner))
{
    struct meta_session *v;
    size_t n;
    int r = select_rows(m, "WHERE state='live'", 0, &v, &n);
    for (size_t i = 0; !r && i < n; i++) {
        if (v[i].owner && alive(v[i].owner))
            continue;
        log_info("msg=\"session was live in a process that is gone; now stopped\" session=%s",
                 v[i].id);
        r = meta_set_state(m, v[i].id, META_STOPPED, v[i].has_variables, NULL);
    }
    free_rows(v, n);
    return r;
}
