/* test-base.c - unit tests for src/base. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "base/base.h"
#include "runner.h"

/* What log_msg writes for type="arg", read back from a file put in place of stderr. */
static char *logged(const char *arg)
{
    static char out[16384];
    char path[] = "/tmp/runcell-test-log-XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    CHECK(fd >= 0 && saved >= 0);
    unlink(path);
    CHECK(dup2(fd, 2) == 2);
    log_msg(LOG_WARN, "type=\"%s\"", arg);
    CHECK(dup2(saved, 2) == 2);
    close(saved);
    ssize_t n = pread(fd, out, sizeof(out) - 1, 0);
    CHECK(n > 0);
    out[n] = '\0';
    close(fd);
    return out;
}

TEST(log_lines_escape_control_characters_from_any_argument)
{
    const char *line = logged("x\n2026-01-01T00:00:00.000Z level=error msg=\"forged\"\r\t\x1b[2J"
                              "\x7f\xff\xc2\x9b caf\xc3\xa9 \xe2\x82\xac");
    CHECK(strchr(line, '\n') == line + strlen(line) - 1); /* one line, its own newline */
    CHECK(strstr(line, "level=warn type=\"x\\n2026") != NULL);
    CHECK(strstr(line, "\\r\\t\\x1b[2J\\x7f\\xff\\xc2\\x9b caf\xc3\xa9 \xe2\x82\xac\"\n") != NULL);
    for (const char *p = line; *p != '\n'; p++)
        CHECK((unsigned char)*p >= 0x20 && *p != 0x7f);
    /* Overlong forms and surrogates are not text either. */
    line = logged("\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80");
    CHECK(strstr(line, "\\xc0\\xaf \\xed\\xa0\\x80 \\xf4\\x90\\x80\\x80\"\n") != NULL);
    /* A line too long for the buffer says it was cut, escaped or not. */
    static char big[6000];
    memset(big, '\n', sizeof(big) - 1);
    line = logged(big);
    CHECK(strstr(line, "\\n\\n...[truncated]\n") != NULL);
    memset(big, 'a', sizeof(big) - 1);
    line = logged(big);
    CHECK(strstr(line, "aaa...[truncated]\n") != NULL);
}

TEST(buf_cap_refuses_past_max)
{
    struct buf b;
    buf_init(&b, 8);
    CHECK(buf_append(&b, "12345678", 8) == 0);
    CHECK(buf_append(&b, "9", 1) == -E2BIG);
    CHECK(b.len == 8);
    CHECK_STREQ(b.data, "12345678");
    buf_release(&b);
}

TEST(outcap_keeps_head_and_tail)
{
    struct outcap c;
    outcap_init(&c, 10); /* 5 head, 5 tail */
    size_t head = outcap_append(&c, "abcdefghijklmnopqrstuvwxyz", 26);
    CHECK(head == 5);
    CHECK(outcap_truncated(&c));
    size_t n;
    char *s = outcap_render(&c, &n);
    CHECK(strncmp(s, "abcde", 5) == 0);
    CHECK(strstr(s, "16 bytes of output dropped") != NULL);
    CHECK(strcmp(s + n - 5, "vwxyz") == 0);
    free(s);
    outcap_release(&c);
}

TEST(outcap_tail_ring_wraps_in_small_pieces)
{
    struct outcap c;
    outcap_init(&c, 8); /* 4 + 4 */
    const char *text = "0123456789ABCDEFGHIJ";
    for (size_t i = 0; i < strlen(text); i++)
        outcap_append(&c, text + i, 1);
    size_t n;
    char *s = outcap_render(&c, &n);
    CHECK(strncmp(s, "0123", 4) == 0);
    CHECK(strcmp(s + n - 4, "GHIJ") == 0);
    free(s);
    outcap_release(&c);
}

TEST(outcap_small_output_is_untouched)
{
    struct outcap c;
    outcap_init(&c, 1024);
    outcap_append(&c, "hello\n", 6);
    CHECK(!outcap_truncated(&c));
    size_t n;
    char *s = outcap_render(&c, &n);
    CHECK_STREQ(s, "hello\n");
    free(s);
    s = outcap_render_rest(&c, &n);
    CHECK(n == 0);
    free(s);
    outcap_release(&c);
}

