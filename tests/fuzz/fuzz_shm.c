/* Shared memory: what a peer's process writes where this one reads it.
 *  - its segment's header (loomi_shm_seg_bad: the check before anything
 *    in the segment is mapped or used), with an oracle: a header it
 *    passes must place the slots, rings and arena inside the segment;
 *  - the cells of its FIFO (handle_cell through loomi_shm_poll_in, as
 *    progress() reads them), with receives posted and cancelled between
 *    the cells, so messages arrive early (buffered), into a posted
 *    receive, as descriptors, in pieces, resent, acked, abandoned.
 * shm_fifo.c is included so its static cell reader runs unchanged; the
 * transport is built as shm_create builds it, with this rank's inbound
 * FIFO from peer 1 in a plain buffer.
 *
 * Input: byte 0 even: a segment: [nranks][same uid][size: 8 bytes]
 * [header bytes]; odd: records, op = byte % 3:
 *   0 cell:   [28 bytes: the cell header after seq][plen][plen bytes]
 *             written into the next cell, made full, then read
 *   1 post:   [tag][len lo][len hi][chk] a receive (tag % 4, len % 4097,
 *             chk 0 or 0x100 + chk)
 *   2 cancel: [k] receive k (of those posted) */
#include "transports/shm/shm_fifo.c"

#include <sys/stat.h>
#include <unistd.h>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_xfer.h"

FUZZ_QUIET_INIT

#define NCELLS 4u
#define CELL_BYTES 256u
#define MAXX 16
/* Bytes held for receives not posted: small, so a message the limit
 * refuses costs no gigabyte here (the limit is a parameter). */
#define FUZZ_UNEXP ((size_t)1 << 20)

static void fuzz_seg(const uint8_t *d, size_t n)
{
    if (n < 10) return;
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    int nranks = d[0] % 65;
    sb.st_uid = d[1] & 1 ? 1000 : 1001;
    int64_t size;
    memcpy(&size, d + 2, 8);
    sb.st_size = (off_t)size;
    struct seg_hdr h;
    memset(&h, 0, sizeof h);
    memcpy(&h, d + 10, n - 10 < sizeof h ? n - 10 : sizeof h);
    if (loomi_shm_seg_bad(&sb, 1000, &h, nranks)) return;
    /* Passed: everything it places lies inside the segment, in the file. */
    const unsigned __int128 slots_end = (unsigned __int128)h.slots_off + 4u * (uint64_t)h.nslots;
    const unsigned __int128 ring_min =
        sizeof(struct ring_ctl) + (unsigned __int128)h.ncells * h.cell_bytes;
    const unsigned __int128 rings_end =
        (unsigned __int128)h.rings_off + (unsigned __int128)h.ring_stride * h.nslots;
    const unsigned __int128 arena_end = (unsigned __int128)h.arena_off + h.arena_bytes;
    if (sb.st_uid != 1000 || sb.st_size < 0 || h.total > (uint64_t)sb.st_size ||
        h.total > MAX_SEG || h.nslots > (uint32_t)nranks || slots_end > h.total ||
        h.ring_stride < ring_min || h.rings_off < slots_end || rings_end > h.total ||
        arena_end > h.total || h.ncells == 0 || (h.ncells & (h.ncells - 1)) ||
        h.cell_bytes <= CELL_HDR)
        abort();
}

