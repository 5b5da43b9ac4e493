/*
 * Tests of pylock's Linux process core, run under ASan/UBSan by .ci/run:
 *   cc -fsanitize=address,undefined csrc/claim.c csrc/lock_posix.c csrc/wait_posix.c \
 *      csrc/proc_linux.c csrc/fallback_linux.c csrc/proc_posix.c csrc/sigchld_posix.c \
 *      csrc/tests/test_proc_linux.c -lpthread -lrt
 * Real processes throughout; synchronisation through pipes and waitid, never
 * sleeps.  Tests that change process-wide signal state run in a forked child.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../pylock_proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int passed, failed;
static int pidfd_ok; /* pidfd_open works here (not an old kernel or seccomp) */

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (cond) {                                                         \
            passed++;                                                       \
        } else {                                                            \
            failed++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                   \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A child that blocks until its end of the pipe closes or it is killed. */
static pid_t spawn_sleeper(int *release_fd)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        abort();
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(p[1]);
        while (read(p[0], &c, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    close(p[0]);
    *release_fd = p[1];
    return pid;
}

/* A child that exits with code at once. */
static pid_t spawn_exit(int code)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(code);
    return pid;
}

/* Block until child pid has exited, without reaping it: it is a zombie after. */
static void wait_zombie(pid_t pid)
{
    siginfo_t si;
    while (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT) != 0 && errno == EINTR)
        ;
}

static int reap(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return status;
}

static uint64_t stat_starttime(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long long st = 0;
    /* fields 3..21 skipped, 22 read */
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                      "%*d %llu",
               &st) != 1)
        return 0;
    return st;
}

static int kernel_at_least(int major, int minor)
{
    struct utsname u;
    int ma = 0, mi = 0;
    if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &ma, &mi) != 2)
        return 0;
    return ma > major || (ma == major && mi >= minor);
}

static int pidfs_here(void)
{
    int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    struct statfs s;
    int yes = fd >= 0 && fstatfs(fd, &s) == 0 && (unsigned long)s.f_type == 0x50494446UL;
    if (fd >= 0)
        close(fd);
    return yes;
}

static int readable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    do {
        r = poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    return r > 0 && (p.revents & POLLIN);
}

/* Runs fn in a forked child (fresh signal state to change); the child's exit
 * code is its number of failures. */
