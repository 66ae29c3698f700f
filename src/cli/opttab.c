/* opttab.c - option tables: a subcommand describes each of its options once (name, value,
 * where it goes, its limits, its help), and parsing, validation and its part of --help are
 * made from that (as git's parse-options does), instead of a switch beside a help text. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void *field(void *opts, const struct opt_spec *s)
{
    return (char *)opts + s->off;
}

static int opttab_apply(const char *cmd, const struct opt_spec *s, void *opts, char *val)
{
    char flag[64];
    snprintf(flag, sizeof(flag), "--%s", s->name);
    uint64_t v;
    int r;
    switch (s->kind) {
    case OPTK_FLAG:
        *(bool *)field(opts, s) = true;
        return 0;
    case OPTK_STRING:
        *(const char **)field(opts, s) = val;
        return 0;
    case OPTK_SECONDS:
        return s->max ? opt_seconds_max(cmd, flag, val, s->max, field(opts, s))
                      : opt_seconds(cmd, flag, val, field(opts, s));
    case OPTK_SIZE:
        if ((r = opt_count(cmd, flag, val, &v)) == 0)
            *(size_t *)field(opts, s) = (size_t)v;
        return r;
    case OPTK_SIZE_OR_0:
        if (parse_u64(val, &v) < 0 || v > s->max)
            return usage_error(cmd, "%s: '%s' is not a whole number from 0 to %llu", flag, val,
                               (unsigned long long)s->max);
        *(size_t *)field(opts, s) = (size_t)v;
        return 0;
    case OPTK_MB:
        return opt_megabytes(cmd, flag, val, field(opts, s));
    case OPTK_MB_BYTES:
        if ((r = opt_megabytes(cmd, flag, val, &v)) == 0)
            *(uint64_t *)field(opts, s) = v << 20;
        return r;
    case OPTK_COUNT:
        if ((r = opt_count(cmd, flag, val, &v)) == 0)
            *(unsigned *)field(opts, s) = (unsigned)MIN(v, s->max);
        return r;
    case OPTK_NUMBER:
        if (parse_u64(val, &v) < 0 || v < s->min || v > s->max)
            return usage_error(cmd, "%s: '%s' is not a whole number from %llu to %llu", flag, val,
                               (unsigned long long)s->min, (unsigned long long)s->max);
        *(uint64_t *)field(opts, s) = v;
        return 0;
    case OPTK_FN:
        return s->fn(opts, cmd, val);
    }
    return usage_error(cmd, "%s: not an option this program knows how to take", flag);
}

struct option *opttab_getopt_list(const struct option *fixed, size_t n_fixed,
                                  const struct opt_spec *t, size_t n)
{
    struct option *out = xcalloc(n_fixed + n + 1, sizeof(*out));
    memcpy(out, fixed, n_fixed * sizeof(*fixed));
    size_t k = n_fixed;
    for (size_t i = 0; i < n; i++)
        if (t[i].name)
            out[k++] = (struct option){t[i].name, t[i].arg ? required_argument : no_argument, NULL,
                                       OPT_COMMON_END + (int)i};
    return out; /* ends with the zeroed entry getopt_long wants */
}

int opttab_take(const char *cmd, const struct opt_spec *t, size_t n, int c, void *opts, char *val)
{
    size_t i = (size_t)(c - OPT_COMMON_END);
    if (c < OPT_COMMON_END || i >= n || !t[i].name)
        return usage_error(cmd, "unknown option; run 'runcell %s --help'", cmd);
    return opttab_apply(cmd, &t[i], opts, val);
}

/* Prints text's lines, the first from the current column, the rest at column. */
static void help_lines(FILE *f, const char *text, int column)
{
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        fprintf(f, "%.*s\n", (int)len, p);
        if (!nl)
            return;
        p = nl + 1;
        if (*p)
            fprintf(f, "%*s", column, "");
    }
}

void opttab_help(FILE *f, const struct opt_spec *t, size_t n, int column)
{
    for (size_t i = 0; i < n; i++) {
        if (!t[i].name) {
            fprintf(f, "%s\n", t[i].help);
            continue;
        }
        char head[64];
        int w = snprintf(head, sizeof(head), "  --%s%s%s", t[i].name, t[i].arg ? " " : "",
                         t[i].arg ? t[i].arg : "");
        if (w >= column)
            fprintf(f, "%s\n%*s", head, column, "");
        else
            fprintf(f, "%-*s", column, head);
        help_lines(f, t[i].help, column);
    }
}