static void fuzz_fifo(const uint8_t *d, size_t size)
{
    static const unsigned char key[LOOMI_AUTH_KEY_BYTES] = {1, 2, 3};
    struct shm *t = calloc(1, sizeof *t);
    if (!t) abort();
    /* As shm_create and connect leave it, without the segments. */
    t->ctx.rank = 0;
    t->ctx.nranks = 2;
    t->ctx.job_key = key;
    t->ctx.peer_failed = fuzz_on_fail;
    loomi_match_init(&t->match, &t->ctx, sizeof(struct unexp), FUZZ_UNEXP, loomi_shm_match_fail,
                     t);
    t->fd = -1;
    t->ncells = NCELLS;
    t->cell_bytes = CELL_BYTES;
    t->peers = calloc(2, sizeof *t->peers);
    if (!t->peers) abort();
    for (int r = 0; r < 2; r++) {
        t->peers[r].t = t;
        t->peers[r].rank = r;
        t->peers[r].fd = -1;
    }
    struct peer *p = &t->peers[1];
    p->want = p->connected = 1;
    p->pid = getpid();
    char *ring = aligned_alloc(64, 2 * (sizeof(struct ring_ctl) + NCELLS * CELL_BYTES));
    if (!ring) abort();
    memset(ring, 0, 2 * (sizeof(struct ring_ctl) + NCELLS * CELL_BYTES));
    p->in_ctl = (struct ring_ctl *)ring;
    p->in_cells = ring + sizeof(struct ring_ctl);
    /* Its outbound FIFO, for the acks and nacks this rank sends. */
    char *out = ring + sizeof(struct ring_ctl) + NCELLS * CELL_BYTES;
    p->out_ctl = (struct ring_ctl *)out;
    p->out_cells = out + sizeof(struct ring_ctl);
    p->out_ncells = NCELLS;
    p->out_cell_bytes = CELL_BYTES;

    struct loomi_xfer *xs[MAXX];
    int nx = 0;
    size_t off = 0;
    while (off < size && !p->failed) {
        int op = d[off++] % 3;
        if (op == 0 && size - off >= CELL_HDR - 4 + 1) {
            struct cell *c = in_cell(t, p, p->in_pos);
            memcpy((char *)c + 4, d + off, CELL_HDR - 4);
            off += CELL_HDR - 4;
            size_t plen = d[off++];
            if (plen > size - off) plen = size - off;
            if (plen > CELL_BYTES - CELL_HDR) plen = CELL_BYTES - CELL_HDR;
            memcpy((char *)c + CELL_HDR, d + off, plen);
            off += plen;
            atomic_store(&c->seq, (uint32_t)(p->in_pos + 1));
            loomi_shm_poll_in(t, p, (int)NCELLS);
        } else if (op == 1 && size - off >= 4 && nx < MAXX) {
            struct loomi_xfer *x = fuzz_recv(1, d + off, 4096);
            off += 4;
            xs[nx++] = x;
            loomi_shm_irecv(t, x);
        } else if (op == 2 && size - off >= 1) {
            int k = d[off++];
            if (nx && !xs[k % nx]->owner) loomi_shm_cancel(t, xs[k % nx]);
        } else {
            break;
        }
    }
    /* Everything p holds goes (receives complete with an error). */
    loomi_shm_peer_down(t, p, 1, LOOM_ERR_REMOTE, "the end of the input", 0);
    loomi_match_fini(&t->match);
    free(t->peers);
    free(t);
    free(ring);
    fuzz_free_recvs(xs, nx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    if (data[0] & 1) fuzz_fifo(data + 1, size - 1);
    else fuzz_seg(data + 1, size - 1);
    return 0;
}

/* ------------------------------------------------------------ seeds */

static size_t cell(unsigned char *b, uint16_t type, uint32_t len, uint32_t chk, uint64_t tag,
                   uint64_t total, const void *pl)
{
    struct cell c;
    memset(&c, 0, sizeof c);
    c.type = type;
    c.len = len;
    c.chk = chk;
    c.tag = tag;
    c.total = total;
    size_t n = 0;
    b[n++] = 0;
    memcpy(b + n, (char *)&c + 4, CELL_HDR - 4);
    n += CELL_HDR - 4;
    b[n++] = (unsigned char)len;
    if (len) memcpy(b + n, pl, len);
    return n + len;
}

static size_t post(unsigned char *b, int tag, size_t len, int chk)
{
    b[0] = 1;
    b[1] = (unsigned char)tag;
    b[2] = (unsigned char)len;
    b[3] = (unsigned char)(len >> 8);
    b[4] = (unsigned char)chk;
    return 5;
}

/* A segment as shm.c lays it out: nslots rings of ncells cells. */
static int seg_seed(const char *dir, const char *name, int nranks, uint32_t nslots,
                    uint32_t ncells, uint32_t cell_bytes, uint64_t arena, int64_t size_delta)
{
    struct seg_hdr h;
    memset(&h, 0, sizeof h);
    h.version = SEG_VERSION;
    h.nranks = nranks;
    h.nslots = nslots;
    h.ncells = ncells;
    h.cell_bytes = cell_bytes;
    h.slots_off = PAGE;
    h.rings_off = (PAGE + 4u * nslots + 63) / 64 * 64;
    h.ring_stride = (sizeof(struct ring_ctl) + (uint64_t)ncells * cell_bytes + 63) / 64 * 64;
    uint64_t end = h.rings_off + h.ring_stride * nslots;
    h.arena_off = (end + PAGE - 1) / PAGE * PAGE;
    h.arena_bytes = arena;
    h.total = h.arena_off + arena;
    unsigned char b[1 + 10 + sizeof h];
    b[0] = 0;
    b[1] = (unsigned char)nranks;
    b[2] = 1;
    int64_t sz = (int64_t)h.total + size_delta;
    memcpy(b + 3, &sz, 8);
    memcpy(b + 11, &h, sizeof h);
    return fuzz_write_seed(dir, name, b, sizeof b);
}

int fuzz_seeds(const char *dir)
{
    unsigned char b[2048], pl[256];
    for (size_t i = 0; i < sizeof pl; i++) pl[i] = (unsigned char)i;
    int bad = 0;
    bad |= seg_seed(dir, "seg-ok", 4, 3, 64, 4096, 1 << 20, 0);
    bad |= seg_seed(dir, "seg-small", 2, 1, 2, 256, 0, 0);
    bad |= seg_seed(dir, "seg-short-file", 4, 3, 64, 4096, 0, -1);
    bad |= seg_seed(dir, "seg-too-many", 2, 3, 64, 4096, 0, 0);
    bad |= seg_seed(dir, "seg-cells", 2, 1, 3, 4096, 0, 0);
    const uint32_t cap = CELL_BYTES - CELL_HDR;
    /* An eager message in one cell, early, then its receive. */
    size_t n = 0;
    b[n++] = 1;
    n += cell(b + n, C_FIRST, 100, 0x101, 1, 100, pl);
    n += post(b + n, 1, 100, 1);
    bad |= fuzz_write_seed(dir, "fifo-early", b, n);
    /* Posted first, then three cells. */
    n = 0;
    b[n++] = 1;
    n += post(b + n, 2, 2 * cap + 10, 0);
    n += cell(b + n, C_FIRST, cap, 0, 2, 2 * cap + 10, pl);
    n += cell(b + n, C_CONT, cap, 0, 0, 0, pl);
    n += cell(b + n, C_CONT, 10, 0, 0, 0, pl);
    bad |= fuzz_write_seed(dir, "fifo-posted", b, n);
    /* A message abandoned, and a cancelled receive. */
    n = 0;
    b[n++] = 1;
    n += post(b + n, 3, 1000, 0);
    n += cell(b + n, C_FIRST, cap, 0, 3, 1000, pl);
    n += cell(b + n, C_ABANDON, 0, 0, 0, 0, pl);
    n += post(b + n, 0, 5, 0);
    b[n++] = 2;
    b[n++] = 1;
    n += cell(b + n, C_FIRST, 5, 0, 0, 5, pl);
    bad |= fuzz_write_seed(dir, "fifo-abandon", b, n);
    /* Single-copy descriptors: posted, and early. */
    uint64_t desc[2] = {0x1000, 7};
    n = 0;
    b[n++] = 1;
    n += post(b + n, 1, 4096, 0);
    n += cell(b + n, C_RTS, 16, 0, 1, 4096, desc);
    n += cell(b + n, C_RTS, 16, 0, 2, 300, desc);
    n += post(b + n, 2, 300, 0);
    b[n++] = 2;
    b[n++] = 0;
    bad |= fuzz_write_seed(dir, "fifo-rts", b, n);
    /* Acks for what was never sent; a resend of nothing; too long. */
    n = 0;
    b[n++] = 1;
    n += cell(b + n, C_ACK, 0, 0, 5, 0, pl);
    bad |= fuzz_write_seed(dir, "fifo-ack", b, n);
    n = 0;
    b[n++] = 1;
    n += cell(b + n, C_NACK, 0, 0, 0, 0, pl);
    bad |= fuzz_write_seed(dir, "fifo-nack", b, n);
    n = 0;
    b[n++] = 1;
    n += cell(b + n, C_RESEND, 10, 0, 0, 10, pl);
    bad |= fuzz_write_seed(dir, "fifo-resend", b, n);
    n = 0;
    b[n++] = 1;
    n += cell(b + n, C_FIRST, 200, 0, 1, MAX_MSG, pl);
    n += cell(b + n, C_CONT, 200, 0, 1, 0, pl);
    bad |= fuzz_write_seed(dir, "fifo-huge", b, n);
    /* Five cells: the ring wraps. */
    n = 0;
    b[n++] = 1;
    for (int i = 0; i < 5; i++) n += cell(b + n, C_FIRST, 8, 0, (uint64_t)i % 4, 8, pl);
    for (int i = 0; i < 5; i++) n += post(b + n, i % 4, 8, 0);
    bad |= fuzz_write_seed(dir, "fifo-wrap", b, n);
    return bad ? -1 : 0;
}