static void in_child(void (*fn)(void))
{
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        passed = failed = 0;
        fn();
        _exit(failed > 120 ? 120 : failed);
    }
    int status = reap(pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ------------------------------------------------------------------ */

static void test_identity_of_self(void)
{
    pl_identity id;
    CHECK(pl_identity_of(getpid(), &id) == 0);
    CHECK(id.pid == getpid());
    CHECK(id.start_time == stat_starttime(getpid()));
    CHECK(id.start_time > 0);

    char boot[64] = {0};
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    CHECK(f != NULL);
    if (f != NULL) {
        CHECK(fgets(boot, sizeof boot, f) != NULL);
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = 0;
    CHECK(strlen(boot) == 36);
    CHECK(strcmp(id.boot_id, boot) == 0);

    if (pidfs_here()) {
        int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
        struct stat st;
        CHECK(fd >= 0 && fstat(fd, &st) == 0);
        CHECK(id.pidfs_ino == (uint64_t)st.st_ino && id.pidfs_ino != 0);
        close(fd);
    } else {
        CHECK(id.pidfs_ino == 0);
    }
}

/* comm may hold spaces and parentheses: fields count after the LAST ')'. */
static void test_identity_strange_comm(void)
{
    int sync[2], rel;
    CHECK(pipe2(sync, O_CLOEXEC) == 0);
    int p[2];
    CHECK(pipe2(p, O_CLOEXEC) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        prctl(PR_SET_NAME, "x) 1 2 (y) Z 9", 0, 0, 0);
        close(sync[0]);
        CHECK(write(sync[1], "r", 1) == 1);
        close(p[1]);
        while (read(p[0], &c, 1) < 0 && errno == EINTR)
            ;
        _exit(0);
    }
    close(p[0]);
    rel = p[1];
    close(sync[1]);
    char c;
    CHECK(read(sync[0], &c, 1) == 1);
    close(sync[0]);

    pl_identity id;
    CHECK(pl_identity_of(pid, &id) == 0);
    CHECK(id.start_time == stat_starttime(pid));
    char comm[64] = {0}, path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        CHECK(fgets(comm, sizeof comm, f) != NULL);
        fclose(f);
    }
    CHECK(strncmp(comm, "x) 1 2 (y) Z 9", 14) == 0);
    close(rel);
    reap(pid);
}

static void test_identity_errors(void)
{
    pl_identity id;
    pl_handle h;
    CHECK(pl_identity_of(0, &id) == EINVAL);
    CHECK(pl_identity_of(-4, &id) == EINVAL);
    CHECK(pl_identity_of((int64_t)INT_MAX + 1, &id) == EINVAL);
    CHECK(pl_proc_open(0, &h) == EINVAL);
    CHECK(pl_proc_open(-1, &h) == EINVAL);
    CHECK(pl_proc_open((int64_t)INT_MAX + 1, &h) == EINVAL);
    CHECK(pl_child_poll(0, &(int){0}, &(int){0}) == EINVAL);

    /* A process that has been reaped. */
    pid_t pid = spawn_exit(0);
    reap(pid);
    CHECK(pl_identity_of(pid, &id) == ESRCH);
    if (pidfd_ok)
        CHECK(pl_proc_open(pid, &h) == ESRCH);
}

static void *thread_tid(void *arg)
{
    int *fds = arg;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    char c;
    CHECK(write(fds[1], &tid, sizeof tid) == sizeof tid);
    CHECK(read(fds[2], &c, 1) == 1);
    return NULL;
}

/* A thread id is not a process: /proc/<tid> exists, pidfd_open refuses. */
static void test_thread_id_is_not_a_process(void)
{
    int a[2], b[2];
    CHECK(pipe(a) == 0 && pipe(b) == 0);
    int fds[3] = {a[0], a[1], b[0]};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, thread_tid, fds) == 0);
    pid_t tid = 0;
    CHECK(read(a[0], &tid, sizeof tid) == sizeof tid);
    CHECK(tid != getpid());
    pl_identity id;
    pl_handle h;
    CHECK(pl_identity_of(tid, &id) == ESRCH);
    if (pidfd_ok)
        CHECK(pl_proc_open(tid, &h) == ESRCH);
    CHECK(write(b[1], "x", 1) == 1);
    pthread_join(t, NULL);
    close(a[0]);
    close(a[1]);
    close(b[0]);
    close(b[1]);
}

/* A zombie has exited: no live identity, the pidfd reads exited, the status
 * is readable without reaping, and after the reap the pin says ESRCH. */
static void test_zombie_child(void)
{
    int rel;
    pid_t pid = spawn_sleeper(&rel);
    pl_identity before, id;
    pl_handle h;
    int exited = -1, code = -100;

    CHECK(pl_identity_of(pid, &before) == 0);
    CHECK(pl_proc_open(pid, &h) == 0);
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 0);
    CHECK(pl_proc_returncode(h, pid, &code) == EAGAIN);
    CHECK(pl_child_poll(pid, &exited, &code) == 0 && exited == 0);

    CHECK(pl_proc_identity(h, pid, &id) == 0);
    CHECK(id.start_time == before.start_time && id.pidfs_ino == before.pidfs_ino);
    CHECK(strcmp(id.boot_id, before.boot_id) == 0);

    close(rel); /* the sleeper exits with 0 */
    wait_zombie(pid);
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 1);
    CHECK(pl_identity_of(pid, &id) == ESRCH);
    CHECK(pl_proc_identity(h, pid, &id) == 0 && id.start_time == before.start_time);
    code = -100;
    CHECK(pl_proc_returncode(h, pid, &code) == 0 && code == 0);
    code = -100;
    CHECK(pl_child_poll(pid, &exited, &code) == 0 && exited == 1 && code == 0);
    /* Nothing above reaped it. */
    int status = reap(pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    CHECK(pl_proc_identity(h, pid, &id) == ESRCH);
    CHECK(pl_child_poll(pid, &exited, &code) == ECHILD);
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 1);
    CHECK(pl_proc_close(h) == 0);
}

