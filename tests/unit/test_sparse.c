/*
 * test_sparse.c - the sparse collectives' local pieces (comm/sparse.c):
 * one rank's merge of its pairs (the radix sort, duplicates combined
 * with op in input order) against a plain reference, and the switch
 * rule's boundary.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/sparse.h"
#include "loom.h"

static uint64_t st = 12345;
static uint64_t rnd(void)
{
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    return st >> 11;
}

/* Merge n pairs with keys below kmax and check against a quadratic
 * reference: for each distinct index ascending, the values at it folded
 * in input order with op (int64 sum / max, or "keep the first" through
 * float32 min on distinct values). */
static void check_merge(size_t n, uint64_t kmax, loom_op_t op)
{
    uint64_t *idx = malloc(n * sizeof *idx), *oi = malloc(n * sizeof *oi);
    int64_t *val = malloc(n * sizeof *val), *ov = malloc(n * sizeof *ov);
    uint64_t *scr = malloc(4 * n * sizeof *scr + 8);
    cr_assert(idx && oi && val && ov && scr);
    for (size_t i = 0; i < n; i++) {
        idx[i] = rnd() % kmax;
        val[i] = (int64_t)(rnd() % 2001) - 1000;
    }
    size_t k = loomi_sparse_merge(idx, val, n, LOOM_INT64, op, oi, ov, scr);
    cr_assert_leq(k, n);
    for (size_t j = 0; j < k; j++) {
        if (j) cr_assert_lt(oi[j - 1], oi[j], "output not strictly sorted at %zu", j);
        int64_t want = 0;
        int seen = 0;
        for (size_t i = 0; i < n; i++) {
            if (idx[i] != oi[j]) continue;
            if (!seen) want = val[i];
            else if (op == LOOM_SUM) want += val[i];
            else if (op == LOOM_MAX) want = want > val[i] ? want : val[i];
            seen++;
        }
        cr_assert(seen, "index %llu not in the input", (unsigned long long)oi[j]);
        cr_assert_eq(ov[j], want, "index %llu: %lld, want %lld", (unsigned long long)oi[j],
                     (long long)ov[j], (long long)want);
    }
    size_t distinct = 0; /* every input index is in the output */
    for (size_t i = 0; i < n; i++) {
        int dup = 0;
        for (size_t q = 0; q < i && !dup; q++) dup = idx[q] == idx[i];
        distinct += !dup;
    }
    cr_assert_eq(k, distinct);
    free(idx), free(oi), free(val), free(ov), free(scr);
}

Test(sparse, merge_unsorted_with_duplicates)
{
    check_merge(2000, 500, LOOM_SUM);
    check_merge(2000, 500, LOOM_MAX);
    check_merge(3000, (uint64_t)1 << 40, LOOM_SUM); /* five radix passes */
    check_merge(1, 7, LOOM_SUM);
    check_merge(0, 7, LOOM_SUM);
}

Test(sparse, merge_sorted_input_is_copied)
{
    uint64_t idx[5] = {1, 4, 9, 10, 1000000}, oi[5], scr[20];
    float val[5] = {1, 2, 3, 4, 5}, ov[5];
    cr_assert_eq(loomi_sparse_merge(idx, val, 5, LOOM_FLOAT32, LOOM_SUM, oi, ov, scr), 5);
    cr_assert(!memcmp(idx, oi, sizeof idx) && !memcmp(val, ov, sizeof val));
    uint64_t dup[4] = {2, 2, 3, 3};
    float dv[4] = {1, 2, 3, 4};
    cr_assert_eq(loomi_sparse_merge(dup, dv, 4, LOOM_FLOAT32, LOOM_PROD, oi, ov, scr), 2);
    cr_assert(oi[0] == 2 && oi[1] == 3 && ov[0] == 2 && ov[1] == 12);
}

Test(sparse, switch_rule_boundary)
{
    /* allgather, 4 ranks, float32, dense 1200: sparse while
     * 4 * m * 12 <= 2 * 1200 * 4, i.e. m <= 200 */
    uint64_t c[4] = {200, 3, 0, 200};
    cr_assert_eq(loomi_sparse_use_sparse(0, 4, 4, 1200, c, 1), 1);
    c[2] = 201;
    cr_assert_eq(loomi_sparse_use_sparse(0, 4, 4, 1200, c, 1), 0);
    /* reduce-scatter, 2 ranks, block 300: per rank at most
     * 1 * 300 * 4 / 12 = 100 pairs to or from the other rank */
    uint64_t m[4] = {500, 100, 100, 0}; /* row r: rank r's count per block */
    cr_assert_eq(loomi_sparse_use_sparse(1, 2, 4, 600, m, 2), 1);
    m[1] = 101;
    cr_assert_eq(loomi_sparse_use_sparse(1, 2, 4, 600, m, 2), 0);
}
