/* tags.c - the text of a conflict between two ranks' messages of one
 * operation (transport.h), shared by the two-sided transports. */
#include <stdio.h>

#include "transports/transport.h"

static void sig_text(loomi_sig_namer name_sig, unsigned sig, char *buf, size_t n)
{
    if (name_sig)
        name_sig(sig, buf, n);
    else
        snprintf(buf, n, "(schedule %u)", sig);
}

void loomi_tag_conflict_why(uint64_t theirs, uint64_t mine, loomi_sig_namer name_sig, char *buf,
                            size_t n)
{
    char a[48], b[48];
    sig_text(name_sig, (unsigned)(theirs >> LOOMI_TAG_SIG_SHIFT) & 0xffu, a, sizeof a);
    sig_text(name_sig, (unsigned)(mine >> LOOMI_TAG_SIG_SHIFT) & 0xffu, b, sizeof b);
    snprintf(buf, n,
             "ran operation %llu as %s where this rank runs %s: do all ranks call the same "
             "collectives in the same order with the same loom_comm_set_algo?",
             (unsigned long long)loomi_tag_op(mine), a, b);
}

void loomi_call_conflict_why(uint64_t theirs, uint32_t theirs_chk, uint64_t mine,
                             uint32_t mine_chk, loomi_sig_namer name_sig, char *buf, size_t n)
{
    if ((theirs ^ mine) >> LOOMI_TAG_SIG_SHIFT) {
        loomi_tag_conflict_why(theirs, mine, name_sig, buf, n);
        return;
    }
    snprintf(buf, n,
             "made collective call %llu with other arguments than this rank (call check %08x "
             "there, %08x here): do all ranks make the same collective calls in the same order "
             "with the same count, datatype, op and root?",
             (unsigned long long)loomi_tag_op(mine), (unsigned)theirs_chk, (unsigned)mine_chk);
}