TEST(outcap_between_head_and_cap_keeps_everything)
{
    /* Past the head but within the cap: nothing is dropped, and the rest after the head is
     * exactly the bytes that did not fit in it (runcell run forwards it at the end). */
    struct outcap c;
    outcap_init(&c, 10);
    CHECK(outcap_append(&c, "abcdefgh", 8) == 5);
    CHECK(!outcap_truncated(&c));
    size_t n;
    char *s = outcap_render_rest(&c, &n);
    CHECK(n == 3 && memcmp(s, "fgh", 3) == 0);
    free(s);
    s = outcap_render(&c, &n);
    CHECK_STREQ(s, "abcdefgh");
    free(s);
    outcap_release(&c);
}

TEST(outcap_exactly_full_is_not_truncated)
{
    struct outcap c;
    outcap_init(&c, 10);
    outcap_append(&c, "0123456789", 10);
    CHECK(!outcap_truncated(&c));
    outcap_append(&c, "X", 1);
    CHECK(outcap_truncated(&c));
    size_t n;
    char *s = outcap_render(&c, &n);
    CHECK(strncmp(s, "01234", 5) == 0);
    CHECK(strstr(s, "1 bytes of output dropped") != NULL);
    CHECK(strcmp(s + n - 5, "6789X") == 0);
    free(s);
    outcap_release(&c);
}

TEST(utf8_sanitize_keeps_valid_text)
{
    const char *text = "h\xc3\xa9llo \xe2\x9c\x93 \xe6\x97\xa5 \xf0\x9f\x8e\x89";
    size_t n;
    char *s = utf8_sanitize(text, strlen(text), &n);
    CHECK(n == strlen(text));
    CHECK_STREQ(s, text);
    free(s);
    s = utf8_sanitize("\xf4\x90\x80\x80", 4, &n); /* past U+10FFFF */
    CHECK(!strstr(s, "\xf4"));
    free(s);
    s = utf8_sanitize("", 0, &n);
    CHECK(s && n == 0);
    free(s);
}

