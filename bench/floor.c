/*
 * The floor pylock is measured against, and the cheap sleepers the
 * death-notification benchmark watches.  Compiled by bench/run.py with the
 * system cc at run time.
 *
 *   floor uncontended PATH RECORD_FILE ITERATIONS
 *       On one already-open descriptor: flock(LOCK_EX), pwrite of the record
 *       (the same bytes pylock writes) at offset 0, flock(LOCK_UN).  Prints
 *       the duration of each acquire+release in nanoseconds, one per line, so
 *       the C loop is timed the same way as the Python ones (per operation,
 *       CLOCK_MONOTONIC), not as a batch average.
 *
 *   floor uncontended-safe PATH RECORD_FILE ITERATIONS
 *       The rename-safe floor: the same, plus what any lock that keeps a
 *       descriptor open must do so that waiters never split when the file
 *       or its directory is renamed or unlinked: after flock, one statx of
 *       the path (not following a symlink, asking only for the inode and
 *       link count, as pylock does) compared with the descriptor's device
 *       and inode from the open.
 *
 *   floor spawner
 *       Reads commands on stdin.  "spawn N" forks N sleepers and prints their
 *       pids on one line.  Sleepers die with the spawner (PR_SET_PDEATHSIG),
 *       each sleeper is its own small program (fork + exec), and the spawner
 *       reaps each one as soon as it exits so a watcher that
 *       needs the pid to disappear (psutil) is not held back by a zombie.  On
 *       end of input every sleeper still alive is killed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int die(const char *what)
{
    fprintf(stderr, "floor: %s: %s\n", what, strerror(errno));
    return 1;
}

/* Device and inode of what path names now (a symlink itself, not its
 * target): pylock's check that the locked file is still at its path. */
static int still_at_path(const char *path, dev_t dev, ino_t ino)
{
#ifdef STATX_INO
    struct statx sx;
    if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_INO | STATX_NLINK | STATX_SIZE, &sx) != 0)
        return 0;
    return makedev(sx.stx_dev_major, sx.stx_dev_minor) == dev && sx.stx_ino == ino;
#else
    struct stat st;
    return lstat(path, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
#endif
}

static int uncontended(const char *path, const char *record_path, long iterations, int safe)
{
    char record[65536];
    int rfd = open(record_path, O_RDONLY | O_CLOEXEC);
    if (rfd < 0)
        return die(record_path);
    ssize_t rlen = read(rfd, record, sizeof record);
    if (rlen < 0)
        return die("read record");
    close(rfd);

    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return die(path);
    struct stat opened;
    if (fstat(fd, &opened) != 0)
        return die("fstat");

    int64_t *samples = malloc(sizeof *samples * (size_t)iterations);
    if (samples == NULL)
        return die("malloc");
    for (long i = 0; i < iterations; i++) {
        int64_t t0 = now_ns();
        if (flock(fd, LOCK_EX) != 0)
            return die("flock");
        if (safe && !still_at_path(path, opened.st_dev, opened.st_ino)) {
            errno = ESTALE;
            return die("the lock file left its path");
        }
        if (pwrite(fd, record, (size_t)rlen, 0) != rlen)
            return die("pwrite");
        if (flock(fd, LOCK_UN) != 0)
            return die("unlock");
        samples[i] = now_ns() - t0;
    }
    close(fd);
    for (long i = 0; i < iterations; i++)
        printf("%lld\n", (long long)samples[i]);
    free(samples);
    return fflush(stdout) == 0 ? 0 : 1;
}

static pid_t *children;
static size_t n_children, cap_children;

/* SIGCHLD is blocked whenever the main loop touches children[], so the
 * handler sees a consistent array.  A reaped pid is zeroed: it may be
 * recycled by an unrelated process and must never be signalled later. */
static void reap(int sig)
{
    (void)sig;
    int saved = errno;
    pid_t pid;
    while ((pid = waitpid(-1, NULL, WNOHANG)) > 0)
        for (size_t i = 0; i < n_children; i++)
            if (children[i] == pid) {
                children[i] = 0;
                break;
            }
    errno = saved;
}

static int spawner(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = reap;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGCHLD, &sa, NULL) != 0)
        return die("sigaction");
    pid_t self = getpid();
    char self_exe[4096];
    ssize_t len = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (len < 0)
        return die("readlink /proc/self/exe");
    self_exe[len] = '\0';
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);

    char line[128];
    while (fgets(line, sizeof line, stdin) != NULL) {
        sigprocmask(SIG_BLOCK, &chld, NULL);
        long n;
        if (sscanf(line, "spawn %ld", &n) != 1 || n < 1) {
            fprintf(stderr, "floor spawner: bad command: %s", line);
            return 2;
        }
        if (n_children + (size_t)n > cap_children) {
            cap_children = (n_children + (size_t)n) * 2;
            children = realloc(children, cap_children * sizeof *children);
            if (children == NULL)
                return die("realloc");
        }
        for (long i = 0; i < n; i++) {
            pid_t pid = fork();
            if (pid < 0)
                return die("fork");
            if (pid == 0) {
                signal(SIGCHLD, SIG_DFL);
                sigprocmask(SIG_UNBLOCK, &chld, NULL);
                prctl(PR_SET_PDEATHSIG, SIGKILL);
                if (getppid() != self)
                    _exit(0);
                /* A fresh address space: sleepers that merely forked would
                 * share the spawner's anonymous pages 10,000 ways, and an
                 * exit would then wait for a memory monitor's rmap walks
                 * over all those mappings (milliseconds under DAMON's
                 * pageout), which is not what a watcher of real processes
                 * sees.  run.py links floor statically for the same reason:
                 * libc's pages would be shared 10,000 ways otherwise. */
                execl(self_exe, "floor-sleeper", "sleep", (char *)NULL);
                _exit(127);
            }
            children[n_children++] = pid;
            printf(i ? " %d" : "%d", (int)pid);
        }
        printf("\n");
        fflush(stdout);
        sigprocmask(SIG_UNBLOCK, &chld, NULL);
    }
    sigprocmask(SIG_BLOCK, &chld, NULL);
    for (size_t i = 0; i < n_children; i++)
        if (children[i] > 0)
            kill(children[i], SIGKILL);
    signal(SIGCHLD, SIG_DFL);
    while (wait(NULL) > 0 || errno == EINTR)
        ;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "uncontended") == 0)
        return uncontended(argv[2], argv[3], atol(argv[4]), 0);
    if (argc == 5 && strcmp(argv[1], "uncontended-safe") == 0)
        return uncontended(argv[2], argv[3], atol(argv[4]), 1);
    if (argc == 2 && strcmp(argv[1], "spawner") == 0)
        return spawner();
    if (argc == 2 && strcmp(argv[1], "sleep") == 0)
        for (;;)
            pause();
    fprintf(stderr,
            "usage: floor uncontended PATH RECORD_FILE ITERATIONS\n"
            "       floor uncontended-safe PATH RECORD_FILE ITERATIONS\n"
            "       floor spawner\n");
    return 2;
}
