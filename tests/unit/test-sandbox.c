/* test-sandbox.c - unit tests for src/sandbox that need no privileges. */
#include <string.h>

#include "runner.h"
#include "sandbox/sandbox.h"

static struct ws_entry ent(const char *path, uint64_t size, int64_t mtime)
{
    return (struct ws_entry){.path = (char *)path, .size = size, .mtime_ns = mtime, .ino = 1,
                             .mode = 0100644};
}

TEST(listing_diff_finds_created_modified_deleted)
{
    struct ws_entry b[] = {ent("a", 1, 1), ent("b", 1, 1), ent("c", 1, 1)};
    struct ws_entry a[] = {ent("a", 1, 1), ent("b", 2, 5), ent("d", 1, 1)};
    struct ws_listing before = {.v = b, .n = 3}, after = {.v = a, .n = 3};
    char **created, **modified, **deleted;
    ws_listing_diff(&before, &after, &created, &modified, &deleted);
    CHECK(strv_len(created) == 1 && !strcmp(created[0], "d"));
    CHECK(strv_len(modified) == 1 && !strcmp(modified[0], "b"));
    CHECK(strv_len(deleted) == 1 && !strcmp(deleted[0], "c"));
    strv_free(created);
    strv_free(modified);
    strv_free(deleted);
}

TEST(default_limits_are_filled)
{
    struct sandbox_limits l = {.memory_mb = 64};
    sandbox_limits_fill_defaults(&l);
    CHECK(l.memory_mb == 64);
    CHECK(l.pids == SANDBOX_DEFAULT_PIDS);
    CHECK(l.disk_mb == SANDBOX_DEFAULT_DISK_MB);
}

TEST(default_env_is_clean)
{
    char **env = sandbox_default_env();
    bool home = false;
    for (char **e = env; *e; e++) {
        CHECK(strncmp(*e, "RUNCELL_", 8) != 0);
        home |= !strcmp(*e, "HOME=/workspace");
    }
    CHECK(home);
    strv_free(env);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
