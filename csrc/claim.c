/*
 * pylock's C core, every platform: the acquisition fast path.  Taking an
 * uncontended lock is one call from Python: lock, check the file is still
 * linked, write the holder record.  Built on the platform files' own
 * pl_try_lock / pl_file_stat / pl_write_record / pl_unlock.
 */
#include "pl_lock_internal.h"
#include "pylock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>
#else
#include <time.h>
#endif

/* zlib's CRC-32 table (polynomial 0xEDB88320). */
static const uint32_t crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu,
    0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u,
    0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u,
    0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
    0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u,
    0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
    0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
    0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u,
    0xcfba9599u, 0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u, 0x01db7106u,
    0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
    0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du,
    0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
    0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
    0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u,
    0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u,
    0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau,
    0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
    0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au,
    0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u,
    0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
    0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu,
    0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u, 0xa1d1937eu,
    0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u,
    0x316e8eefu, 0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u,
    0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
    0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu,
    0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u,
    0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
    0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u,
    0x616bffd3u, 0x166ccf45u, 0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u,
    0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu,
    0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u,
    0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
    0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

/* Continues zlib's crc32 (Python's zlib.crc32(data, crc)); the head's CRC
 * comes precomputed from Python, so this runs over the timestamp only. */
PYLOCK_HOT static uint32_t crc32_update(uint32_t crc, const char *data, size_t len)
{
    crc = ~crc;
    for (size_t i = 0; i < len; i++)
        crc = crc_table[(crc ^ (unsigned char)data[i]) & 0xFFu] ^ (crc >> 8);
    return ~crc;
}

/* Microseconds since the Unix epoch, UTC. */
PYLOCK_HOT static uint64_t now_us(void)
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
PYLOCK_HOT static size_t format_stamp(char *out, uint64_t us)
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

static const char record_magic[] = "pylock-record v1 ";
#define MAGIC_LEN (sizeof record_magic - 1)

/* "pylock-record v1 <len> <crc as 8 hex digits>\n" into out; its length. */
PYLOCK_HOT static size_t format_header(char *out, size_t payload_len, uint32_t crc)
{
    static const char hex[] = "0123456789abcdef";
    char digits[24];
    size_t n = 0, len = MAGIC_LEN;
    memcpy(out, record_magic, len);
    do {
        digits[n++] = (char)('0' + payload_len % 10);
        payload_len /= 10;
    } while (payload_len);
    while (n)
        out[len++] = digits[--n];
    out[len++] = ' ';
    for (int shift = 28; shift >= 0; shift -= 4)
        out[len++] = hex[(crc >> shift) & 0xFu];
    out[len++] = '\n';
    return len;
}

/* Writes the record; *written gets its length. */
PYLOCK_HOT static int write_record(pl_handle h, const char *head, size_t head_len,
                                   uint32_t head_crc, size_t *written)
{
    char stamp[32], header[64], small[1024];
    size_t stamp_len = format_stamp(stamp, now_us());
    size_t payload_len = head_len + stamp_len;
    uint32_t crc = crc32_update(head_crc, stamp, stamp_len);
    size_t header_len = format_header(header, payload_len, crc);
    size_t total = header_len + payload_len;
    char *buf = total <= sizeof small ? small : malloc(total);
    int rc;
    if (buf == NULL)
        return 12; /* ENOMEM */
    memcpy(buf, header, header_len);
    memcpy(buf + header_len, head, head_len);
    memcpy(buf + header_len + head_len, stamp, stamp_len);
    rc = pl_write_record(h, buf, total);
    if (buf != small)
        free(buf);
    *written = total;
    return rc;
}

/* Whether the record may go into this file: it is empty, or starts with a
 * pylock record.  Any other file is someone's data and is never written.
 * Size 0 and the size this lock file's own last record left are answered
 * without a read (the uncontended path); otherwise the first bytes tell. */
PYLOCK_HOT static int record_allowed(const pl_lockfile *lf, uint64_t size)
{
    char first[MAGIC_LEN];
    size_t got = 0;
    if (size == 0 || size == lf->record_size)
        return 1;
    if (size < MAGIC_LEN)
        return 0;
    if (pl_read_record(lf->handle, first, sizeof first, &got) != 0 || got != sizeof first)
        return 0;
    return memcmp(first, record_magic, sizeof first) == 0;
}

/* Whether the locked file is still the file at the path: linked, same
 * device and inode.  A descriptor kept open between acquisitions must not
 * go on locking a file that was unlinked or renamed away (or whose
 * directory was replaced) while newcomers lock the file now at the path.
 * One lookup of the path answers both questions, as a path that names the
 * inode proves it linked; lf->st holds the file's identity from its open.
 * A file opened in a directory (pl_open_at) is looked up by its name in
 * that directory, so renaming the directory or a parent cannot make the
 * check, and so the reopen it asks for, follow a path elsewhere.
 * Windows passes no path (an open lock file cannot be renamed there) and
 * asks the handle, which reports a deleted file as having no links. */
PYLOCK_HOT static int still_at_path(pl_lockfile *lf, uint64_t *size, int *err)
{
    *err = 0;
#if !defined(_WIN32)
    if (lf->name != NULL)
        return pl__same_file_at(lf->dir, lf->name, &lf->st, size);
    if (lf->path != NULL)
        return pl__same_file_at(-1, lf->path, &lf->st, size);
#endif
    *err = pl_file_stat(lf->handle, &lf->st);
    *size = lf->st.size;
    return *err == 0 && lf->st.nlink > 0;
}

PYLOCK_HOT int pl_claim(pl_lockfile *lf)
{
    int err;
    uint64_t size = 0;
    size_t written = 0;
    lf->record_error = 0;
    lf->foreign = 0;
    if (!still_at_path(lf, &size, &err)) {
        pl_unlock(lf->handle);
        return err ? err : PL_E_UNLINKED;
    }
    if (lf->head_len == 0) {
        lf->record_error = lf->no_record_reason;
    } else if (!record_allowed(lf, size)) {
        lf->foreign = 1;
    } else if (lf->no_record_reason) {
        lf->record_error = lf->no_record_reason;
    } else {
        lf->record_error = write_record(lf->handle, lf->head, lf->head_len, lf->head_crc, &written);
        if (lf->record_error == 0)
            lf->record_size = size > written ? size : (uint64_t)written;
    }
    if (lf->holds != NULL)
        lf->held_since = pl__monotonic_ns();
    return -lf->record_error;
}

PYLOCK_HOT int pl_acquire(pl_lockfile *lf, uintptr_t token)
{
    int rc = pl_own(lf, token, 0);
    if (rc != 0)
        return rc;
    if (lf->handle < 0)
        return EBADF;
    rc = pl_try_lock(lf->handle, lf->shared);
    if (rc != 0) {
        lf->record_error = 0;
        return rc;
    }
    return pl_claim(lf);
}

PYLOCK_HOT int pl_lock_wait_claim(pl_lockfile *lf, int64_t timeout_ns, pl_waiter *w,
                                  int *claim_rc)
{
    int rc = pl_lock_wait(lf->handle, lf->shared, timeout_ns, w);
    if (rc == 0)
        *claim_rc = pl_claim(lf);
    return rc;
}
