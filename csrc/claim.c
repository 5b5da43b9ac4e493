/*
 * pylock's C core, every platform: the acquisition fast path.  Taking an
 * uncontended lock is one call from Python: lock, check the file is still
 * linked, write the holder record.  Built on the platform files' own
 * pl_try_lock / pl_file_stat / pl_write_record / pl_unlock.
 */
#include "pylock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>
#else
#include <sys/stat.h>
#include <time.h>
#endif

/* Continues zlib's crc32 (Python's zlib.crc32(data, crc)).  Bitwise: it
 * only ever runs over the ~20 bytes of the timestamp, the head's CRC comes
 * precomputed from Python. */
static uint32_t crc32_update(uint32_t crc, const char *data, size_t len)
{
    crc = ~crc;
    for (size_t i = 0; i < len; i++) {
        crc ^= (unsigned char)data[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

/* Microseconds since the Unix epoch, UTC. */
static uint64_t now_us(void)
{
#if defined(_WIN32)
    FILETIME ft;
    GetSystemTimePreciseAsFileTime(&ft);
    uint64_t t = ((uint64_t)ft.dwHighDateTime << 32) | ft.dwLowDateTime;
    return (t - 116444736000000000ULL) / 10; /* 100 ns ticks since 1601 */
#else
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
#endif
}

/* "<seconds>.<6 digits>}" into out; returns its length. */
static size_t format_stamp(char *out, uint64_t us)
{
    char digits[24];
    size_t n = 0, len = 0;
    uint64_t secs = us / 1000000u, frac = us % 1000000u;
    do {
        digits[n++] = (char)('0' + secs % 10);
        secs /= 10;
    } while (secs);
    while (n)
        out[len++] = digits[--n];
    out[len++] = '.';
    for (int i = 5; i >= 0; i--) {
        out[len + (size_t)i] = (char)('0' + frac % 10);
        frac /= 10;
    }
    len += 6;
    out[len++] = '}';
    return len;
}

static int write_record(pl_handle h, const char *head, size_t head_len, uint32_t head_crc)
{
    char stamp[32], header[64], small[1024];
    size_t stamp_len = format_stamp(stamp, now_us());
    size_t payload_len = head_len + stamp_len;
    uint32_t crc = crc32_update(head_crc, stamp, stamp_len);
    int header_len = snprintf(header, sizeof header, "pylock-record v1 %zu %08x\n",
                              payload_len, (unsigned)crc);
    size_t total = (size_t)header_len + payload_len;
    char *buf = total <= sizeof small ? small : malloc(total);
    int rc;
    if (buf == NULL)
        return 12; /* ENOMEM */
    memcpy(buf, header, (size_t)header_len);
    memcpy(buf + header_len, head, head_len);
    memcpy(buf + (size_t)header_len + head_len, stamp, stamp_len);
    rc = pl_write_record(h, buf, total);
    if (buf != small)
        free(buf);
    return rc;
}

/* Whether lf->path still names the locked file: a descriptor kept open
 * between acquisitions must not keep locking a file that was renamed away
 * (or whose directory was replaced) while newcomers lock the new one. */
static int still_at_path(const pl_lockfile *lf)
{
#if defined(_WIN32)
    (void)lf;
    return 1;
#else
    struct stat ps;
    if (lf->path == NULL)
        return 1;
    return lstat(lf->path, &ps) == 0 && (uint64_t)ps.st_dev == lf->st.dev &&
           (uint64_t)ps.st_ino == lf->st.ino;
#endif
}

int pl_claim(pl_lockfile *lf)
{
    int rc = pl_file_stat(lf->handle, &lf->st);
    lf->record_error = 0;
    if (rc != 0) {
        pl_unlock(lf->handle);
        return rc;
    }
    if (lf->st.nlink == 0 || !still_at_path(lf)) {
        pl_unlock(lf->handle);
        return PL_E_UNLINKED;
    }
    if (lf->head_len > 0)
        lf->record_error = write_record(lf->handle, lf->head, lf->head_len, lf->head_crc);
    return 0;
}

int pl_acquire(pl_lockfile *lf)
{
    int rc = pl_try_lock(lf->handle, lf->shared);
    if (rc != 0) {
        lf->record_error = 0;
        return rc;
    }
    return pl_claim(lf);
}
