/* buf.c - capped growable buffers and head+tail output capture. */
#include "base/base.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void buf_init(struct buf *b, size_t max)
{
    *b = (struct buf){.max = max};
}

void buf_release(struct buf *b)
{
    free(b->data);
    *b = (struct buf){.max = b->max};
}

void buf_reset(struct buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
}

int buf_append(struct buf *b, const void *data, size_t n)
{
    if (b->max && (n > b->max || b->len > b->max - n))
        return -E2BIG;
    if (b->len + n + 1 > b->alloc) {
        size_t want = b->alloc ? b->alloc : 256;
        while (want < b->len + n + 1)
            want *= 2;
        b->data = xrealloc(b->data, want);
        b->alloc = want;
    }
    if (n)
        memcpy(b->data + b->len, data, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

int buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        return -ENOMEM;
    int r = buf_append(b, s, (size_t)n);
    free(s);
    return r;
}

char *buf_detach(struct buf *b, size_t *ret_len)
{
    if (!b->data)
        buf_append(b, "", 0);
    char *d = b->data;
    if (ret_len)
        *ret_len = b->len;
    *b = (struct buf){.max = b->max};
    return d;
}

void outcap_init(struct outcap *c, size_t cap)
{
    *c = (struct outcap){.cap = cap};
    buf_init(&c->head, cap / 2);
    c->tail_size = cap - cap / 2;
}

void outcap_release(struct outcap *c)
{
    buf_release(&c->head);
    free(c->tail);
    c->tail = NULL;
    c->tail_len = c->tail_start = 0;
}

void outcap_copy(struct outcap *dst, const struct outcap *src)
{
    *dst = *src;
    dst->head = (struct buf){.max = src->head.max};
    if (src->head.data)
        buf_append(&dst->head, src->head.data, src->head.len);
    dst->tail = NULL;
    if (src->tail) {
        dst->tail = xmalloc(src->tail_size);
        memcpy(dst->tail, src->tail, src->tail_size);
    }
}

size_t outcap_append(struct outcap *c, const void *data, size_t n)
{
    const char *p = data;
    size_t room = c->head.max - c->head.len;
    size_t to_head = MIN(room, n);
    if (to_head)
        buf_append(&c->head, p, to_head);
    c->total += n;
    p += to_head;
    n -= to_head;
    if (!n || !c->tail_size)
        return to_head;
    if (!c->tail)
        c->tail = xmalloc(c->tail_size);
    if (n >= c->tail_size) {
        /* Only the last tail_size bytes of this chunk can survive. */
        memcpy(c->tail, p + n - c->tail_size, c->tail_size);
        c->tail_start = 0;
        c->tail_len = c->tail_size;
        return to_head;
    }
    while (n) {
        size_t end = (c->tail_start + c->tail_len) % c->tail_size;
        size_t chunk = MIN(n, c->tail_size - end);
        memcpy(c->tail + end, p, chunk);
        p += chunk;
        n -= chunk;
        size_t len = c->tail_len + chunk;
        if (len > c->tail_size) {
            /* Overwrote the oldest bytes: the ring now starts right after the newest. */
            c->tail_start = (c->tail_start + (len - c->tail_size)) % c->tail_size;
            len = c->tail_size;
        }
        c->tail_len = len;
    }
    return to_head;
}

bool outcap_truncated(const struct outcap *c)
{
    return c->total > c->head.len + c->tail_len;
}

static void tail_copy(const struct outcap *c, struct buf *out)
{
    size_t first = MIN(c->tail_len, c->tail_size - c->tail_start);
    if (c->tail_len) {
        buf_append(out, c->tail + c->tail_start, first);
        buf_append(out, c->tail, c->tail_len - first);
    }
}

char *outcap_render_rest(const struct outcap *c, size_t *ret_len)
{
    struct buf out;
    buf_init(&out, 0);
    uint64_t dropped = c->total - c->head.len - c->tail_len;
    if (dropped)
        buf_printf(&out, "\n[... runcell: %llu bytes of output dropped ...]\n",
                   (unsigned long long)dropped);
    tail_copy(c, &out);
    return buf_detach(&out, ret_len);
}

char *outcap_render(const struct outcap *c, size_t *ret_len)
{
    struct buf out;
    buf_init(&out, 0);
    buf_append(&out, c->head.data ? c->head.data : "", c->head.len);
    size_t rest_len;
    char *rest = outcap_render_rest(c, &rest_len);
    buf_append(&out, rest, rest_len);
    free(rest);
    return buf_detach(&out, ret_len);
}