static void test_returncodes(void)
{
    pl_handle h;
    int code = -100;

    pid_t pid = spawn_exit(42);
    CHECK(pl_proc_open(pid, &h) == 0);
    wait_zombie(pid);
    CHECK(pl_proc_returncode(h, pid, &code) == 0 && code == 42);
    int status = reap(pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42);
    /* Reaped: only PIDFD_INFO_EXIT (6.15+) still knows. */
    code = -100;
    int rc = pl_proc_returncode(h, pid, &code);
    if (kernel_at_least(6, 15))
        CHECK(rc == 0 && code == 42);
    else
        CHECK(rc == ENODATA);
    pl_proc_close(h);

    int rel;
    pid = spawn_sleeper(&rel);
    CHECK(pl_proc_open(pid, &h) == 0);
    kill(pid, SIGKILL);
    wait_zombie(pid);
    CHECK(pl_proc_returncode(h, pid, &code) == 0 && code == -SIGKILL);
    status = reap(pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (kernel_at_least(6, 15))
        CHECK(pl_proc_returncode(h, pid, &code) == 0 && code == -SIGKILL);
    pl_proc_close(h);
    close(rel);
}

/* A process that is not our child: the status is unknown until its parent
 * reaps it, then known on 6.15+. */
static void test_returncode_of_non_child(void)
{
    int up[2], down[2];
    CHECK(pipe2(up, O_CLOEXEC) == 0 && pipe2(down, O_CLOEXEC) == 0);
    pid_t mid = fork();
    if (mid == 0) {
        pid_t grandchild = spawn_exit(7);
        char c;
        CHECK(write(up[1], &grandchild, sizeof grandchild) == sizeof grandchild);
        CHECK(read(down[0], &c, 1) == 1); /* pinned by the test */
        wait_zombie(grandchild);
        CHECK(write(up[1], "z", 1) == 1);
        CHECK(read(down[0], &c, 1) == 1); /* now reap it */
        reap(grandchild);
        CHECK(write(up[1], "r", 1) == 1);
        CHECK(read(down[0], &c, 1) == 1);
        _exit(0);
    }
    pid_t gc = 0;
    char c;
    pl_handle h;
    int code = -100, exited = 0;
    CHECK(read(up[0], &gc, sizeof gc) == sizeof gc);
    int rc = pl_proc_open(gc, &h);
    /* The grandchild may already be a zombie; it cannot be reaped yet. */
    CHECK(rc == 0);
    CHECK(write(down[1], "p", 1) == 1);
    CHECK(read(up[0], &c, 1) == 1 && c == 'z');
    CHECK(pl_proc_poll(h, &exited) == 0 && exited == 1);
    CHECK(pl_proc_returncode(h, gc, &code) == ENODATA);
    CHECK(pl_child_poll(gc, &exited, &code) == ECHILD);
    CHECK(write(down[1], "r", 1) == 1);
    CHECK(read(up[0], &c, 1) == 1 && c == 'r');
    rc = pl_proc_returncode(h, gc, &code);
    if (kernel_at_least(6, 15))
        CHECK(rc == 0 && code == 7);
    else
        CHECK(rc == ENODATA);
    CHECK(write(down[1], "e", 1) == 1);
    reap(mid);
    pl_proc_close(h);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
}

struct killer {
    pid_t pid;
    int delay_ms;
};

static void *kill_later(void *arg)
{
    struct killer *k = arg;
    struct timespec ts = {0, (long)k->delay_ms * 1000000L};
    nanosleep(&ts, NULL); /* the thing under test is a blocked wait: let it block */
    kill(k->pid, SIGKILL);
    return NULL;
}

struct canceller {
    pl_waiter *w;
    int delay_ms;
};

static void *cancel_later(void *arg)
{
    struct canceller *c = arg;
    struct timespec ts = {0, (long)c->delay_ms * 1000000L};
    nanosleep(&ts, NULL);
    pl_waiter_cancel(c->w);
    return NULL;
}

static void test_wait(void)
{
    int rel;
    pid_t pid = spawn_sleeper(&rel);
    pl_handle h;
    CHECK(pl_proc_open(pid, &h) == 0);

    /* Timeout, with and without a waiter. */
    double t0 = now_s();
    CHECK(pl_proc_wait(h, 50 * 1000000LL, NULL) == ETIMEDOUT);
    CHECK(now_s() - t0 >= 0.045);
    pl_waiter *w = pl_waiter_new();
    CHECK(w != NULL);
    t0 = now_s();
    CHECK(pl_proc_wait(h, 30 * 1000000LL, w) == ETIMEDOUT);
    CHECK(now_s() - t0 >= 0.025);
    CHECK(pl_proc_wait(h, 0, w) == ETIMEDOUT);
    pl_waiter_free(w);

    /* Cancellation from another thread. */
    w = pl_waiter_new();
    struct canceller c = {w, 30};
    pthread_t t;
    CHECK(pthread_create(&t, NULL, cancel_later, &c) == 0);
    CHECK(pl_proc_wait(h, -1, w) == ECANCELED);
    pthread_join(t, NULL);
    CHECK(pl_proc_wait(h, -1, w) == ECANCELED); /* stays cancelled */
    pl_waiter_free(w);

    /* The exit wakes a blocked wait. */
    w = pl_waiter_new();
    struct killer k = {pid, 20};
    CHECK(pthread_create(&t, NULL, kill_later, &k) == 0);
    CHECK(pl_proc_wait(h, 10 * 1000000000LL, w) == 0);
    pthread_join(t, NULL);
    CHECK(pl_proc_wait(h, -1, w) == 0); /* exited stays exited */
    CHECK(pl_proc_wait(h, 0, NULL) == 0);
    pl_waiter_free(w);

    int64_t fd = -1;
    CHECK(pl_proc_event_fd(h, &fd) == 0 && fd == h);
    CHECK(readable((int)fd, 0));
    reap(pid);
    CHECK(pl_proc_close(h) == 0);
    close(rel);
    int exited;
    CHECK(pl_proc_poll(h, &exited) != 0); /* closed handle */
}

/* Without pidfd (old kernel, seccomp): pinning says so, identities still work. */
static void test_without_pidfd(void)
{
    pl_handle h;
    int rc = pl_proc_open(getpid(), &h);
    CHECK(rc == ENOSYS || rc == EPERM || rc == EACCES);
    pl_identity id;
    CHECK(pl_identity_of(getpid(), &id) == 0);
    CHECK(id.pidfs_ino == 0 && id.start_time == stat_starttime(getpid()));
    int rel;
    pid_t pid = spawn_sleeper(&rel);
    CHECK(pl_identity_of(pid, &id) == 0 && id.pid == pid);
    close(rel);
    wait_zombie(pid);
    CHECK(pl_identity_of(pid, &id) == ESRCH); /* a zombie has exited */
    int exited = 0, code = -1;
    CHECK(pl_child_poll(pid, &exited, &code) == 0 && exited == 1 && code == 0);
    reap(pid);
}

static void test_child_poll_not_ours(void)
{
    int exited = -1, code = 0;
    CHECK(pl_child_poll(1, &exited, &code) == ECHILD);
    CHECK(pl_child_poll(getpid(), &exited, &code) == ECHILD);
}

/* ---- SIGCHLD (each in a forked child: it changes process-wide state) ---- */

static volatile sig_atomic_t prev_calls;
static volatile sig_atomic_t prev_info_calls;

static void prev_handler(int sig)
{
    (void)sig;
    prev_calls++;
    errno = EPIPE; /* pylock's handler must restore errno after chaining */
}

static void prev_info_handler(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    if (si != NULL && si->si_signo == SIGCHLD)
        prev_info_calls++;
}

static int fd_kind_is(int fd, const char *prefix)
{
    char path[64], target[128] = {0};
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    return n > 0 && strncmp(target, prefix, strlen(prefix)) == 0;
}

static int sa_flags_now(void)
{
    struct sigaction cur;
    if (sigaction(SIGCHLD, NULL, &cur) != 0)
        abort();
    return cur.sa_flags;
}

static void sigchld_pipe_chains(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = prev_handler;
    sa.sa_flags = SA_ONSTACK; /* what Python's signal.signal installs */
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    CHECK(sigaction(SIGCHLD, &sa, NULL) == 0);

    int64_t fd = -1, again = -1;
    int heard = -1;
    CHECK(pl_sigchld_open(&fd, &heard) == 0 && heard == 1);
    CHECK(fd >= 0 && fd_kind_is((int)fd, "pipe:"));
    CHECK(pl_sigchld_open(&again, &heard) == 0 && again == fd && heard == 1);
    CHECK(!readable((int)fd, 0));

    /* The program's handler keeps its semantics: no SA_RESTART added (its
     * blocking syscalls are still interrupted), same mask and flags. */
    struct sigaction cur;
    CHECK(sigaction(SIGCHLD, NULL, &cur) == 0);
    CHECK(cur.sa_flags & SA_SIGINFO);
    CHECK(!(cur.sa_flags & SA_RESTART));
    CHECK(cur.sa_flags & SA_ONSTACK);
    CHECK(!(cur.sa_flags & SA_NOCLDSTOP));
    CHECK(sigismember(&cur.sa_mask, SIGUSR2));

    pid_t pid = spawn_exit(5);
    CHECK(readable((int)fd, 5000));
    wait_zombie(pid);
    CHECK(prev_calls >= 1);
    CHECK(pl_sigchld_drain(fd) == 0);
    CHECK(!readable((int)fd, 0));
    int exited = 0, code = 0;
    CHECK(pl_child_poll(pid, &exited, &code) == 0 && exited == 1 && code == 5);
    CHECK(WEXITSTATUS(reap(pid)) == 5);

    /* errno survives the handler even though the chained one clobbers it. */
    errno = 0;
    pid = spawn_exit(0);
    wait_zombie(pid);
    CHECK(errno == 0);
    reap(pid);
    pl_sigchld_drain(fd);

    /* Someone replaces the handler: pylock does not go in front of it
     * again (it might chain back), and says it is no longer heard. */
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = prev_info_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGCHLD, &sa, NULL) == 0);
    CHECK(pl_sigchld_open(&again, &heard) == 0 && again == fd && heard == 0);
    CHECK(sigaction(SIGCHLD, NULL, &cur) == 0 && cur.sa_sigaction == prev_info_handler);
    pid = spawn_exit(1);
    wait_zombie(pid);
    CHECK(prev_info_calls >= 1);
    reap(pid);

    /* Back to SIG_DFL: pylock takes it again, restarting syscalls as SIG_DFL
     * never interrupted them. */
    signal(SIGCHLD, SIG_DFL);
    CHECK(pl_sigchld_open(&again, &heard) == 0 && again == fd && heard == 1);
    CHECK((sa_flags_now() & (SA_RESTART | SA_NOCLDSTOP)) == (SA_RESTART | SA_NOCLDSTOP));
    pid = spawn_exit(1);
    CHECK(readable((int)fd, 5000));
    reap(pid);
    CHECK(pl_sigchld_drain(fd) == 0);

    /* A forked child gets its own pipe under the same number. */
    struct stat mine;
    CHECK(fstat((int)fd, &mine) == 0);
    pid_t kid = fork();
    if (kid == 0) {
        struct stat theirs;
        int ok = fstat((int)fd, &theirs) == 0 && theirs.st_ino != mine.st_ino;
        pid_t g = spawn_exit(0);
        ok = ok && readable((int)fd, 5000);
        reap(g);
        _exit(ok ? 0 : 1);
    }
    int status = reap(kid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    /* The child's grandchild woke only the child: our SIGCHLD is the kid's. */
    CHECK(readable((int)fd, 5000));
    pl_sigchld_drain(fd);
}

