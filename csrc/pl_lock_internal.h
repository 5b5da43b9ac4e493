/*
 * Between pylock's lock-file sources (claim.c, holds.c, lock_posix.c); not
 * part of the API in pylock.h.
 */
#ifndef PYLOCK_LOCK_INTERNAL_H
#define PYLOCK_LOCK_INTERNAL_H

#include "pylock.h"

/* Whether path (not followed; relative to dir, or to the working directory
 * when dir < 0) names the file st describes; *size gets the file's size
 * from the same lookup.  POSIX only. */
int pl__same_file_at(pl_handle dir, const char *path, const pl_file_info *st, uint64_t *size);

/* Whether name is one path component (pl_open_at, pl_unix_at). */
int pl__is_name(const char *name);

/* CLOCK_MONOTONIC (the performance counter on Windows) in ns. */
int64_t pl__monotonic_ns(void);

#endif
