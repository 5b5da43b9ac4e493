/*
 * pylock's C core on Windows: lock paths as the wide \\?\ paths CreateFileW takes.
 */
#include "pl_win_internal.h"

#ifdef _WIN32

/* ---- paths ------------------------------------------------------------ */

/* Python hands over os.fsencode(path): UTF-8, with lone surrogates (legal
 * in Windows file names) encoded as three bytes ("surrogatepass").
 * MultiByteToWideChar refuses those, so they are decoded here. */
static int wtf8_decode(const char *s, wchar_t *out, size_t *n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t k = 0;
    while (*p) {
        uint32_t c;
        int more;
        if (p[0] < 0x80) {
            c = p[0];
            more = 0;
        } else if ((p[0] & 0xE0) == 0xC0) {
            c = p[0] & 0x1F;
            more = 1;
        } else if ((p[0] & 0xF0) == 0xE0) {
            c = p[0] & 0x0F;
            more = 2;
        } else if ((p[0] & 0xF8) == 0xF0) {
            c = p[0] & 0x07;
            more = 3;
        } else {
            return EILSEQ;
        }
        for (int i = 1; i <= more; i++) {
            if ((p[i] & 0xC0) != 0x80)
                return EILSEQ;
            c = (c << 6) | (p[i] & 0x3F);
        }
        if ((more == 1 && c < 0x80) || (more == 2 && c < 0x800) ||
            (more == 3 && (c < 0x10000 || c > 0x10FFFF)))
            return EILSEQ; /* overlong or out of range */
        if (c >= 0x10000) {
            if (out) {
                out[k] = (wchar_t)(0xD800 + ((c - 0x10000) >> 10));
                out[k + 1] = (wchar_t)(0xDC00 + ((c - 0x10000) & 0x3FF));
            }
            k += 2;
        } else {
            if (out)
                out[k] = (wchar_t)c;
            k += 1;
        }
        p += more + 1;
    }
    if (out)
        out[k] = 0;
    *n = k;
    return 0;
}

static int has_prefix(const wchar_t *s, const wchar_t *prefix)
{
    return wcsncmp(s, prefix, wcslen(prefix)) == 0;
}

/* prefix + rest into out, which has room for both. */
static void join_path(wchar_t *out, const wchar_t *prefix, const wchar_t *rest)
{
    size_t p = wcslen(prefix), r = wcslen(rest);
    memcpy(out, prefix, p * sizeof(wchar_t));
    memcpy(out + p, rest, (r + 1) * sizeof(wchar_t));
}

int pl_win_wide(const char *path, wchar_t **out, size_t *len)
{
    wchar_t *w;
    size_t n;
    int wn, rc;

    wn = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
    if (wn > 0) {
        w = malloc((size_t)wn * sizeof(wchar_t));
        if (w == NULL)
            return ENOMEM;
        if (MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, w, wn) != wn) {
            rc = pl_win_errno(GetLastError());
            free(w);
            return rc;
        }
        n = (size_t)wn - 1;
    } else {
        if ((rc = wtf8_decode(path, NULL, &n)) != 0)
            return rc;
        w = malloc((n + 1) * sizeof(wchar_t));
        if (w == NULL)
            return ENOMEM;
        wtf8_decode(path, w, &n);
    }
    *out = w;
    *len = n;
    return 0;
}

/* The path as CreateFileW wants it, in a malloc'd buffer.  Paths too long
 * for the classic MAX_PATH limit become absolute "\\?\" paths, so they work
 * whether or not long paths are enabled for the process. */
int pl_win_wide_path(const char *path, wchar_t **out)
{
    wchar_t *w, *full, *res;
    size_t n;
    DWORD len;
    int rc;

    if ((rc = pl_win_wide(path, &w, &n)) != 0)
        return rc;
    if (n == 0) {
        free(w);
        return ENOENT;
    }
    if (n < MAX_PATH - 12 || has_prefix(w, L"\\\\?\\") || has_prefix(w, L"\\\\.\\")) {
        *out = w;
        return 0;
    }
    len = GetFullPathNameW(w, 0, NULL, NULL);
    if (len == 0) {
        rc = pl_win_errno(GetLastError());
        free(w);
        return rc;
    }
    full = malloc((size_t)len * sizeof(wchar_t));
    res = malloc(((size_t)len + 8) * sizeof(wchar_t));
    if (full == NULL || res == NULL) {
        free(w);
        free(full);
        free(res);
        return ENOMEM;
    }
    if (GetFullPathNameW(w, len, full, NULL) == 0) {
        rc = pl_win_errno(GetLastError());
        free(w);
        free(full);
        free(res);
        return rc;
    }
    free(w);
    if (has_prefix(full, L"\\\\?\\") || has_prefix(full, L"\\\\.\\"))
        join_path(res, L"", full);
    else if (has_prefix(full, L"\\\\"))
        join_path(res, L"\\\\?\\UNC\\", full + 2);
    else
        join_path(res, L"\\\\?\\", full);
    free(full);
    *out = res;
    return 0;
}

#endif /* _WIN32 */