/* A handler that puts itself in front of whatever is installed, again and
 * again, chaining to it: with pylock in front of it too, each calls the
 * other.  pylock's handler must stop the loop (it used to overflow the
 * stack). */
static struct sigaction relinker_prev;
static volatile sig_atomic_t relinker_calls;

static void relinker(int sig, siginfo_t *si, void *uc)
{
    relinker_calls++;
    if (relinker_calls > 100000)
        abort(); /* a loop pylock did not stop */
    if (relinker_prev.sa_flags & SA_SIGINFO)
        relinker_prev.sa_sigaction(sig, si, uc);
    else if (relinker_prev.sa_handler != SIG_DFL && relinker_prev.sa_handler != SIG_IGN)
        relinker_prev.sa_handler(sig);
}

static void relink(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = relinker;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(SIGCHLD, &sa, &relinker_prev) == 0);
}

static void sigchld_chain_that_comes_back(void)
{
    int64_t fd = -1;
    int heard = -1;
    relink();                                        /* relinker -> SIG_DFL */
    CHECK(pl_sigchld_open(&fd, &heard) == 0);        /* pylock -> relinker */
    relink();                                        /* relinker -> pylock -> relinker */
    pid_t pid = spawn_exit(7);
    CHECK(readable((int)fd, 5000));
    wait_zombie(pid);
    CHECK(relinker_calls >= 1 && relinker_calls <= 4);
    int exited = 0, code = 0;
    CHECK(pl_child_poll(pid, &exited, &code) == 0 && exited == 1 && code == 7);
    reap(pid);
}

