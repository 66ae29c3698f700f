/* review.c - the human review queue: incident records in SQLite, listed, shown and resolved
 * from the CLI and the HTTP API, and optionally POSTed to a webhook. */
#include "agent/agent-int.h"

#include <curl/curl.h>
#include <errno.h>
#include <string.h>

#define WEBHOOK_TIMEOUT_MS 10000
#define MAX_NOTE           10000

int review_create(const char *data_dir, json_t *incident, char **ret_id)
{
    static const char what[] = "cannot write the review queue";
    sqlite3 *db;
    sqlite3_stmt *st;
    char now[32];
    int rc = db_prepare(data_dir,
                        "INSERT INTO reviews (id, created_at, status, reason, task, "
                        "record) VALUES (?, ?, 'open', ?, ?, ?)",
                        what, &db, &st);
    if (rc < 0)
        return rc;
    _cleanup_free_ char *hex = random_hex(8);
    _cleanup_free_ char *id = xasprintf("rv_%s", hex);
    db_now(now);
    json_object_set_new(incident, "id", json_string(id));
    json_object_set_new(incident, "status", json_string("open"));
    json_object_set_new(incident, "created_at", json_string(now));
    _cleanup_free_ char *text = json_dumps(incident, JSON_COMPACT);
    db_bind_texts(st, 5, id, now, json_string_value(json_object_get(incident, "reason")),
                  json_string_value(json_object_get(incident, "task")), text);
    if ((rc = db_write(db, st, what)) < 0)
        return rc;
    *ret_id = TAKE_PTR(id);
    return 0;
}

static json_t *summary_of(sqlite3_stmt *st)
{
    const char *resolved = (const char *)sqlite3_column_text(st, 5);
    return json_pack(
        "{s:s,s:s,s:s,s:s?,s:s?,s:s?,s:s?}", "id", (const char *)sqlite3_column_text(st, 0),
        "created_at", (const char *)sqlite3_column_text(st, 1), "status",
        (const char *)sqlite3_column_text(st, 2), "reason",
        (const char *)sqlite3_column_text(st, 3), "task", (const char *)sqlite3_column_text(st, 4),
        "resolved_at", resolved, "note", (const char *)sqlite3_column_text(st, 6));
}

int review_list(const char *data_dir, const char *status, size_t limit, json_t **ret)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    int rc = db_prepare(data_dir,
                        "SELECT id, created_at, status, reason, task, resolved_at, "
                        "note FROM reviews WHERE ?1 IS NULL OR status = ?1 ORDER BY created_at "
                        "DESC, rowid DESC LIMIT ?2",
                        "cannot read the review queue", &db, &st);
    if (rc < 0)
        return rc;
    sqlite3_bind_text(st, 1, status, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)(limit ? limit : 100));
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr, summary_of(st));
    db_done(db, st);
    *ret = arr;
    return 0;
}

/* The stored record with the current status, resolution time and note merged in. */
static int load(sqlite3 *db, const char *id, json_t **ret)
{
    sqlite3_stmt *st;
    int rc;
    if (sqlite3_prepare_v2(db,
                           "SELECT record, status, resolved_at, note FROM reviews WHERE "
                           "id = ?",
                           -1, &st, NULL) != SQLITE_OK)
        return db_fail(db, "cannot read the review queue");
    sqlite3_bind_text(st, 1, id, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_ROW) {
        rc = err_set(ENOENT, "no review %s; 'runcell review list' shows the queue", id);
    } else {
        const char *text = (const char *)sqlite3_column_text(st, 0);
        json_t *j = text ? json_loads(text, 0, NULL) : NULL;
        if (!j) {
            rc = err_set(EIO, "review %s is damaged in the database", id);
        } else {
            const char *resolved = (const char *)sqlite3_column_text(st, 2);
            const char *note = (const char *)sqlite3_column_text(st, 3);
            json_object_set_new(j, "status", json_string((const char *)sqlite3_column_text(st, 1)));
            json_object_set_new(j, "resolved_at", resolved ? json_string(resolved) : json_null());
            json_object_set_new(j, "note", note ? json_string(note) : json_null());
            *ret = j;
            rc = 0;
        }
    }
    sqlite3_finalize(st);
    return rc;
}

int review_get(const char *data_dir, const char *id, json_t **ret)
{
    sqlite3 *db;
    int rc = agent_db_open(data_dir, &db);
    if (rc < 0)
        return rc;
    rc = load(db, id, ret);
    agent_db_close(db);
    return rc;
}

int review_resolve(const char *data_dir, const char *id, const char *note, json_t **ret)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    char now[32];
    if (!note || !*note)
        return err_set(EINVAL, "a resolution needs a note saying what was done");
    if (strlen(note) > MAX_NOTE)
        return err_set(EINVAL, "the note is longer than %d characters", MAX_NOTE);
    int rc = agent_db_open(data_dir, &db);
    if (rc < 0)
        return rc;
    db_now(now);
    if (sqlite3_prepare_v2(db,
                           "UPDATE reviews SET status = 'resolved', resolved_at = ?, note = ? "
                           "WHERE id = ?",
                           -1, &st, NULL) != SQLITE_OK) {
        rc = db_fail(db, "cannot write the review queue");
    } else {
        sqlite3_bind_text(st, 1, now, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, note, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 3, id, -1, SQLITE_STATIC);
        rc = sqlite3_step(st) == SQLITE_DONE ? 0 : db_fail(db, "cannot write the review queue");
        sqlite3_finalize(st);
        if (rc == 0 && sqlite3_changes(db) == 0)
            rc = err_set(ENOENT, "no review %s; 'runcell review list' shows the queue", id);
    }
    if (rc == 0)
        rc = load(db, id, ret);
    agent_db_close(db);
    return rc;
}

static size_t discard(char *data, size_t size, size_t nmemb, void *ctx)
{
    (void)data, (void)ctx;
    return size * nmemb;
}

int webhook_post(const char *url, json_t *body)
{
    if (!str_has_prefix(url, "http://") && !str_has_prefix(url, "https://"))
        return err_set(EINVAL, "webhook URL '%s' is not an http:// or https:// URL", url);
    agent_curl_init();
    CURL *curl = curl_easy_init();
    if (!curl)
        return err_set(ENOMEM, "cannot start an HTTP request");
    _cleanup_free_ char *text = json_dumps(body, JSON_COMPACT);
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    char errbuf[CURL_ERROR_SIZE] = "";
    long status = 0;
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)WEBHOOK_TIMEOUT_MS);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode cc = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(curl);
    curl_slist_free_all(headers);
    if (cc != CURLE_OK)
        return err_set(EIO, "cannot POST to the webhook %s: %s", url,
                       *errbuf ? errbuf : curl_easy_strerror(cc));
    return (int)status;
}
