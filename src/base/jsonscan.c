/* jsonscan.c - measuring JSON text before anyone parses it: depth, values and the longest
 * string, in one linear pass over the raw bytes and no memory. */
#include "base/base.h"

#include <errno.h>
#include <string.h>

/* Where a scalar (number, true, false, null) may begin: its first byte after one of
 * "[,:" or at the top. Anything else is left for the real parser to refuse. */
static bool scalar_start(unsigned char c)
{
    return (c >= '0' && c <= '9') || c == '-' || c == 't' || c == 'f' || c == 'n';
}

int json_measure(const char *p, size_t n, const struct json_bounds *b, struct json_shape *ret)
{
    struct json_shape s = {0};
    size_t depth = 0, str_start = 0;
    bool in_str = false, esc = false, after_sep = true;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (in_str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"') {
                in_str = false;
                if (i - str_start > s.longest_string)
                    s.longest_string = i - str_start;
                if (b && b->max_string && s.longest_string > b->max_string)
                    goto over;
            }
            continue;
        }
        switch (c) {
        case '[':
        case '{':
            s.values++;
            if (++depth > s.depth)
                s.depth = depth;
            after_sep = true;
            break;
        case ']':
        case '}':
            if (depth)
                depth--;
            after_sep = false;
            break;
        case ',':
        case ':':
            after_sep = true;
            break;
        case '"':
            s.values++;
            in_str = true;
            str_start = i + 1;
            after_sep = false;
            break;
        case ' ':
        case '\t':
        case '\n':
        case '\r':
            break;
        default:
            if (after_sep && scalar_start(c))
                s.values++;
            after_sep = false;
            break;
        }
        if (b && ((b->max_depth && s.depth > b->max_depth) ||
                  (b->max_values && s.values > b->max_values)))
            goto over;
    }
    if (in_str && n - str_start > s.longest_string)
        s.longest_string = n - str_start;
    *ret = s;
    return b && b->max_string && s.longest_string > b->max_string ? -E2BIG : 0;
over:
    *ret = s;
    return -E2BIG;
}
