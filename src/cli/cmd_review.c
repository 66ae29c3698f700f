/* cmd_review.c - `runcell review`: the human review queue of failed agent runs, and the top
 * failure signatures of the failure memory. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "agent/agent.h"
#include "http/serve.h"
#include "cli/cli.h"

static const char review_usage[] =
    "usage: runcell review [--data DIR] [--json] COMMAND\n"
    "\n"
    "The human review queue: incidents recorded when an agent run failed (task, transcript,\n"
    "every code attempt, errors, sandbox logs, fallbacks).\n"
    "\n";

struct review_opts {
    const char *data_dir;
    bool json;
    const char *status;
    uint64_t limit;
    const char *note;
    char **words; /* the command and its arguments */
};

static int set_status(void *opts, const char *cmd, char *val)
{
    if (strcmp(val, "open") && strcmp(val, "resolved"))
        return usage_error(cmd, "--status: '%s' is not open or resolved", val);
    ((struct review_opts *)opts)->status = val;
    return 0;
}

#define F(member) offsetof(struct review_opts, member)

static const char review_commands_help[] =
    "  list [--status open|resolved] [--limit N]   incidents, newest first\n"
    "  show ID                                     the whole incident record (JSON)\n"
    "  resolve ID --note TEXT                      mark an incident resolved\n"
    "  failures [--limit N]                        the most frequent failure signatures\n";

/* --status, --limit and --note are described with the commands that take them. */
static const struct opt_spec review_specs[] = {
    {NULL, .help = review_commands_help},
    {"data", "DIR", OPTK_STRING, F(data_dir),
     .help = "the data directory (default RUNCELL_DATA, else /var/lib/runcell as root,\n"
             "else ~/.local/share/runcell)"},
    {"json", NULL, OPTK_FLAG, F(json), .help = "JSON output for list, resolve and failures"},
    {"status", "open|resolved", OPTK_FN, .fn = set_status},
    {"limit", "N", OPTK_COUNT64, F(limit)},
    {"note", "TEXT", OPTK_STRING, F(note)},
};

static const struct opt_cmd review_cmd = {
    .name = "review",
    .usage = review_usage,
    .own = OPT_TABLE(review_specs),
    .args = OPTA_ANYWHERE, /* options may come before or after the command words */
    .column = 15,
};

static int parse(struct review_opts *o, int argc, char **argv)
{
    int first, r = opttab_parse(&review_cmd, argc, argv, o, &first);
    if (r)
        return r;
    for (; first < argc; first++)
        o->words = strv_push(o->words, argv[first]);
    if (!o->words)
        return usage_error("review", "no command: use list, show ID, resolve ID --note TEXT or "
                                     "failures");
    return 0;
}

static void print_json(json_t *j, size_t flags)
{
    json_dumpf(j, stdout, flags);
    fputc('\n', stdout);
}

/* One line of text: newlines folded, cut at max characters. */
static void print_clipped(const char *s, int max)
{
    int n = 0;
    for (; s && *s && n < max; s++, n++)
        fputc(*s == '\n' || *s == '\t' ? ' ' : *s, stdout);
    if (s && *s)
        fputs("...", stdout);
}

static int do_list(struct review_opts *o)
{
    json_t *arr;
    if (review_list(o->data_dir, o->status, o->limit, &arr) < 0)
        return fprintf(stderr, "runcell review: %s\n", err_msg()), 1;
    if (o->json) {
        print_json(arr, JSON_COMPACT);
    } else if (!json_array_size(arr)) {
        printf("no incidents%s\n", o->status ? " with that status" : "");
    } else {
        size_t i;
        json_t *r;
        printf("%-19s %-24s %-9s %-18s %s\n", "ID", "CREATED", "STATUS", "REASON", "TASK");
        json_array_foreach(arr, i, r)
        {
            printf("%-19s %-24s %-9s %-18s ", json_string_value(json_object_get(r, "id")),
                   json_string_value(json_object_get(r, "created_at")),
                   json_string_value(json_object_get(r, "status")),
                   json_string_value(json_object_get(r, "reason")) ?: "-");
            print_clipped(json_string_value(json_object_get(r, "task")), 60);
            fputc('\n', stdout);
        }
    }
    json_decref(arr);
    return 0;
}

static int do_show(struct review_opts *o, const char *id, bool resolve)
{
    json_t *rec;
    int r = resolve ? review_resolve(o->data_dir, id, o->note, &rec)
                    : review_get(o->data_dir, id, &rec);
    if (r < 0)
        return fprintf(stderr, "runcell review: %s\n", err_msg()), r == -EINVAL ? EXIT_USAGE : 1;
    if (resolve && !o->json)
        printf("resolved %s\n", id);
    else
        print_json(rec, resolve ? JSON_COMPACT : JSON_INDENT(2));
    json_decref(rec);
    return 0;
}

static int do_failures(struct review_opts *o)
{
    json_t *arr;
    if (failmem_top(o->data_dir, o->limit, &arr) < 0)
        return fprintf(stderr, "runcell review: %s\n", err_msg()), 1;
    if (o->json) {
        print_json(arr, JSON_COMPACT);
    } else if (!json_array_size(arr)) {
        printf("no failures recorded\n");
    } else {
        size_t i;
        json_t *f;
        printf("%6s %6s %-9s %-16s %s\n", "COUNT", "FIXED", "UNFIXABLE", "SIGNATURE", "ERROR");
        json_array_foreach(arr, i, f)
        {
            printf("%6lld %6lld %-9s %-16s %s: ",
                   (long long)json_integer_value(json_object_get(f, "count")),
                   (long long)json_integer_value(json_object_get(f, "fixed")),
                   json_is_true(json_object_get(f, "unfixable")) ? "yes" : "no",
                   json_string_value(json_object_get(f, "signature")),
                   json_string_value(json_object_get(f, "type")));
            print_clipped(json_string_value(json_object_get(f, "message")), 70);
            fputc('\n', stdout);
        }
    }
    json_decref(arr);
    return 0;
}

int cmd_review(int argc, char **argv)
{
    struct review_opts o = {0};
    _cleanup_free_ char *data = NULL;
    int r = parse(&o, argc, argv);
    if (r) {
        strv_free(o.words);
        return r == OPTTAB_HELP ? 0 : r;
    }
    if (!o.data_dir)
        o.data_dir = data = default_data_dir();
    const char *cmd = o.words[0];
    size_t n = strv_len(o.words);
    if (!strcmp(cmd, "list") && n == 1)
        r = do_list(&o);
    else if (!strcmp(cmd, "show") && n == 2)
        r = do_show(&o, o.words[1], false);
    else if (!strcmp(cmd, "resolve") && n == 2 && o.note)
        r = do_show(&o, o.words[1], true);
    else if (!strcmp(cmd, "resolve") && n == 2)
        r = usage_error("review", "resolve needs --note TEXT: say what was done");
    else if (!strcmp(cmd, "failures") && n == 1)
        r = do_failures(&o);
    else
        r = usage_error("review",
                        "unknown command '%s' (or wrong arguments): use list, show "
                        "ID, resolve ID --note TEXT or failures",
                        cmd);
    strv_free(o.words);
    return r;
}