TEST(utf8_sanitize_replaces_invalid_bytes)
{
    size_t n;
    char *s = utf8_sanitize("a\xff"
                            "b\xc3\xa9"
                            "c\xe2\x82",
                            8, &n);
    CHECK_STREQ(s, "a\xef\xbf\xbd"
                   "b\xc3\xa9"
                   "c\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
    s = utf8_sanitize("x\0y", 3, &n); /* NUL becomes U+FFFD too */
    CHECK(n == 5 && memcmp(s, "x\xef\xbf\xbdy", 5) == 0);
    free(s);
    s = utf8_sanitize("\xc0\xaf\xed\xa0\x80", 5, &n); /* overlong, surrogate */
    CHECK(!strstr(s, "\xc0") && !strstr(s, "\xed"));
    free(s);
}

TEST(parse_numbers_strictly)
{
    uint64_t v, ms;
    CHECK(parse_u64("42", &v) == 0 && v == 42);
    CHECK(parse_u64("abc", &v) < 0);
    CHECK(parse_u64("-1", &v) < 0);
    CHECK(parse_u64("12x", &v) < 0);
    CHECK(parse_u64("", &v) < 0);
    CHECK(parse_u64("99999999999999999999999", &v) == -ERANGE);
    CHECK(parse_seconds("1.5", &ms) == 0 && ms == 1500);
    CHECK(parse_seconds("-1", &ms) < 0);
    CHECK(parse_seconds("0", &ms) < 0);
    CHECK(parse_seconds("nan", &ms) < 0);
    CHECK(parse_seconds("1e99", &ms) < 0);
    CHECK(parse_seconds("inf", &ms) < 0);
    CHECK(parse_seconds("", &ms) < 0);
    CHECK(parse_seconds("1s", &ms) < 0);
    CHECK(parse_seconds("0.0001", &ms) == 0 && ms == 1); /* never rounds down to "no limit" */
    CHECK(parse_seconds(".5", &ms) == 0 && ms == 500);
    CHECK(parse_u64(" 1", &v) < 0);
    CHECK(parse_u64("+1", &v) < 0);
}

TEST(safe_relative_paths)
{
    CHECK(path_is_safe_relative("a"));
    CHECK(path_is_safe_relative("dir/file.txt"));
    CHECK(path_is_safe_relative(".hidden/x"));
    CHECK(!path_is_safe_relative(""));
    CHECK(!path_is_safe_relative("/etc/passwd"));
    CHECK(!path_is_safe_relative("../x"));
    CHECK(!path_is_safe_relative("a/../b"));
    CHECK(!path_is_safe_relative("a/.."));
    CHECK(!path_is_safe_relative("./a"));
    CHECK(!path_is_safe_relative("a//b"));
    CHECK(!path_is_safe_relative("a/"));
}

TEST(err_set_returns_negative_errno)
{
    CHECK(err_set(ENOENT, "cannot open %s", "x") == -ENOENT);
    CHECK_STREQ(err_msg(), "cannot open x");
}

TEST(realtime_after_ms_carries_nanoseconds)
{
    struct timespec now, later;
    clock_gettime(CLOCK_REALTIME, &now);
    realtime_after_ms(&later, 1999);
    CHECK(later.tv_nsec >= 0 && later.tv_nsec < 1000000000);
    double delta =
        (double)(later.tv_sec - now.tv_sec) + (double)(later.tv_nsec - now.tv_nsec) / 1e9;
    CHECK(delta >= 1.999 && delta < 60); /* 60: a generous bound for a descheduled test */
}

TEST(ms_since_is_zero_for_a_later_stamp)
{
    CHECK(ms_since(1000, 400) == 600);
    CHECK(ms_since(1000, 1000) == 0);
    /* A stamp taken after now was read (another thread's): no time passed, not 2^64 - 1. */
    CHECK(ms_since(1000, 1001) == 0);
    CHECK(ms_since(0, UINT64_MAX) == 0);
}

TEST(json_measure_counts_depth_values_and_strings)
{
    struct json_shape sh;
    const char *t = "{\"a\": [1, -2.5e3, true, null, \"x\\\"y\"], \"b\": {}}";
    CHECK(json_measure(t, strlen(t), NULL, &sh) == 0);
    CHECK(sh.depth == 2);
    /* object, key a, array, 1, -2.5e3, true, null, string, key b, {} */
    CHECK(sh.values == 10);
    CHECK(sh.longest_string == 4); /* x\"y as written */
    /* Brackets and quotes inside strings are text. */
    const char *u = "[\"[[[{{{\"]";
    CHECK(json_measure(u, strlen(u), NULL, &sh) == 0);
    CHECK(sh.depth == 1 && sh.values == 2);
}

TEST(json_measure_stops_at_each_bound)
{
    struct json_shape sh;
    struct json_bounds depth = {.max_depth = 3}, values = {.max_values = 4},
                       str = {.max_string = 3};
    CHECK(json_measure("[[[]]]", 6, &depth, &sh) == 0);
    CHECK(json_measure("[[[[]]]]", 8, &depth, &sh) == -E2BIG);
    CHECK(sh.depth == 4);
    CHECK(json_measure("[1,2,3]", 7, &values, &sh) == 0);
    CHECK(json_measure("[[],[],[],[]]", 13, &values, &sh) == -E2BIG);
    CHECK(json_measure("[\"abc\"]", 7, &str, &sh) == 0);
    CHECK(json_measure("[\"abcd\"]", 8, &str, &sh) == -E2BIG);
    /* An unterminated string still counts. */
    CHECK(json_measure("[\"abcd", 6, &str, &sh) == -E2BIG);
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

/* A fresh temporary directory; caller frees the path (the directory is left in /tmp). */
static char *scratch_dir(void)
{
    char tmpl[] = "/tmp/runcell-unit-base-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    return xstrdup(tmpl);
}

TEST(read_regular_fd_is_capped_and_says_the_size)
{
    _cleanup_free_ char *dir = scratch_dir();
    _cleanup_free_ char *path = xasprintf("%s/f", dir);
    CHECK(write_file(path, "0123456789", 10, 0600) == 0);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    CHECK(fd >= 0);
    struct buf b;
    uint64_t size = 0;
    CHECK(read_regular_fd(fd, 10, &b, &size) == 0);
    CHECK(b.len == 10 && size == 10 && !strcmp(b.data, "0123456789"));
    CHECK((fcntl(fd, F_GETFL) & O_NONBLOCK) == 0); /* made blocking for the read */
    buf_release(&b);
    CHECK(lseek(fd, 0, SEEK_SET) == 0);
    memset(&b, 0xa5, sizeof(b)); /* whatever was there: it is set up and left released */
    size = 0;
    CHECK(read_regular_fd(fd, 9, &b, &size) == -E2BIG);
    CHECK(size == 10 && b.data == NULL && b.len == 0);
    /* a cap of 0 takes an empty file only */
    _cleanup_free_ char *empty = xasprintf("%s/e", dir);
    CHECK(write_file(empty, "", 0, 0600) == 0);
    char *data;
    size_t n;
    CHECK(read_file(empty, 0, &data, &n) == 0 && n == 0 && data[0] == '\0');
    free(data);
    CHECK(read_file(path, 0, &data, &n) == -E2BIG);
    CHECK(read_file(path, 10, &data, &n) == 0 && n == 10);
    free(data);
    CHECK(read_file(path, 4, &data, &n) == -E2BIG);
    /* kernel files say 0 bytes and have more: the cap holds while reading */
    CHECK(read_file("/proc/self/status", 16, &data, &n) == -E2BIG);
    CHECK(read_file("/proc/self/status", 1 << 20, &data, &n) == 0 && strstr(data, "Pid:"));
    free(data);
    unlink(path);
    unlink(empty);
    rmdir(dir);
}

TEST(send_with_fds_carries_text_and_fds_in_one_message)
{
    int sp[2], pipefd[2];
    CHECK(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) == 0);
    CHECK(pipe2(pipefd, O_CLOEXEC) == 0);
    CHECK(send_with_fds(sp[0], "{\"pid\": 7}", &pipefd[1], 1) == 0);
    CHECK(send_with_fds(sp[0], "plain", NULL, 0) == 0);
    int many[33] = {0};
    CHECK(send_with_fds(sp[0], "x", many, 33) == -EINVAL);
    for (int round = 0; round < 2; round++) {
        char text[32] = "", cbuf[CMSG_SPACE(sizeof(int) * 4)];
        struct iovec iov = {.iov_base = text, .iov_len = sizeof(text) - 1};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
        ssize_t n = recvmsg(sp[1], &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        if (round == 0) {
            CHECK(n == 10 && !strcmp(text, "{\"pid\": 7}"));
            CHECK(c && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)));
            int got;
            memcpy(&got, CMSG_DATA(c), sizeof(int));
            CHECK(write(got, "y", 1) == 1); /* the pipe's write end came across */
            char y;
            CHECK(read(pipefd[0], &y, 1) == 1 && y == 'y');
            close(got);
        } else {
            CHECK(n == 5 && !strcmp(text, "plain") && c == NULL);
        }
    }
    close(sp[1]);
    CHECK(send_with_fds(sp[0], "gone", NULL, 0) == -EPIPE);
    close(sp[0]);
    close(pipefd[0]);
    close(pipefd[1]);
}

