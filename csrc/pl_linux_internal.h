/*
 * /proc helpers shared by pylock's Linux process files (proc_linux.c,
 * fallback_linux.c).  Not part of the cdef.
 */
#ifndef PYLOCK_LINUX_INTERNAL_H
#define PYLOCK_LINUX_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Reads a small file whole (NUL-terminated): 0 or an errno. */
int pl__read_small(const char *path, char *buf, size_t cap, size_t *len);

/* /proc/<pid>/stat's state (field 3) and start time (field 22): 0, ESRCH
 * when there is no such task, or an errno. */
int pl__read_stat(int64_t pid, uint64_t *starttime, char *state);

/* A zombie or dead task: it has exited. */
int pl__is_dead_state(char state);

#endif