static void sigchld_ignored(void)
{
    int64_t fd = -1;
    int heard = -1;
    signal(SIGCHLD, SIG_IGN);
    CHECK(pl_sigchld_open(&fd, &heard) == ECHILD);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sa.sa_flags = SA_NOCLDWAIT;
    CHECK(sigaction(SIGCHLD, &sa, NULL) == 0);
    CHECK(pl_sigchld_open(&fd, &heard) == ECHILD);
}

/* The program blocks SIGCHLD everywhere and takes it itself: pylock never
 * consumes one, and says nothing will wake its pipe. */
static void sigchld_blocked_everywhere(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    CHECK(pthread_sigmask(SIG_BLOCK, &set, NULL) == 0);
    int64_t fd = -1;
    int heard = -1;
    CHECK(pl_sigchld_open(&fd, &heard) == 0 && heard == 0);
    CHECK(fd_kind_is((int)fd, "pipe:"));
    for (int i = 0; i < 20; i++) {
        pid_t pid = spawn_exit(3);
        siginfo_t si;
        struct timespec ts = {5, 0};
        CHECK(sigtimedwait(&set, &si, &ts) == SIGCHLD && si.si_pid == pid);
        CHECK(pl_sigchld_open(&fd, &heard) == 0 && heard == 0);
        int exited = 0, code = 0;
        wait_zombie(pid);
        CHECK(pl_child_poll(pid, &exited, &code) == 0 && exited == 1 && code == 3);
        reap(pid);
    }
    CHECK(!readable((int)fd, 0));
}

