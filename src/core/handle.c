/*
 * handle.c - the values the application holds for communicators and
 * requests.
 *
 * A handle is not the object's address: it names a slot of a table and
 * the slot's generation, which grows each time the slot is given up.
 * Every public call looks its handle up; a handle whose object was
 * destroyed finds a newer generation in its slot (or an empty slot) and
 * is refused, even when malloc has since handed the same address to a new
 * communicator.  The table's memory is never freed, so looking up any
 * value, stale or garbage, reads nothing that was freed.
 *
 * Threads: slots are taken and given up under a mutex; lookups take no
 * lock.  A slot's generation is read before and after its object, so a
 * lookup that races with the slot's reuse sees the generation move and
 * fails instead of returning the new object.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

/* value = generation << (SLOT_BITS + 2) | slot << 2 | tag.  The tag
 * (01 communicator, 10 request) keeps the low bits off 00, which every
 * real object address has. */
#if UINTPTR_MAX > 0xffffffffu
#define SLOT_BITS 20
#else
#define SLOT_BITS 12
#endif
#define GEN_SHIFT (SLOT_BITS + 2)
#define GEN_MASK (UINTPTR_MAX >> GEN_SHIFT)
#define CHUNK 256u
#define NCHUNKS ((1u << SLOT_BITS) / CHUNK)

struct entry {
    _Atomic uint64_t gen;  /* of the handle live here, or of the next one */
    _Atomic(void *) obj;   /* NULL while free or reserved */
    uint32_t next_free;    /* slot + 1; 0: end of the free list */
};

struct table {
    pthread_mutex_t mu;
    _Atomic(struct entry *) chunk[NCHUNKS];
    uint32_t nslots;                /* slots ever handed out */
    uint32_t free_head, free_tail;  /* slot + 1: oldest first, reused last */
};

static struct table tables[2] = {{.mu = PTHREAD_MUTEX_INITIALIZER},
                                 {.mu = PTHREAD_MUTEX_INITIALIZER}};

static struct entry *slot_entry(struct table *t, uint32_t slot)
{
    struct entry *c = atomic_load(&t->chunk[slot / CHUNK]);
    return c ? &c[slot % CHUNK] : NULL;
}

uintptr_t loomi_handle_new(enum loomi_handle_kind kind, void *obj)
{
    struct table *t = &tables[kind];
    pthread_mutex_lock(&t->mu);
    uint32_t slot;
    struct entry *e = NULL;
    if (t->free_head) {
        slot = t->free_head - 1;
        e = slot_entry(t, slot);
        t->free_head = e->next_free;
        if (!t->free_head) t->free_tail = 0;
    } else if (t->nslots < NCHUNKS * CHUNK) {
        slot = t->nslots;
        if (!atomic_load(&t->chunk[slot / CHUNK])) {
            struct entry *c = calloc(CHUNK, sizeof *c);
            if (!c) {
                pthread_mutex_unlock(&t->mu);
                return 0;
            }
            for (uint32_t i = 0; i < CHUNK; i++) atomic_init(&c[i].gen, 1);
            atomic_store(&t->chunk[slot / CHUNK], c);
        }
        t->nslots++;
        e = slot_entry(t, slot);
    } else {
        pthread_mutex_unlock(&t->mu);
        return 0;
    }
    e->next_free = 0;
    uint64_t g = atomic_load(&e->gen);
    atomic_store(&e->obj, obj);
    pthread_mutex_unlock(&t->mu);
    return (uintptr_t)(g & GEN_MASK) << GEN_SHIFT | (uintptr_t)slot << 2 | (uintptr_t)(kind + 1);
}

/* The entry a value names (NULL: no slot of this table), and its
 * generation. */
static struct entry *decode(enum loomi_handle_kind kind, uintptr_t h, uint64_t *gen)
{
    if ((h & 3u) != (uintptr_t)(kind + 1)) return NULL;
    uint32_t slot = (uint32_t)(h >> 2) & ((1u << SLOT_BITS) - 1);
    *gen = h >> GEN_SHIFT;
    return slot_entry(&tables[kind], slot);
}

void loomi_handle_set(enum loomi_handle_kind kind, uintptr_t h, void *obj)
{
    uint64_t g;
    struct entry *e = decode(kind, h, &g);
    if (e && (atomic_load(&e->gen) & GEN_MASK) == g) atomic_store(&e->obj, obj);
}

void *loomi_handle_get(enum loomi_handle_kind kind, uintptr_t h, enum loomi_handle_state *why)
{
    enum loomi_handle_state st = LOOMI_HANDLE_NEVER;
    void *obj = NULL;
    uint64_t g;
    struct entry *e = h ? decode(kind, h, &g) : NULL;
    if (!h) {
        st = LOOMI_HANDLE_NULL;
    } else if (e) {
        uint64_t g1 = atomic_load(&e->gen);
        obj = atomic_load(&e->obj);
        uint64_t g2 = atomic_load(&e->gen);
        if ((g1 & GEN_MASK) == g && g1 == g2 && obj) {
            st = LOOMI_HANDLE_LIVE;
        } else {
            obj = NULL;
            /* An older generation than the slot's: it was live once
             * (perhaps given up while this lookup ran). */
            if (g && g < (g2 & GEN_MASK)) st = LOOMI_HANDLE_GONE;
        }
    }
    if (why) *why = st;
    return obj;
}

void loomi_handle_drop(enum loomi_handle_kind kind, uintptr_t h)
{
    struct table *t = &tables[kind];
    uint64_t g;
    struct entry *e = h ? decode(kind, h, &g) : NULL;
    if (!e) return;
    uint32_t slot = (uint32_t)(h >> 2) & ((1u << SLOT_BITS) - 1);
    pthread_mutex_lock(&t->mu);
    uint64_t cur = atomic_load(&e->gen);
    if ((cur & GEN_MASK) != g) { /* dropped already */
        pthread_mutex_unlock(&t->mu);
        return;
    }
    atomic_store(&e->obj, NULL);
    atomic_store(&e->gen, cur + 1);
    /* A slot whose generation would wrap is retired: an old handle could
     * otherwise name it again. */
    if (((cur + 1) & GEN_MASK) != 0) {
        if (t->free_tail) slot_entry(t, t->free_tail - 1)->next_free = slot + 1;
        else t->free_head = slot + 1;
        t->free_tail = slot + 1;
    }
    pthread_mutex_unlock(&t->mu);
}
