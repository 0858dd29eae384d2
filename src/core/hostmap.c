/* hostmap.c - the rank-to-host map algorithms use. */
#include <stdlib.h>
#include <string.h>

#include "core/hostmap.h"

struct loomi_hostmap *loomi_hostmap_build(int nranks, const int *host_of)
{
    if (nranks <= 0 || !host_of) return NULL;
    size_t n = (size_t)nranks;
    /* One allocation: the struct, then host_of, local_index, host_start, host_ranks. */
    struct loomi_hostmap *m = calloc(1, sizeof *m + (4 * n + 1) * sizeof(int));
    if (!m) return NULL;
    int *ho = (int *)(m + 1), *li = ho + n, *hs = li + n, *hr = hs + n + 1;
    int nh = 0;
    for (int r = 0; r < nranks; r++) {
        int h = -1;
        for (int q = 0; q < r && h < 0; q++)
            if (host_of[q] == host_of[r]) h = ho[q];
        ho[r] = h >= 0 ? h : nh++;
    }
    int *cnt = calloc((size_t)nh + 1, sizeof(int));
    if (!cnt) { free(m); return NULL; }
    for (int r = 0; r < nranks; r++) li[r] = cnt[ho[r]]++;
    hs[0] = 0;
    for (int h = 0; h < nh; h++) hs[h + 1] = hs[h] + cnt[h];
    for (int r = 0; r < nranks; r++) hr[hs[ho[r]] + li[r]] = r;
    free(cnt);
    *m = (struct loomi_hostmap){.nranks = nranks, .nhosts = nh, .host_of = ho,
                                .local_index = li, .host_start = hs, .host_ranks = hr};
    return m;
}
