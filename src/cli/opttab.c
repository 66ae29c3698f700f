/* opttab.c - option tables: a subcommand describes each of its options once (name, value,
 * where it goes, its limits, its help), and parsing, validation and --help are made from
 * that (as git's parse-options does), instead of a switch beside a help text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

/* getopt_long's values for the options of a list: OPT_VAL0 + their index in it (above any
 * character, so that they never meet a short option). */
#define OPT_VAL0 256

static int opttab_apply(const char *cmd, const struct opt_spec *s, void *opts, char *val)
{
    char flag[64];
    if (s->name)
        snprintf(flag, sizeof(flag), "--%s", s->name);
    else
        snprintf(flag, sizeof(flag), "-%c", s->letter);
    void *field = (char *)opts + s->off;
    uint64_t v;
    int r;
    switch (s->kind) {
    case OPTK_FLAG:
        *(bool *)field = true;
        return 0;
    case OPTK_STRING:
        *(const char **)field = val;
        return 0;
    case OPTK_STRV:
        *(char ***)field = strv_push(*(char ***)field, val);
        return 0;
    case OPTK_SECONDS:
        return s->max ? opt_seconds_max(cmd, flag, val, s->max, field)
                      : opt_seconds(cmd, flag, val, field);
    case OPTK_SIZE:
        if ((r = opt_count(cmd, flag, val, &v)) == 0)
            *(size_t *)field = (size_t)v;
        return r;
    case OPTK_SIZE_OR_0:
        if (parse_u64(val, &v) < 0 || v > s->max)
            return usage_error(cmd, "%s: '%s' is not a whole number from 0 to %llu", flag, val,
                               (unsigned long long)s->max);
        *(size_t *)field = (size_t)v;
        return 0;
    case OPTK_MB:
        return opt_megabytes(cmd, flag, val, field);
    case OPTK_MB_BYTES:
        if ((r = opt_megabytes(cmd, flag, val, &v)) == 0)
            *(uint64_t *)field = v << 20;
        return r;
    case OPTK_COUNT:
        if ((r = opt_count(cmd, flag, val, &v)) == 0)
            *(unsigned *)field = (unsigned)MIN(v, s->max);
        return r;
    case OPTK_COUNT64:
        return opt_count(cmd, flag, val, field);
    case OPTK_NUMBER:
        if (parse_u64(val, &v) < 0 || v < s->min || v > s->max)
            return usage_error(cmd, "%s: '%s' is not a whole number from %llu to %llu", flag, val,
                               (unsigned long long)s->min, (unsigned long long)s->max);
        *(uint64_t *)field = v;
        return 0;
    case OPTK_FN:
        return s->fn(opts, cmd, val);
    case OPTK_REFUSED:
        return usage_error(cmd, "%s", s->help);
    case OPTK_TEXT:
        break;
    }
    return usage_error(cmd, "%s: not an option this program knows how to take", flag);
}

/* The options of a subcommand as getopt_long takes them. */
struct opt_list {
    struct option *longs; /* ends with the zeroed entry getopt_long wants */
    size_t n_longs;
    const struct opt_spec **specs; /* option OPT_VAL0 + i is specs[i] ... */
    size_t *bases;                 /* ... in the struct at opts + bases[i] */
    size_t n;
    char shorts[32]; /* "+:h" and the short options */
};

static bool opt_list_has(const struct opt_list *l, const char *name)
{
    for (size_t i = 0; i < l->n_longs; i++)
        if (!strcmp(l->longs[i].name, name))
            return true;
    return false;
}

static void opt_list_add(struct opt_list *l, const struct opt_table *t, size_t base)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct opt_spec *s = &t->specs[i];
        /* A name taken already is the subcommand's own, which comes first. */
        if (s->kind == OPTK_TEXT || (s->name && opt_list_has(l, s->name)))
            continue;
        if (s->name)
            l->longs[l->n_longs++] = (struct option){
                s->name, s->arg ? required_argument : no_argument, NULL, OPT_VAL0 + (int)l->n};
        if (s->letter) {
            size_t len = strlen(l->shorts);
            if (len + 3 > sizeof(l->shorts) || strchr(l->shorts, s->letter))
                abort(); /* a table's mistake, caught by every test that runs the command */
            l->shorts[len] = s->letter;
            l->shorts[len + 1] = s->arg ? ':' : '\0';
        }
        l->specs[l->n] = s;
        l->bases[l->n++] = base;
    }
}

