/*
 * Tests of pylock's macOS process core (kqueue, sysctl, SIGCHLD self-pipe).
 * Runs on a Mac (the GitHub test workflow):
 *   cc -std=c11 -Wall -Wextra -Werror -fsanitize=address,undefined \
 *      -Icsrc csrc/lock_posix.c csrc/wait_posix.c csrc/proc_macos.c csrc/tests/test_proc_macos.c
 * .ci/macos-check.sh compiles and links it for arm64 and x86_64 macOS.
 * Real processes throughout; synchronisation through pipes and waitid, never
 * sleeps.  Tests that change process-wide signal state run in a forked child.
 */
#define _DARWIN_C_SOURCE 1
#include "../pylock_proc.h"

#if defined(__APPLE__)

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int passed, failed;

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (cond) {                                                         \
            passed++;                                                       \
        } else {                                                            \
            failed++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                   \
    } while (0)

/* A child that blocks until its end of the pipe closes, then exits with
 * code; *release_fd is the parent's end. */
static pid_t spawn_blocker(int *release_fd, int code)
{
    int p[2];
    if (pipe(p) != 0)
        abort();
    pid_t pid = fork();
    if (pid < 0)
        abort();
    if (pid == 0) {
        char c;
        close(p[1]);
        while (read(p[0], &c, 1) < 0 && errno == EINTR)
            ;
        _exit(code);
    }
    close(p[0]);
    fcntl(p[1], F_SETFD, FD_CLOEXEC);
    *release_fd = p[1];
    return pid;
}

/* Blocks until child pid has exited, without reaping it. */
static void wait_zombie(pid_t pid)
{
    siginfo_t si;
    while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) != 0 && errno == EINTR)
        ;
}

static void reap(pid_t pid)
{
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

static int readable(int64_t fd)
{
    struct pollfd p = {.fd = (int)fd, .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static void test_identity_of_self(void)
{
    pl_identity a, b;
    CHECK(pl_identity_of(getpid(), &a) == 0);
    CHECK(pl_identity_of(getpid(), &b) == 0);
    CHECK(a.pid == getpid());
    CHECK(a.start_time > 0);
    CHECK(a.start_time == b.start_time);
    CHECK(a.pidfs_ino == 0);
    CHECK(a.boot_id[0] != '\0');
    CHECK(strcmp(a.boot_id, b.boot_id) == 0);
}

static void test_identity_errors(void)
{
    pl_identity id;
    pl_handle h;
    CHECK(pl_identity_of(0, &id) == EINVAL);
    CHECK(pl_identity_of(-5, &id) == EINVAL);
    CHECK(pl_identity_of((int64_t)INT_MAX + 1, &id) == EINVAL);
    CHECK(pl_proc_open(0, &h) == EINVAL);
    CHECK(pl_proc_open(-1, &h) == EINVAL);

    /* A child that has been reaped is gone: its pid names nothing (a
     * recycled pid this soon is not a concern on a 99999-pid system). */
    int release;
    pid_t pid = spawn_blocker(&release, 0);
    close(release);
    reap(pid);
    CHECK(pl_identity_of(pid, &id) == ESRCH);
    CHECK(pl_proc_open(pid, &h) == ESRCH);
}

/* Exit of a child seen through the handle, with its status, sticky. */
static void test_child_exit(void)
{
    int release, exited = -1, rc = 0;
    int64_t fd = -1;
    pl_handle h;
    pl_identity before, pinned;
    pid_t pid = spawn_blocker(&release, 7);

    CHECK(pl_identity_of(pid, &before) == 0);
    CHECK(pl_proc_open(pid, &h) == 0);
    CHECK(fcntl((int)h, F_GETFD) & FD_CLOEXEC);
    CHECK(pl_proc_identity(h, pid, &pinned) == 0);
    CHECK(pinned.start_time == before.start_time);
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 0);
    CHECK(pl_proc_wait(h, 10 * 1000 * 1000, NULL) == ETIMEDOUT);
    CHECK(pl_proc_returncode(h, pid, &rc) == EAGAIN);
    CHECK(pl_proc_event_fd(h, &fd) == 0 && fd == h);
    CHECK(!readable(fd));

    close(release);
    CHECK(pl_proc_wait(h, -1, NULL) == 0);
    /* The exit stays visible to every later look. */
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 1);
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 1);
    CHECK(pl_proc_wait(h, 0, NULL) == 0);
    CHECK(readable(fd));
    CHECK(pl_proc_returncode(h, pid, &rc) == 0 && rc == 7);

    /* Unreaped, it is a zombie: exited for pl_identity_of, still itself
     * for the handle, and its status is still there for its parent. */
    wait_zombie(pid);
    pl_identity id;
    CHECK(pl_identity_of(pid, &id) == ESRCH);
    CHECK(pl_proc_identity(h, pid, &pinned) == 0 && pinned.start_time == before.start_time);
    int cexited = 0, crc = 0;
    CHECK(pl_child_poll(pid, &cexited, &crc) == 0 && cexited == 1 && crc == 7);
    CHECK(pl_child_poll(pid, &cexited, &crc) == 0 && cexited == 1); /* not reaped */

    reap(pid);
    CHECK(pl_proc_identity(h, pid, &pinned) == ESRCH);
    CHECK(pl_proc_returncode(h, pid, &rc) == 0 && rc == 7); /* kept in the kqueue */
    CHECK(pl_child_poll(pid, &cexited, &crc) == ECHILD);
    CHECK(pl_proc_close(h) == 0);
}