TEST(read_file_refuses_what_is_not_a_regular_file)
{
    _cleanup_free_ char *dir = scratch_dir();
    _cleanup_free_ char *fifo = xasprintf("%s/fifo", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    char *data;
    size_t n;
    /* nobody writes the FIFO: opened non-blocking and refused, never waited on */
    CHECK(read_file(fifo, 1 << 20, &data, &n) == -EINVAL);
    CHECK(read_file(dir, 1 << 20, &data, &n) == -EINVAL);
    CHECK(read_file("/dev/null", 1 << 20, &data, &n) == -EINVAL);
    _cleanup_free_ char *missing = xasprintf("%s/missing", dir);
    CHECK(read_file(missing, 1 << 20, &data, &n) == -ENOENT);
    unlink(fifo);
    rmdir(dir);
}

TEST(rm_rf_of_a_deep_tree_holds_few_fds)
{
    /* A sandbox can make a tree as deep as its inodes allow; deleting it must not take an
     * fd (and a directory buffer) per level. With 64 fds at most, 3000 levels go. */
    char tmpl[] = "/tmp/runcell-rm-XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL);
    int fd = open(tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(fd >= 0);
    for (int i = 0; i < 3000; i++) {
        CHECK(mkdirat(fd, "d", 0700) == 0);
        int f = openat(fd, "f", O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        CHECK(f >= 0);
        close(f);
        int next = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        CHECK(next >= 0);
        close(fd);
        fd = next;
    }
    close(fd);
    int before = open_fds();
    struct rlimit rl = {64, 64};
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    CHECK(rm_rf(tmpl) == 0);
    CHECK(access(tmpl, F_OK) < 0 && errno == ENOENT);
    CHECK(open_fds() == before);
}

int main(int argc, char **argv)
{
    return run_tests(argc, argv);
}
