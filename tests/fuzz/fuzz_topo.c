/* Topology cards, as every rank receives the others' in the bootstrap
 * address table: loomi_topo_unpack on each card, and the job picture
 * (loomi_topo_job_build) from the cards that unpack.  A card that
 * unpacks must pack back to itself where it matters: unpack(pack(r))
 * succeeds.
 *
 * Input: up to 8 cards of LOOMI_TOPO_CARD_BYTES; a short tail is padded
 * with zeros. */
#include <stdlib.h>
#include <string.h>

#include "topo/topo.h"
#include "tests/fuzz/fuzz.h"

#define MAX_CARDS 8

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct loomi_topo_rank r[MAX_CARDS];
    int n = 0;
    for (size_t off = 0; off < size && n < MAX_CARDS; off += LOOMI_TOPO_CARD_BYTES) {
        unsigned char card[LOOMI_TOPO_CARD_BYTES] = {0};
        size_t k = size - off < sizeof card ? size - off : sizeof card;
        memcpy(card, data + off, k);
        if (loomi_topo_unpack(card, &r[n]) != LOOM_SUCCESS) return 0;
        unsigned char again[LOOMI_TOPO_CARD_BYTES];
        struct loomi_topo_rank back;
        loomi_topo_pack(&r[n], again);
        if (loomi_topo_unpack(again, &back) != LOOM_SUCCESS) abort();
        n++;
    }
    if (!n) return 0;
    for (int i = 0; i < n; i++) loomi_topo_local_nic(&r[i], i, n);
    struct loomi_topo_job job;
    memset(&job, 0, sizeof job);
    if (loomi_topo_job_build(r, n, &job) == LOOM_SUCCESS) {
        for (int i = 0; i < n; i++) loomi_topo_machine_ranks(&job, i);
        loomi_topo_most_machine_ranks(&job);
        FILE *f = fopen("/dev/null", "w");
        if (f) {
            loomi_topo_print(f, &job);
            fclose(f);
        }
        loomi_topo_job_free(&job);
    }
    return 0;
}

/* Seeds: the cards of this host and of the hwloc fixtures (tests/topo,
 * found through SRCDIR), alone and together. */
int fuzz_seeds(const char *dir)
{
    static const char *const fixtures[] = {"", "dgx_2s8g4n.xml", "cpu_8numa.xml", "h200_vm.xml"};
    const char *src = getenv("SRCDIR");
    unsigned char all[4 * LOOMI_TOPO_CARD_BYTES];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        struct loomi_settings set;
        struct loomi_topo_rank me;
        memset(&set, 0, sizeof set);
        if (i) {
            if (!src) continue;
            snprintf(set.topo_file, sizeof set.topo_file, "%s/tests/topo/%s", src, fixtures[i]);
            snprintf(set.hostname, sizeof set.hostname, "host%d", i);
        }
        if (loomi_topo_discover(&set, 0, &me) != LOOM_SUCCESS) continue;
        unsigned char *card = all + (size_t)n * LOOMI_TOPO_CARD_BYTES;
        loomi_topo_pack(&me, card);
        char name[32];
        snprintf(name, sizeof name, "card-%d", i);
        if (fuzz_write_seed(dir, name, card, LOOMI_TOPO_CARD_BYTES)) return -1;
        n++;
    }
    return n ? fuzz_write_seed(dir, "cards-all", all, (size_t)n * LOOMI_TOPO_CARD_BYTES) : -1;
}