static void opt_list_init(struct opt_list *l, const struct opt_cmd *c)
{
    size_t max = c->own.n;
    for (size_t g = 0; g < ARRAY_SIZE(c->groups) && c->groups[g].table; g++)
        max += c->groups[g].table->n;
    *l = (struct opt_list){.longs = xcalloc(max + 2, sizeof(*l->longs)),
                           .specs = xcalloc(max, sizeof(*l->specs)),
                           .bases = xcalloc(max, sizeof(*l->bases))};
    l->longs[l->n_longs++] = (struct option){"help", no_argument, NULL, 'h'};
    /* '+': stop at the first argument that is not an option; ':': a missing value is ':'. */
    strcpy(l->shorts, c->args == OPTA_ANYWHERE ? ":h" : "+:h");
    opt_list_add(l, &c->own, 0);
    for (size_t g = 0; g < ARRAY_SIZE(c->groups) && c->groups[g].table; g++)
        opt_list_add(l, c->groups[g].table, c->groups[g].base);
}

static void opt_list_release(struct opt_list *l)
{
    free(l->longs);
    free(l->specs);
    free(l->bases);
}

/* The entry of getopt_long's value ch (a long option's number or a short option's letter). */
static size_t opt_list_find(const struct opt_list *l, int ch)
{
    if (ch >= OPT_VAL0)
        return (size_t)(ch - OPT_VAL0);
    for (size_t i = 0; i < l->n; i++)
        if (l->specs[i]->letter == ch)
            return i;
    return l->n;
}

/* getopt_long's ':' and '?', said with what the command line had. For a long option, optopt
 * is its value (>= OPT_VAL0), not a character to print. */
static int opt_error(const struct opt_cmd *c, const struct opt_list *l, int ch, char **argv)
{
    const char *arg = argv[optind - 1];
    if (ch == ':' && optopt < OPT_VAL0) {
        size_t i = opt_list_find(l, optopt);
        return usage_error(c->name, "-%c needs %s", optopt,
                           i < l->n ? l->specs[i]->arg : "a value");
    }
    if (ch == ':')
        return usage_error(c->name, "option '%s' needs a value", arg);
    if (optopt >= OPT_VAL0)
        return usage_error(c->name, "option '%.*s' takes no value", (int)strcspn(arg, "="), arg);
    if (optopt)
        return usage_error(c->name, "unknown option '-%c'; run 'runcell %s --help'", optopt,
                           c->name);
    return usage_error(c->name, "unknown option '%s'; run 'runcell %s --help'", arg, c->name);
}

static void print_help(const struct opt_cmd *c)
{
    fputs(c->usage, stdout);
    opttab_help(stdout, &c->own, c->column);
    for (size_t g = 0; g < ARRAY_SIZE(c->groups) && c->groups[g].table; g++)
        if (c->groups[g].listed)
            opttab_help(stdout, c->groups[g].table, c->column);
}

int opttab_parse(const struct opt_cmd *c, int argc, char **argv, void *opts, int *ret_first)
{
    struct opt_list l;
    int ch, r = 0;
    opt_list_init(&l, c);
    opterr = 0;
    optind = 1;
    while (!r && (ch = getopt_long(argc, argv, l.shorts, l.longs, NULL)) != -1) {
        size_t i = opt_list_find(&l, ch);
        if (ch == 'h') {
            print_help(c);
            r = OPTTAB_HELP;
        } else if (ch == ':' || ch == '?') {
            r = opt_error(c, &l, ch, argv);
        } else if (i < l.n) {
            r = opttab_apply(c->name, l.specs[i], (char *)opts + l.bases[i], optarg);
        } else {
            r = usage_error(c->name, "unknown option; run 'runcell %s --help'", c->name);
        }
    }
    if (!r && c->args == OPTA_NONE && optind < argc)
        r = usage_error(c->name, "unexpected argument '%s'", argv[optind]);
    opt_list_release(&l);
    if (!r)
        *ret_first = optind;
    return r;
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

void opttab_help(FILE *f, const struct opt_table *t, int column)
{
    for (size_t i = 0; i < t->n; i++) {
        const struct opt_spec *s = &t->specs[i];
        if (s->kind == OPTK_TEXT) {
            fprintf(f, "%s\n", s->help);
            continue;
        }
        if (!s->help || s->kind == OPTK_REFUSED)
            continue;
        char head[64];
        int w = s->name ? snprintf(head, sizeof(head), "  --%s", s->name)
                        : snprintf(head, sizeof(head), "  -%c", s->letter);
        if (s->arg)
            w += snprintf(head + w, sizeof(head) - (size_t)w, " %s", s->arg);
        if (w >= column)
            fprintf(f, "%s\n%*s", head, column, "");
        else
            fprintf(f, "%-*s", column, head);
        help_lines(f, s->help, column);
    }
}