static void test_killed_child(void)
{
    int release, rc = 0;
    pl_handle h;
    pid_t pid = spawn_blocker(&release, 0);
    CHECK(pl_proc_open(pid, &h) == 0);
    kill(pid, SIGKILL);
    CHECK(pl_proc_wait(h, -1, NULL) == 0);
    CHECK(pl_proc_returncode(h, pid, &rc) == 0 && rc == -SIGKILL);
    close(release);
    reap(pid);
    pl_proc_close(h);
}

/* A zombie opens as an already-exited handle, like a pidfd. */
static void test_open_zombie(void)
{
    int release, exited = 0, rc = 0;
    pl_handle h;
    pid_t pid = spawn_blocker(&release, 3);
    close(release);
    wait_zombie(pid);
    CHECK(pl_proc_open(pid, &h) == 0);
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 1);
    CHECK(pl_proc_wait(h, -1, NULL) == 0);
    CHECK(pl_proc_returncode(h, pid, &rc) == 0 && rc == 3);
    pl_identity id;
    CHECK(pl_proc_identity(h, pid, &id) == 0 && id.pid == pid);
    reap(pid);
    pl_proc_close(h);
}

/* A process that is not our child: exit seen, status known or ENODATA. */
static void test_non_child(void)
{
    int report[2], release[2];
    pid_t grandchild = 0, middle;
    pl_handle h;
    if (pipe(report) != 0 || pipe(release) != 0)
        abort();
    middle = fork();
    if (middle == 0) {
        pid_t g = fork();
        if (g == 0) {
            char c;
            close(report[0]);
            close(report[1]);
            close(release[1]);
            while (read(release[0], &c, 1) < 0 && errno == EINTR)
                ;
            _exit(5);
        }
        ssize_t w = write(report[1], &g, sizeof g);
        _exit(w == sizeof g ? 0 : 1);
    }
    close(report[1]);
    close(release[0]);
    CHECK(read(report[0], &grandchild, sizeof grandchild) == sizeof grandchild);
    close(report[0]);
    reap(middle); /* the grandchild now belongs to launchd */

    CHECK(pl_proc_open(grandchild, &h) == 0);
    int exited = 0, rc = 0, cexited = 0, crc = 0;
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 0);
    CHECK(pl_child_poll(grandchild, &cexited, &crc) == ECHILD);
    close(release[1]);
    CHECK(pl_proc_wait(h, -1, NULL) == 0);
    int r = pl_proc_returncode(h, grandchild, &rc);
    CHECK(r == ENODATA || (r == 0 && rc == 5));
    printf("non-child exit status: %s\n", r == 0 ? "known (NOTE_EXITSTATUS)" : "ENODATA");
    pl_proc_close(h);
}

struct cancel_arg {
    pl_handle h;
    pl_waiter *w;
    int rc;
};

static void *cancel_waiter(void *p)
{
    struct cancel_arg *a = p;
    a->rc = pl_proc_wait(a->h, -1, a->w);
    return NULL;
}

static void test_cancel(void)
{
    int release;
    pl_handle h;
    pthread_t t;
    pid_t pid = spawn_blocker(&release, 0);
    struct cancel_arg a = {0, pl_waiter_new(), -1};
    CHECK(pl_proc_open(pid, &h) == 0);
    a.h = h;
    pthread_create(&t, NULL, cancel_waiter, &a);
    /* pl_waiter_cancel interrupts the wait whether it has begun or not. */
    pl_waiter_cancel(a.w);
    pthread_join(t, NULL);
    CHECK(a.rc == ECANCELED);
    pl_waiter_free(a.w);

    /* A timed wait with a waiter times out through kevent itself. */
    pl_waiter *w = pl_waiter_new();
    CHECK(pl_proc_wait(h, 5 * 1000 * 1000, w) == ETIMEDOUT);
    close(release);
    CHECK(pl_proc_wait(h, -1, w) == 0);
    pl_waiter_free(w);
    reap(pid);
    pl_proc_close(h);
}

/* ---- SIGCHLD fallback, each in a child of its own -------------------- */

static int prev_handler_calls;
static void prev_handler(int sig)
{
    (void)sig;
    prev_handler_calls++;
}

static int sigchld_chains(void)
{
    int64_t fd, again;
    int release, exited = 0, rc = 0, bad = 0, heard = 0;
    signal(SIGCHLD, prev_handler);
    if (pl_sigchld_open(&fd, &heard) != 0 || !heard)
        return 1;
    if (pl_sigchld_open(&again, &heard) != 0 || again != fd || !heard)
        bad++;
    pid_t pid = spawn_blocker(&release, 4);
    close(release);
    struct pollfd p = {.fd = (int)fd, .events = POLLIN};
    while (poll(&p, 1, -1) < 0 && errno == EINTR)
        ;
    if (!(p.revents & POLLIN))
        bad++;
    if (pl_sigchld_drain(fd) != 0 || readable(fd))
        bad++;
    if (pl_child_poll(pid, &exited, &rc) != 0 || !exited || rc != 4)
        bad++;
    if (prev_handler_calls < 1)
        bad++;
    reap(pid);
    return bad;
}

static int sigchld_ignored(void)
{
    int64_t fd;
    int heard;
    signal(SIGCHLD, SIG_IGN);
    return pl_sigchld_open(&fd, &heard) == ECHILD ? 0 : 1;
}

static void in_child(int (*fn)(void), const char *name)
{
    int status = 0;
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn());
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        passed++;
    } else {
        failed++;
        fprintf(stderr, "FAIL %s (status %d)\n", name, status);
    }
}

int main(void)
{
    test_identity_of_self();
    test_identity_errors();
    test_child_exit();
    test_killed_child();
    test_open_zombie();
    test_non_child();
    test_cancel();
    in_child(sigchld_chains, "sigchld_chains");
    in_child(sigchld_ignored, "sigchld_ignored");
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

#else
int main(void)
{
    return 0;
}
#endif