static void *idle_thread(void *arg)
{
    int *fds = arg;
    char c;
    /* Running: its signal mask is its own now (a sanitizer runtime may
     * create threads with every signal blocked until they start). */
    CHECK(write(fds[1], "s", 1) == 1);
    while (read(fds[0], &c, 1) < 0 && errno == EINTR)
        ;
    return NULL;
}

/* Blocked here but not in another thread: that thread runs pylock's
 * handler, so the pipe wakes. */
static void sigchld_blocked_in_one_thread(void)
{
    int p[2], started[2];
    CHECK(pipe(p) == 0 && pipe(started) == 0);
    int fds[2] = {p[0], started[1]};
    pthread_t t;
    char c;
    CHECK(pthread_create(&t, NULL, idle_thread, fds) == 0);
    CHECK(read(started[0], &c, 1) == 1);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    CHECK(pthread_sigmask(SIG_BLOCK, &set, NULL) == 0);
    int64_t fd = -1;
    int heard = -1;
    CHECK(pl_sigchld_open(&fd, &heard) == 0 && heard == 1);
    CHECK(fd_kind_is((int)fd, "pipe:"));
    pid_t pid = spawn_exit(0);
    CHECK(readable((int)fd, 5000));
    reap(pid);
    CHECK(write(p[1], "x", 1) == 1);
    pthread_join(t, NULL);
    close(p[0]);
    close(p[1]);
    close(started[0]);
    close(started[1]);
}

int main(void)
{
    pl_handle probe;
    pidfd_ok = pl_proc_open(getpid(), &probe) == 0;
    if (pidfd_ok)
        pl_proc_close(probe);
    test_identity_of_self();
    test_identity_strange_comm();
    test_identity_errors();
    test_thread_id_is_not_a_process();
    if (pidfd_ok) {
        test_zombie_child();
        test_returncodes();
        test_returncode_of_non_child();
        test_wait();
    } else {
        test_without_pidfd();
    }
    test_child_poll_not_ours();
    in_child(sigchld_pipe_chains);
    in_child(sigchld_chain_that_comes_back);
    in_child(sigchld_ignored);
    in_child(sigchld_blocked_everywhere);
    in_child(sigchld_blocked_in_one_thread);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
