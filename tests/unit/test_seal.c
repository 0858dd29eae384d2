/* test_seal.c - sealed records (transports/seal.c, LOOM_ENCRYPT): what
 * one end seals the other opens; a changed byte (ciphertext or tag), a
 * replayed, reordered or dropped record, one of another kind and one
 * under the other direction's key all fail to open. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "transports/seal.h"

struct pair {
    struct loomi_seal o_tx, o_rx, a_tx, a_rx; /* opener's and acceptor's ends */
};

static void pair_up(struct pair *p)
{
    unsigned char session[64];
    for (int i = 0; i < 64; i++) session[i] = (unsigned char)(i * 7 + 3);
    memset(p, 0, sizeof *p);
    cr_assert_eq(loomi_seal_setup(&p->o_tx, &p->o_rx, session, 1), 0);
    cr_assert_eq(loomi_seal_setup(&p->a_tx, &p->a_rx, session, 0), 0);
}

static void pair_free(struct pair *p)
{
    loomi_seal_free(&p->o_tx);
    loomi_seal_free(&p->o_rx);
    loomi_seal_free(&p->a_tx);
    loomi_seal_free(&p->a_rx);
}

#define N 1000
static unsigned char msg[3][N], rec[3][N + LOOMI_SEAL_TAG], out[N];

static void seal3(struct loomi_seal *tx)
{
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < N; i++) msg[k][i] = (unsigned char)(i * 31 + k);
        cr_assert_eq(loomi_seal(tx, LOOMI_SEAL_DATA, msg[k], N, rec[k]), 0);
        cr_assert_neq(memcmp(rec[k], msg[k], N), 0, "the record is not the plaintext");
    }
}

Test(seal, both_ways_in_order)
{
    struct pair p;
    pair_up(&p);
    seal3(&p.o_tx);
    for (int k = 0; k < 3; k++) {
        cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_DATA, rec[k], N, out), 0);
        cr_assert_eq(memcmp(out, msg[k], N), 0);
    }
    seal3(&p.a_tx);
    for (int k = 0; k < 3; k++) {
        /* in place, as a receiver may open into the bytes it read */
        cr_assert_eq(loomi_seal_open(&p.o_rx, LOOMI_SEAL_DATA, rec[k], N, rec[k]), 0);
        cr_assert_eq(memcmp(rec[k], msg[k], N), 0);
    }
    /* an empty record (a header-only piece's payload never is one, but a
     * record of 0 bytes still carries a tag) */
    unsigned char t[LOOMI_SEAL_TAG];
    cr_assert_eq(loomi_seal(&p.o_tx, LOOMI_SEAL_HDR, NULL, 0, t), 0);
    cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_HDR, t, 0, out), 0);
    pair_free(&p);
}

Test(seal, changed_byte_fails)
{
    for (int where = 0; where < 3; where++) {
        struct pair p;
        pair_up(&p);
        seal3(&p.o_tx);
        size_t at = where == 0 ? 0 : where == 1 ? N / 2 : N + 3; /* ... the tag */
        rec[0][at] ^= 0x01;
        cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_DATA, rec[0], N, out), -1,
                     "a record changed at byte %zu opened", at);
        pair_free(&p);
    }
}

Test(seal, replay_fails)
{
    struct pair p;
    pair_up(&p);
    seal3(&p.o_tx);
    cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_DATA, rec[0], N, out), 0);
    cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_DATA, rec[0], N, out), -1,
                 "a record opened twice");
    pair_free(&p);
}

Test(seal, reorder_and_drop_fail)
{
    struct pair p;
    pair_up(&p);
    seal3(&p.o_tx);
    cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_DATA, rec[1], N, out), -1,
                 "the second record opened first");
    pair_free(&p);
    pair_up(&p);
    seal3(&p.o_tx);
    cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_DATA, rec[0], N, out), 0);
    cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_DATA, rec[2], N, out), -1,
                 "a record opened after one was dropped");
    pair_free(&p);
}

Test(seal, other_kind_or_direction_fails)
{
    struct pair p;
    pair_up(&p);
    seal3(&p.o_tx);
    cr_assert_eq(loomi_seal_open(&p.a_rx, LOOMI_SEAL_HDR, rec[0], N, out), -1,
                 "a data record opened as a header");
    pair_free(&p);
    pair_up(&p);
    seal3(&p.o_tx);
    /* reflected: the opener's own record sent back to it */
    cr_assert_eq(loomi_seal_open(&p.o_rx, LOOMI_SEAL_DATA, rec[0], N, out), -1,
                 "a record opened under the other direction's key");
    pair_free(&p);
}

Test(seal, limits)
{
    struct pair p;
    pair_up(&p);
    static unsigned char big[LOOMI_SEAL_MAX + 1 + LOOMI_SEAL_TAG];
    cr_assert_eq(loomi_seal(&p.o_tx, LOOMI_SEAL_DATA, big, LOOMI_SEAL_MAX + 1, big), -1);
    cr_assert_eq(loomi_seal(&p.o_tx, LOOMI_SEAL_DATA, big, LOOMI_SEAL_MAX, big), 0);
    struct loomi_seal none = {0};
    cr_assert_eq(loomi_seal(&none, LOOMI_SEAL_DATA, big, 1, big), -1);
    loomi_seal_free(&none);
    pair_free(&p);
}
