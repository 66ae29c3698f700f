/* events.c - a session's event log: what happened to it besides executions (each egress
 * attempt, allowed or refused), in a ring of the last SESSION_EVENTS_MAX. */
#include "session/session-int.h"

#include <string.h>

void event_log_init(struct event_log *l)
{
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->lock, NULL);
}

void event_log_release(struct event_log *l)
{
    for (size_t i = 0; i < l->n; i++)
        json_decref(l->ring[(l->start + i) % SESSION_EVENTS_MAX]);
    pthread_mutex_destroy(&l->lock);
    memset(l, 0, sizeof(*l));
}

uint64_t event_log_add(struct event_log *l, json_t *ev)
{
    char when[32];
    format_time_iso(now_realtime_ms(), when);
    json_object_set_new(ev, "time", json_string(when));
    pthread_mutex_lock(&l->lock);
    uint64_t seq = ++l->seq;
    json_object_set_new(ev, "seq", json_integer((json_int_t)seq));
    if (l->n == SESSION_EVENTS_MAX) {
        json_decref(l->ring[l->start]);
        l->start = (l->start + 1) % SESSION_EVENTS_MAX;
        l->n--;
        l->dropped++;
    }
    l->ring[(l->start + l->n++) % SESSION_EVENTS_MAX] = ev;
    pthread_mutex_unlock(&l->lock);
    return seq;
}

uint64_t event_log_seq(struct event_log *l)
{
    pthread_mutex_lock(&l->lock);
    uint64_t seq = l->seq;
    pthread_mutex_unlock(&l->lock);
    return seq;
}

json_t *event_log_since(struct event_log *l, uint64_t after_seq, const char *type)
{
    json_t *a = json_array();
    pthread_mutex_lock(&l->lock);
    for (size_t i = 0; i < l->n; i++) {
        json_t *ev = l->ring[(l->start + i) % SESSION_EVENTS_MAX];
        uint64_t seq = (uint64_t)json_integer_value(json_object_get(ev, "seq"));
        const char *t = json_string_value(json_object_get(ev, "type"));
        if (seq > after_seq && (!type || (t && !strcmp(t, type))))
            json_array_append_new(a, json_deep_copy(ev));
    }
    pthread_mutex_unlock(&l->lock);
    return a;
}
