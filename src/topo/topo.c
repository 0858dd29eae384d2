/*
 * topo.c - what this host looks like (hwloc), the fixed-size card that
 * carries it to the other ranks, and the job picture built from all cards:
 * hosts, and for each rank its NUMA node, GPU and NIC.
 *
 * Indices of NUMA nodes and packages are hwloc logical indices (0..n-1 in
 * tree order), so they mean the same on every rank of a host.  Devices are
 * listed in PCI bus order: GPU i is what CUDA calls device i under
 * CUDA_DEVICE_ORDER=PCI_BUS_ID.
 */
#include "topo/topo.h"

#include <errno.h>
#include <hwloc.h>
#include <inttypes.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

static void copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* First line of a small file, without the newline; "" when unreadable. */
static void read_line(const char *path, char *buf, size_t n)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(buf, (int)n, f)) buf[0] = '\0';
    fclose(f);
    buf[strcspn(buf, "\n")] = '\0';
}

/* Name and id.  The boot id tells apart containers that share a hostname
 * but not a kernel; with LOOM_HOSTNAME the name alone is the identity, so
 * tests can fake several hosts on one machine.  The machine (the boot id
 * alone) is read either way: fake hosts still share the cores. */
static void host_identity(const struct loomi_settings *set, struct loomi_topo_host *h)
{
    char boot[64] = "";
    read_line("/proc/sys/kernel/random/boot_id", boot, sizeof boot);
    h->machine = boot[0] ? fnv1a(0xcbf29ce484222325ull, boot, strlen(boot)) : 0;
    if (set->hostname[0]) {
        copy_str(h->name, sizeof h->name, set->hostname);
    } else {
        if (gethostname(h->name, sizeof h->name) != 0 || !h->name[0])
            copy_str(h->name, sizeof h->name, "localhost");
        h->name[sizeof h->name - 1] = '\0';
    }
    uint64_t id = fnv1a(0xcbf29ce484222325ull, h->name, strlen(h->name));
    if (boot[0] && !set->hostname[0]) {
        id = fnv1a(id, "/", 1);
        id = fnv1a(id, boot, strlen(boot));
    }
    h->id = id;
}

/* "dddd:bb:dd.f" -> numbers; 0 on success. */
static int parse_busid(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn)
{
    char tail;
    if (!s || sscanf(s, "%x:%x:%x.%x%c", dom, bus, dev, fn, &tail) != 4) return -1;
    if (*dom > 0xffffffu || *bus > 0xff || *dev > 0x1f || *fn > 7) return -1;
    return 0;
}

static void format_busid(char *out, size_t n, unsigned dom, unsigned bus, unsigned dev, unsigned fn)
{
    /* parse_busid's bounds, stated again where gcc -O1 (the TSan build)
     * sees them: at most "ffffff:ff:1f.7", which fits every caller's 16. */
    snprintf(out, n, "%04x:%02x:%02x.%x", dom & 0xffffffu, bus & 0xffu, dev & 0x1fu, fn & 7u);
}

/* ------------------------------------------------------- card layout */

/*
 * The card: little-endian, LOOMI_TOPO_CARD_BYTES, unused tail zero.
 *
 *   0  u32 magic, u8 version, u8 source, u8 nnics, u8 ngpus
 *   8  u64 host id
 *  16  u16 npackages, u16 nnuma, u32 ncores, u32 npus
 *  28  u64 l3_bytes, u64 mem_bytes, u64 machine
 *  52  i32 pid, u8 bound, u8 0, i16 numa, i16 first_pu, i16 npus
 *  64  host name, NUL-terminated (at most 63 characters)
 *      per NIC: busid (u32 domain or ~0 unknown, u8 bus, u8 dev<<3|fn),
 *               i8 numa, i8 package, u32 speed_mbps, name NUL-terminated
 *      per GPU: the same without the speed
 *
 * Names are variable-length, so typical hosts fit whole; at the least any
 * host name with CARD_MIN_NICS NICs and CARD_MIN_GPUS GPUs whose names have
 * up to CARD_MIN_NAME-1 characters does (static_assert below).  Discovery
 * drops devices that would not fit (GPUs first when there are more GPUs
 * than NICs, else NICs), so what a rank knows of its host is exactly what
 * its card says.  Device NUMA/package indices above 126 are sent as -1.
 */
#define CARD_MAGIC 0x43544d4cu /* "LMTC" */
#define CARD_VERSION 3
#define CARD_HEAD 64
#define CARD_NIC_FIXED 12
#define CARD_GPU_FIXED 8
#define CARD_MIN_NICS 4
#define CARD_MIN_GPUS 8
#define CARD_MIN_NAME 12
#define CARD_IDX_MAX 126 /* largest NUMA/package index a device can carry */
#define CARD_HOSTNAME (sizeof(((struct loomi_topo_host *)0)->name))

_Static_assert(CARD_HEAD + CARD_HOSTNAME + CARD_MIN_NICS * (CARD_NIC_FIXED + CARD_MIN_NAME) +
                       CARD_MIN_GPUS * (CARD_GPU_FIXED + CARD_MIN_NAME) <=
                   LOOMI_TOPO_CARD_BYTES,
               "a card must hold 4 NICs and 8 GPUs with short names");
_Static_assert(LOOMI_TOPO_MAX_NICS <= 255 && LOOMI_TOPO_MAX_GPUS <= 255,
               "device counts travel as one byte");

static const char *const source_names[] = {"hwloc", "xml", "fallback"};

static size_t card_bytes(const struct loomi_topo_host *h)
{
    size_t n = CARD_HEAD + strlen(h->name) + 1;
    for (int i = 0; i < h->nnics; i++) n += CARD_NIC_FIXED + strlen(h->nics[i].name) + 1;
    for (int i = 0; i < h->ngpus; i++) n += CARD_GPU_FIXED + strlen(h->gpus[i].name) + 1;
    return n;
}

/* Writer and reader over a card; reads past the end return zeros and set
 * `bad` (the caller reports the field). */
struct cur {
    unsigned char *w;
    const unsigned char *r;
    size_t pos;
    int bad;
};

static void put(struct cur *c, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) c->w[c->pos++] = (unsigned char)(v >> (8 * i));
}

static void put_str(struct cur *c, const char *s)
{
    size_t n = strlen(s) + 1;
    memcpy(c->w + c->pos, s, n);
    c->pos += n;
}

static uint64_t get(struct cur *c, int n)
{
    if (c->pos + (size_t)n > LOOMI_TOPO_CARD_BYTES) {
        c->bad = 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)c->r[c->pos++] << (8 * i);
    return v;
}

/* A NUL-terminated string of at most cap-1 characters; 0 when fine. */
static int get_str(struct cur *c, char *dst, size_t cap)
{
    size_t left = LOOMI_TOPO_CARD_BYTES - c->pos;
    size_t max = LOOMI_MIN(left, cap);
    const unsigned char *p = memchr(c->r + c->pos, 0, max);
    if (!p) return -1;
    size_t n = (size_t)(p - (c->r + c->pos));
    memcpy(dst, c->r + c->pos, n + 1);
    c->pos += n + 1;
    return 0;
}

static void put_dev(struct cur *c, const struct loomi_topo_dev *d, int nic)
{
    unsigned dom, bus, dev, fn;
    if (parse_busid(d->busid, &dom, &bus, &dev, &fn) == 0) {
        put(c, dom, 4);
        put(c, bus, 1);
        put(c, (dev << 3) | fn, 1);
    } else {
        put(c, 0xffffffffu, 4);
        put(c, 0, 2);
    }
    put(c, (uint8_t)(int8_t)(d->numa > CARD_IDX_MAX ? -1 : d->numa), 1);
    put(c, (uint8_t)(int8_t)(d->package > CARD_IDX_MAX ? -1 : d->package), 1);
    if (nic) put(c, d->speed_mbps, 4);
    put_str(c, d->name);
}

void loomi_topo_pack(const struct loomi_topo_rank *r, unsigned char *card)
{
    /* Discovery already trimmed the device lists; trim again for hosts
     * built by hand, in the same order. */
    struct loomi_topo_host h = r->host;
    h.name[sizeof h.name - 1] = '\0';
    for (int i = 0; i < h.nnics; i++) h.nics[i].name[LOOMI_TOPO_NAME - 1] = '\0';
    for (int i = 0; i < h.ngpus; i++) h.gpus[i].name[LOOMI_TOPO_NAME - 1] = '\0';
    h.nnics = LOOMI_MAX(0, LOOMI_MIN(h.nnics, LOOMI_TOPO_MAX_NICS));
    h.ngpus = LOOMI_MAX(0, LOOMI_MIN(h.ngpus, LOOMI_TOPO_MAX_GPUS));
    while (card_bytes(&h) > LOOMI_TOPO_CARD_BYTES) {
        if (h.ngpus > h.nnics) h.ngpus--;
        else h.nnics--;
    }
    int src = 2;
    for (int i = 0; i < 3; i++)
        if (strcmp(h.source, source_names[i]) == 0) src = i;

    memset(card, 0, LOOMI_TOPO_CARD_BYTES);
    struct cur c = {.w = card};
    put(&c, CARD_MAGIC, 4);
    put(&c, CARD_VERSION, 1);
    put(&c, (unsigned)src, 1);
    put(&c, (unsigned)h.nnics, 1);
    put(&c, (unsigned)h.ngpus, 1);
    put(&c, h.id, 8);
    put(&c, (uint16_t)h.npackages, 2);
    put(&c, (uint16_t)h.nnuma, 2);
    put(&c, (uint32_t)h.ncores, 4);
    put(&c, (uint32_t)h.npus, 4);
    put(&c, h.l3_bytes, 8);
    put(&c, h.mem_bytes, 8);
    put(&c, h.machine, 8);
    put(&c, (uint32_t)r->pid, 4);
    put(&c, r->bound ? 1 : 0, 1);
    /* The NIC this rank's RDMA transport opened, + 1 (0: none, or one the
     * trimmed list lost). */
    put(&c, r->nic_open && r->nic >= 0 && r->nic < h.nnics ? (unsigned)r->nic + 1 : 0, 1);
    put(&c, (uint16_t)r->numa, 2);
    put(&c, (uint16_t)r->first_pu, 2);
    put(&c, (uint16_t)r->npus, 2);
    put_str(&c, h.name);
    for (int i = 0; i < h.nnics; i++) put_dev(&c, &h.nics[i], 1);
    for (int i = 0; i < h.ngpus; i++) put_dev(&c, &h.gpus[i], 0);
}

#define COUNT_MAX (1 << 20) /* sanity bound on packages, NUMA nodes, cores, PUs */

static loom_result_t bad_field(const char *field, long long v)
{
    return loomi_fail(LOOM_ERR_MISMATCH, -1, "topology card: bad %s (%lld)", field, v);
}

static loom_result_t get_dev(struct cur *c, struct loomi_topo_dev *d, int nic, int i,
                             const struct loomi_topo_host *h)
{
    const char *kind = nic ? "nic" : "gpu";
    char field[48];
    uint32_t dom = (uint32_t)get(c, 4);
    unsigned bus = (unsigned)get(c, 1), devfn = (unsigned)get(c, 1);
    int numa = (int8_t)get(c, 1), pkg = (int8_t)get(c, 1);
    d->speed_mbps = nic ? (uint32_t)get(c, 4) : 0;
    if (c->bad) {
        snprintf(field, sizeof field, "%s %d (card too short)", kind, i);
        return bad_field(field, i);
    }
    if (dom == 0xffffffffu) {
        if (bus || devfn) {
            snprintf(field, sizeof field, "%s %d busid", kind, i);
            return bad_field(field, bus);
        }
        d->busid[0] = '\0';
    } else if (dom > 0xffffffu) {
        snprintf(field, sizeof field, "%s %d PCI domain", kind, i);
        return bad_field(field, dom);
    } else {
        format_busid(d->busid, sizeof d->busid, dom, bus, devfn >> 3, devfn & 7);
    }
    if (numa < -1 || numa >= h->nnuma) {
        snprintf(field, sizeof field, "%s %d numa", kind, i);
        return bad_field(field, numa);
    }
    if (pkg < -1 || pkg >= h->npackages) {
        snprintf(field, sizeof field, "%s %d package", kind, i);
        return bad_field(field, pkg);
    }
    d->numa = (int16_t)numa;
    d->package = (int16_t)pkg;
    if (get_str(c, d->name, sizeof d->name) != 0 || !d->name[0]) {
        snprintf(field, sizeof field, "%s %d name", kind, i);
        return bad_field(field, (long long)strnlen(d->name, sizeof d->name));
    }
    return LOOM_SUCCESS;
}

loom_result_t loomi_topo_unpack(const unsigned char *card, struct loomi_topo_rank *r)
{
    memset(r, 0, sizeof *r);
    struct cur c = {.r = card};
    struct loomi_topo_host *h = &r->host;
    uint32_t magic = (uint32_t)get(&c, 4);
    if (magic != CARD_MAGIC) return bad_field("magic", magic);
    unsigned ver = (unsigned)get(&c, 1);
    if (ver != CARD_VERSION) return bad_field("version", ver);
    unsigned src = (unsigned)get(&c, 1);
    if (src >= LOOMI_ARRAY_LEN(source_names)) return bad_field("source", src);
    copy_str(h->source, sizeof h->source, source_names[src]);
    h->nnics = (int)get(&c, 1);
    if (h->nnics > LOOMI_TOPO_MAX_NICS) return bad_field("nnics", h->nnics);
    h->ngpus = (int)get(&c, 1);
    if (h->ngpus > LOOMI_TOPO_MAX_GPUS) return bad_field("ngpus", h->ngpus);
    h->id = get(&c, 8);
    h->npackages = (int)get(&c, 2);
    h->nnuma = (int)get(&c, 2);
    h->ncores = (int)(uint32_t)get(&c, 4);
    h->npus = (int)(uint32_t)get(&c, 4);
    if (h->npackages < 1 || h->npackages > COUNT_MAX) return bad_field("npackages", h->npackages);
    if (h->nnuma < 1 || h->nnuma > COUNT_MAX) return bad_field("nnuma", h->nnuma);
    if (h->npus < 1 || h->npus > COUNT_MAX) return bad_field("npus", h->npus);
    if (h->ncores < h->npackages || h->ncores > h->npus) return bad_field("ncores", h->ncores);
    h->l3_bytes = (size_t)get(&c, 8);
    h->mem_bytes = get(&c, 8);
    h->machine = get(&c, 8);
    r->pid = (int32_t)(uint32_t)get(&c, 4);
    if (r->pid <= 0) return bad_field("pid", r->pid);
    unsigned bound = (unsigned)get(&c, 1);
    if (bound > 1) return bad_field("bound", bound);
    r->bound = (int16_t)bound;
    unsigned in_use = (unsigned)get(&c, 1);
    if (in_use > (unsigned)h->nnics) return bad_field("nic in use", in_use);
    r->numa = (int16_t)get(&c, 2);
    r->first_pu = (int16_t)get(&c, 2);
    r->npus = (int16_t)get(&c, 2);
    if (r->numa < -1 || r->numa >= h->nnuma) return bad_field("numa", r->numa);
    if (r->npus < 0 || r->npus > h->npus || (r->bound && r->npus == 0))
        return bad_field("npus (binding)", r->npus);
    if (r->npus ? r->first_pu < 0 : r->first_pu != -1) return bad_field("first_pu", r->first_pu);
    if (get_str(&c, h->name, sizeof h->name) != 0 || !h->name[0])
        return bad_field("host name", (long long)strnlen(h->name, sizeof h->name));
    for (int i = 0; i < h->nnics; i++) {
        loom_result_t rc = get_dev(&c, &h->nics[i], 1, i, h);
        if (rc != LOOM_SUCCESS) return rc;
    }
    for (int i = 0; i < h->ngpus; i++) {
        loom_result_t rc = get_dev(&c, &h->gpus[i], 0, i, h);
        if (rc != LOOM_SUCCESS) return rc;
    }
    /* A zero tail: catches cards cut or shifted in transit. */
    for (size_t i = c.pos; i < LOOMI_TOPO_CARD_BYTES; i++)
        if (card[i]) return bad_field("trailing bytes", (long long)i);
    r->gpu = -1;
    r->nic = (int16_t)((int)in_use - 1);
    r->nic_open = in_use > 0;
    return LOOM_SUCCESS;
}

/* ---------------------------------------------------------- discovery */

/* The process's CPU affinity as OS indices; NULL when it cannot be read. */
static hwloc_bitmap_t affinity(void)
{
    for (int n = 1024; n <= (1 << 20); n *= 4) {
        cpu_set_t *cs = CPU_ALLOC((size_t)n);
        if (!cs) return NULL;
        size_t sz = CPU_ALLOC_SIZE((size_t)n);
        CPU_ZERO_S(sz, cs);
        if (sched_getaffinity(0, sz, cs) == 0) {
            hwloc_bitmap_t b = hwloc_bitmap_alloc();
            for (int i = 0; b && i < n; i++)
                if (CPU_ISSET_S((size_t)i, sz, cs)) hwloc_bitmap_set(b, (unsigned)i);
            CPU_FREE(cs);
            return b;
        }
        CPU_FREE(cs);
        if (errno != EINVAL) return NULL;
    }
    return NULL;
}

static void set_binding_span(struct loomi_topo_rank *me, hwloc_const_bitmap_t b)
{
    int first = hwloc_bitmap_first(b), w = hwloc_bitmap_weight(b);
    if (first < 0 || w <= 0 || first > INT16_MAX) {
        me->first_pu = -1;
        me->npus = 0;
        me->bound = 0;
        return;
    }
    me->first_pu = (int16_t)first;
    me->npus = (int16_t)LOOMI_MIN(w, INT16_MAX);
}

static void discover_fallback(struct loomi_topo_rank *me)
{
    struct loomi_topo_host *h = &me->host;
    long onln = sysconf(_SC_NPROCESSORS_ONLN);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    h->npackages = 1;
    h->nnuma = 1;
    h->npus = onln > 0 ? (int)LOOMI_MIN(onln, COUNT_MAX) : 1;
    h->ncores = h->npus; /* without hwloc we cannot tell SMT siblings apart */
    h->mem_bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    copy_str(h->source, sizeof h->source, "fallback");
    hwloc_bitmap_t b = affinity();
    if (b) {
        int w = hwloc_bitmap_weight(b);
        me->bound = w > 0 && w < h->npus;
        me->numa = me->bound ? 0 : -1;
        set_binding_span(me, b);
        if (me->npus > h->npus) me->npus = (int16_t)h->npus;
        hwloc_bitmap_free(b);
    }
}

/* Index (logical) of the object of `type` whose set includes `set`, -1
 * when none.  By nodeset: -1 also when several do.  By cpuset: the first,
 * so that memory-only tiers sharing a node's CPUs (HBM, CXL) do not hide
 * the node. */
static int enclosing(hwloc_topology_t t, hwloc_obj_type_t type, hwloc_const_bitmap_t set,
                     int by_nodeset)
{
    int found = -1, n = hwloc_get_nbobjs_by_type(t, type);
    if (hwloc_bitmap_iszero(set)) return -1;
    for (int i = 0; i < n; i++) {
        hwloc_obj_t o = hwloc_get_obj_by_type(t, type, (unsigned)i);
        hwloc_const_bitmap_t os = by_nodeset ? o->nodeset : o->cpuset;
        if (os && hwloc_bitmap_isincluded(set, os)) {
            if (!by_nodeset) return (int)o->logical_index;
            if (found >= 0) return -1;
            found = (int)o->logical_index;
        }
    }
    return found;
}

/* NUMA node and package a PCI device is closest to: those of its first
 * non-I/O ancestor, when it lies within exactly one of each. */
static void locality(hwloc_topology_t t, hwloc_obj_t pci, struct loomi_topo_dev *d)
{
    hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t, pci);
    int numa = -1, pkg = -1;
    if (a && a->nodeset) {
        /* The ancestor's nodeset must be exactly one node, not just cover it. */
        if (hwloc_bitmap_weight(a->nodeset) == 1) numa = enclosing(t, HWLOC_OBJ_NUMANODE, a->nodeset, 1);
    }
    if (a && a->cpuset) pkg = enclosing(t, HWLOC_OBJ_PACKAGE, a->cpuset, 0);
    d->numa = (int16_t)(numa > CARD_IDX_MAX ? -1 : numa);
    d->package = (int16_t)(pkg > CARD_IDX_MAX ? -1 : pkg);
    format_busid(d->busid, sizeof d->busid, pci->attr->pcidev.domain, pci->attr->pcidev.bus,
                 pci->attr->pcidev.dev, pci->attr->pcidev.func);
}

static hwloc_obj_t pci_parent(hwloc_obj_t o)
{
    for (hwloc_obj_t p = o->parent; p; p = p->parent) {
        if (p->type == HWLOC_OBJ_PCI_DEVICE) return p;
        if (p->type != HWLOC_OBJ_OS_DEVICE && p->type != HWLOC_OBJ_BRIDGE) return NULL;
    }
    return NULL;
}

/* Link speed of a live NIC in Mb/s, 0 unknown: netdevs say it in
 * /sys/class/net, verbs devices as "200 Gb/sec (4X HDR)" per port. */
static uint32_t live_speed(const char *name, int verbs)
{
    char path[160], buf[64];
    if (verbs) {
        snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/1/rate", name);
        read_line(path, buf, sizeof buf);
        double gb = 0;
        if (sscanf(buf, "%lf", &gb) == 1 && gb > 0 && gb < 4e6) return (uint32_t)(gb * 1000.0);
        return 0;
    }
    snprintf(path, sizeof path, "/sys/class/net/%s/speed", name);
    read_line(path, buf, sizeof buf);
    long v = strtol(buf, NULL, 10);
    return v > 0 && v < 4000000000L ? (uint32_t)v : 0;
}

/* Is this PCI device a compute GPU by its class?  3D controllers, "display
 * other" (AMD Instinct), processing accelerators, NVIDIA/AMD VGA boards.
 * Not: BMC and virtual displays, which also carry a DRM "card". */
static int gpu_class(hwloc_obj_t pci)
{
    unsigned cls = pci->attr->pcidev.class_id, ven = pci->attr->pcidev.vendor_id;
    if (cls == 0x0302 || cls == 0x0380 || (cls >> 8) == 0x12) return 1;
    return cls == 0x0300 && (ven == 0x10de || ven == 0x1002);
}

/* ... or, whatever its class, one with a compute (CUDA/OpenCL/oneAPI) OS
 * device. */
static int is_compute_gpu(hwloc_obj_t pci, hwloc_obj_t os)
{
    return os->attr->osdev.type == HWLOC_OBJ_OSDEV_COPROC || gpu_class(pci);
}

/* Which OS name names a GPU best (lower is better); GPU_PCI_NAME ranks
 * below them all. */
static int gpu_name_rank(hwloc_obj_t os)
{
    const char *n = os->name ? os->name : "";
    if (strncmp(n, "cuda", 4) == 0) return 0;
    if (os->attr->osdev.type == HWLOC_OBJ_OSDEV_COPROC) return 1;
    if (strncmp(n, "nvml", 4) == 0 || strncmp(n, "rsmi", 4) == 0) return 2;
    if (strncmp(n, "card", 4) == 0) return 3;
    return 4;
}
#define GPU_PCI_NAME 5

struct found_dev {
    struct loomi_topo_dev d;
    hwloc_obj_t pci;
    int pref;
};

static int cmp_found(const void *a, const void *b)
{
    const struct found_dev *x = a, *y = b;
    const struct hwloc_pcidev_attr_s *p = &x->pci->attr->pcidev, *q = &y->pci->attr->pcidev;
    if (p->domain != q->domain) return p->domain < q->domain ? -1 : 1;
    if (p->bus != q->bus) return p->bus < q->bus ? -1 : 1;
    if (p->dev != q->dev) return p->dev < q->dev ? -1 : 1;
    if (p->func != q->func) return p->func < q->func ? -1 : 1;
    return 0;
}

/* Add a device named name to a list with one entry per PCI device, keeping
 * the preferred name (lower pref) and the highest speed. */
static void add_dev(struct found_dev *list, int *n, int cap, hwloc_obj_t pci, const char *name,
                    int pref, uint32_t speed, hwloc_topology_t t)
{
    for (int i = 0; i < *n; i++) {
        if (list[i].pci != pci) continue;
        if (pref < list[i].pref) {
            copy_str(list[i].d.name, sizeof list[i].d.name, name);
            list[i].pref = pref;
        }
        list[i].d.speed_mbps = LOOMI_MAX(list[i].d.speed_mbps, speed);
        return;
    }
    if (*n >= cap) return;
    struct found_dev *f = &list[(*n)++];
    memset(f, 0, sizeof *f);
    f->pci = pci;
    f->pref = pref;
    copy_str(f->d.name, sizeof f->d.name, name);
    f->d.speed_mbps = speed;
    locality(t, pci, &f->d);
}

/* Enough room to find every device before dropping the extras. */
#define FOUND_CAP 256

static void find_devices(hwloc_topology_t t, int live, struct loomi_topo_host *h, int rank)
{
    struct found_dev *nics = calloc(FOUND_CAP, sizeof *nics);
    struct found_dev *gpus = calloc(FOUND_CAP, sizeof *gpus);
    int nn = 0, ng = 0;
    if (!nics || !gpus) {
        LOOMI_NOTICE(rank, "topology: no memory to list devices; none recorded");
        free(nics);
        free(gpus);
        return;
    }
    for (hwloc_obj_t os = hwloc_get_next_osdev(t, NULL); os; os = hwloc_get_next_osdev(t, os)) {
        hwloc_obj_t pci = pci_parent(os);
        if (!pci || !os->name || !os->name[0]) continue; /* virtual devices: no PCI parent */
        hwloc_obj_osdev_type_t ty = os->attr->osdev.type;
        if (ty == HWLOC_OBJ_OSDEV_NETWORK || ty == HWLOC_OBJ_OSDEV_OPENFABRICS) {
            int verbs = ty == HWLOC_OBJ_OSDEV_OPENFABRICS;
            /* One entry per port: the verbs name when there is one. */
            add_dev(nics, &nn, FOUND_CAP, pci, os->name, verbs ? 0 : 1,
                    live ? live_speed(os->name, verbs) : 0, t);
        } else if ((ty == HWLOC_OBJ_OSDEV_GPU || ty == HWLOC_OBJ_OSDEV_COPROC) &&
                   is_compute_gpu(pci, os)) {
            add_dev(gpus, &ng, FOUND_CAP, pci, os->name, gpu_name_rank(os), 0, t);
        }
    }
    /* A GPU that no OS device names is still a GPU: in a VM with one
     * passed through there may be no DRM card, and the OpenCL plugin can
     * hang its device off the machine rather than the PCI device (both
     * seen with an H200).  Its PCI ids name it. */
    for (hwloc_obj_t p = hwloc_get_next_pcidev(t, NULL); p; p = hwloc_get_next_pcidev(t, p)) {
        if (!gpu_class(p)) continue;
        char ids[LOOMI_TOPO_NAME];
        snprintf(ids, sizeof ids, "%04x:%04x", p->attr->pcidev.vendor_id,
                 p->attr->pcidev.device_id);
        add_dev(gpus, &ng, FOUND_CAP, p, ids, GPU_PCI_NAME, 0, t);
    }
    qsort(nics, (size_t)nn, sizeof *nics, cmp_found);
    qsort(gpus, (size_t)ng, sizeof *gpus, cmp_found);
    if (nn > LOOMI_TOPO_MAX_NICS || ng > LOOMI_TOPO_MAX_GPUS)
        LOOMI_INFO(rank, "topology: %d NICs and %d GPUs found, keeping at most %d and %d", nn, ng,
                   LOOMI_TOPO_MAX_NICS, LOOMI_TOPO_MAX_GPUS);
    h->nnics = LOOMI_MIN(nn, LOOMI_TOPO_MAX_NICS);
    h->ngpus = LOOMI_MIN(ng, LOOMI_TOPO_MAX_GPUS);
    for (int i = 0; i < h->nnics; i++) h->nics[i] = nics[i].d;
    for (int i = 0; i < h->ngpus; i++) h->gpus[i] = gpus[i].d;
    free(nics);
    free(gpus);
}

/* Largest cache of the last level present (L3, else L2, ...). */
static size_t last_level_cache(hwloc_topology_t t)
{
    static const hwloc_obj_type_t levels[] = {HWLOC_OBJ_L5CACHE, HWLOC_OBJ_L4CACHE,
                                              HWLOC_OBJ_L3CACHE, HWLOC_OBJ_L2CACHE,
                                              HWLOC_OBJ_L1CACHE};
    /* L3 is what the brief and most machines mean; L4/L5 (eDRAM, memory-side)
     * only count when there is no L3. */
    static const int order[] = {2, 0, 1, 3, 4};
    for (size_t k = 0; k < LOOMI_ARRAY_LEN(order); k++) {
        hwloc_obj_type_t ty = levels[order[k]];
        int n = hwloc_get_nbobjs_by_type(t, ty);
        uint64_t best = 0;
        for (int i = 0; i < n; i++) {
            hwloc_obj_t o = hwloc_get_obj_by_type(t, ty, (unsigned)i);
            if (o->attr && o->attr->cache.size > best) best = o->attr->cache.size;
        }
        if (best) return (size_t)best;
    }
    return 0;
}

static int count(hwloc_topology_t t, hwloc_obj_type_t ty)
{
    int n = hwloc_get_nbobjs_by_type(t, ty);
    return n < 0 ? 0 : LOOMI_MIN(n, COUNT_MAX);
}

static void live_binding(hwloc_topology_t t, struct loomi_topo_rank *me)
{
    hwloc_bitmap_t b = affinity();
    if (!b) return;
    hwloc_const_bitmap_t all = hwloc_topology_get_topology_cpuset(t);
    hwloc_bitmap_and(b, b, all);
    me->bound = !hwloc_bitmap_iszero(b) && !hwloc_bitmap_isequal(b, all);
    me->numa = me->bound ? (int16_t)enclosing(t, HWLOC_OBJ_NUMANODE, b, 0) : -1;
    set_binding_span(me, b);
    hwloc_bitmap_free(b);
}

/* Fill the host from a loaded topology. */
static void describe(hwloc_topology_t t, int live, struct loomi_topo_rank *me, int rank)
{
    struct loomi_topo_host *h = &me->host;
    h->npackages = LOOMI_MAX(count(t, HWLOC_OBJ_PACKAGE), 1);
    h->nnuma = LOOMI_MAX(count(t, HWLOC_OBJ_NUMANODE), 1);
    h->npus = LOOMI_MAX(count(t, HWLOC_OBJ_PU), 1);
    h->ncores = count(t, HWLOC_OBJ_CORE);
    if (h->ncores < 1 || h->ncores > h->npus) h->ncores = h->npus; /* no core info */
    h->ncores = LOOMI_MAX(h->ncores, h->npackages);
    h->npus = LOOMI_MAX(h->npus, h->ncores);
    h->l3_bytes = last_level_cache(t);
    h->mem_bytes = hwloc_get_root_obj(t)->total_memory;
    copy_str(h->source, sizeof h->source, live ? "hwloc" : "xml");
    find_devices(t, live, h, rank);
    if (live) live_binding(t, me);
}

/* Drop devices until the card holds them all (see the card layout). */
static void fit_card(struct loomi_topo_host *h, int rank)
{
    int nn = h->nnics, ng = h->ngpus;
    while (card_bytes(h) > LOOMI_TOPO_CARD_BYTES) {
        if (h->ngpus > h->nnics) h->ngpus--;
        else h->nnics--;
    }
    if (nn != h->nnics || ng != h->ngpus)
        LOOMI_NOTICE(rank, "topology: keeping %d of %d NICs and %d of %d GPUs (names too long "
                     "for the %d-byte card)", h->nnics, nn, h->ngpus, ng, LOOMI_TOPO_CARD_BYTES);
}

/* Loads the live machine, or file where given; NULL, or why not (errno
 * set where it says more).  *tp is the topology to destroy, if any. */
static const char *hwloc_open(const char *file, hwloc_topology_t *tp)
{
    errno = 0;
    if (hwloc_topology_init(tp) != 0) {
        *tp = NULL;
        return "hwloc_topology_init failed";
    }
    hwloc_topology_t t = *tp;
    if (hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0)
        return "hwloc cannot keep I/O devices";
    /* The Linux backend finds PCI devices in sysfs by itself; the pci
     * plugin (libpciaccess) would add nothing but memory it never frees,
     * which LeakSanitizer reports in every rank.  Where that plugin is not
     * installed hwloc refuses to blacklist it (EINVAL): nothing to leave
     * out, and no reason to give up on hwloc (the VM of tests/verbs). */
    (void)hwloc_topology_set_components(t, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, "pci");
    errno = 0;
    if (file && hwloc_topology_set_xml(t, file) != 0) return "hwloc cannot read XML";
    if (hwloc_topology_load(t) != 0)
        return file ? "not a topology hwloc can load" : "hwloc_topology_load failed";
    if (hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU) < 1) return "no processing units";
    return NULL;
}


loom_result_t loomi_topo_discover(const struct loomi_settings *set, int rank,
                                  struct loomi_topo_rank *me)
{
    memset(me, 0, sizeof *me);
    me->pid = (int32_t)getpid();
    me->numa = -1;
    me->first_pu = -1;
    me->gpu = -1;
    me->nic = -1;
    host_identity(set, &me->host);

    const char *file = set->topo_file[0] ? set->topo_file : NULL;
    if (file && access(file, R_OK) != 0)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "LOOM_TOPO_FILE %s: %s", file,
                          strerror(errno));

    hwloc_topology_t t;
    const char *why = hwloc_open(file, &t);
    if (why && file) {
        int e = errno;
        if (t) hwloc_topology_destroy(t);
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, rank, "LOOM_TOPO_FILE %s: %s%s%s%s", file,
                          why, e ? " (" : "", e ? strerror(e) : "", e ? ")" : "");
    }
    if (why) {
        LOOMI_NOTICE(rank, "topology: %s (%s); using sysconf counts", why, strerror(errno));
        if (t) hwloc_topology_destroy(t);
        discover_fallback(me);
    } else {
        /* HWLOC_XMLFILE/HWLOC_SYNTHETIC can swap the live machine for
         * another: then, as with a file, our binding does not apply. */
        describe(t, !file && hwloc_topology_is_thissystem(t), me, rank);
        hwloc_topology_destroy(t);
    }
    fit_card(&me->host, rank);
    return LOOM_SUCCESS;
}

/* ------------------------------------------------------------ the job */

/* First field where two descriptions of one host differ, NULL if none. */
static const char *host_diff(const struct loomi_topo_host *a, const struct loomi_topo_host *b)
{
    if (strcmp(a->name, b->name)) return "name";
    if (a->npackages != b->npackages) return "packages";
    if (a->nnuma != b->nnuma) return "NUMA nodes";
    if (a->ncores != b->ncores) return "cores";
    if (a->npus != b->npus) return "PUs";
    if (a->l3_bytes != b->l3_bytes) return "L3";
    if (a->mem_bytes != b->mem_bytes) return "memory";
    if (strcmp(a->source, b->source)) return "source";
    if (a->nnics != b->nnics) return "NICs";
    if (a->ngpus != b->ngpus) return "GPUs";
    for (int i = 0; i < a->nnics; i++)
        if (strcmp(a->nics[i].name, b->nics[i].name) || strcmp(a->nics[i].busid, b->nics[i].busid) ||
            a->nics[i].numa != b->nics[i].numa || a->nics[i].package != b->nics[i].package)
            return "NIC list";
    for (int i = 0; i < a->ngpus; i++)
        if (strcmp(a->gpus[i].name, b->gpus[i].name) || strcmp(a->gpus[i].busid, b->gpus[i].busid) ||
            a->gpus[i].numa != b->gpus[i].numa || a->gpus[i].package != b->gpus[i].package)
            return "GPU list";
    return NULL;
}

/* Package of NUMA node n: from a device that knows both, else assuming
 * each package holds the same number of nodes in logical order (hwloc
 * numbers them in tree order); -1 when neither tells. */
static int package_of_numa(const struct loomi_topo_host *h, int n)
{
    if (n < 0) return -1;
    for (int i = 0; i < h->nnics; i++)
        if (h->nics[i].numa == n && h->nics[i].package >= 0) return h->nics[i].package;
    for (int i = 0; i < h->ngpus; i++)
        if (h->gpus[i].numa == n && h->gpus[i].package >= 0) return h->gpus[i].package;
    if (h->npackages >= 1 && h->nnuma % h->npackages == 0 && n < h->nnuma)
        return n / (h->nnuma / h->npackages);
    return -1;
}

/* Which NICs serve a locality: on NUMA node numa, else on package pkg,
 * else all.  Fills cand (indices), returns the count; *key names the
 * choice so equal keys mean equal candidate lists. */
static int nic_candidates(const struct loomi_topo_host *h, int numa, int pkg, int *cand, int *key)
{
    int n = 0;
    if (numa >= 0) {
        for (int i = 0; i < h->nnics; i++)
            if (h->nics[i].numa == numa) cand[n++] = i;
        *key = numa;
        if (n) return n;
    }
    if (pkg >= 0) {
        for (int i = 0; i < h->nnics; i++)
            if (h->nics[i].package == pkg) cand[n++] = i;
        *key = 1000000 + pkg;
        if (n) return n;
    }
    for (int i = 0; i < h->nnics; i++) cand[n++] = i;
    *key = -1;
    return n;
}

static void locality_of(const struct loomi_topo_host *h, const struct loomi_topo_rank *r, int *numa,
                        int *pkg)
{
    if (r->gpu >= 0) {
        *numa = h->gpus[r->gpu].numa;
        *pkg = h->gpus[r->gpu].package >= 0 ? h->gpus[r->gpu].package : package_of_numa(h, *numa);
    } else {
        *numa = r->numa;
        *pkg = package_of_numa(h, r->numa);
    }
}

/* Place the ranks of one host (ranks in local order). */
static void place_host(struct loomi_topo_rank *all, const int *ranks, int n)
{
    const struct loomi_topo_host *h = &all[ranks[0]].host;
    for (int li = 0; li < n; li++) {
        struct loomi_topo_rank *r = &all[ranks[li]];
        r->gpu = (int16_t)(h->ngpus > 0 ? li % h->ngpus : -1);
        if (r->bound && r->numa >= 0 && r->numa < h->nnuma) {
            /* keep the binding's node */
        } else if (r->bound) {
            r->numa = -1; /* spans several nodes: do not pretend otherwise */
        } else if (r->gpu >= 0 && h->gpus[r->gpu].numa >= 0) {
            r->numa = h->gpus[r->gpu].numa; /* host memory next to the GPU it drives */
        } else {
            r->numa = (int16_t)(h->nnuma > 0 ? li % h->nnuma : -1);
        }
    }
    if (h->nnics == 0) {
        for (int li = 0; li < n; li++) all[ranks[li]].nic = -1;
        return;
    }
    /* Spread in blocks over the candidates: the k-th of m users of a
     * candidate list takes cand[k*ncand/m].  Users are GPUs when the rank
     * has one (so the ranks sharing a GPU share its NIC, and GPUs and NICs,
     * both in bus order, pair up as they sit behind PCIe switches), else
     * ranks. */
    int cand[LOOMI_TOPO_MAX_NICS], cand2[LOOMI_TOPO_MAX_NICS];
    for (int li = 0; li < n; li++) {
        struct loomi_topo_rank *r = &all[ranks[li]];
        int numa, pkg, key, key2, nc, k = 0, m = 0;
        locality_of(h, r, &numa, &pkg);
        nc = nic_candidates(h, numa, pkg, cand, &key);
        if (r->gpu >= 0) {
            for (int g = 0; g < h->ngpus; g++) {
                struct loomi_topo_rank tmp = {.gpu = (int16_t)g};
                int n2, p2;
                locality_of(h, &tmp, &n2, &p2);
                nic_candidates(h, n2, p2, cand2, &key2);
                if (key2 != key) continue;
                if (g < r->gpu) k++;
                m++;
            }
        } else {
            for (int lj = 0; lj < n; lj++) {
                const struct loomi_topo_rank *q = &all[ranks[lj]];
                int n2, p2;
                if (q->gpu >= 0) continue;
                locality_of(h, q, &n2, &p2);
                nic_candidates(h, n2, p2, cand2, &key2);
                if (key2 != key) continue;
                if (lj < li) k++;
                m++;
            }
        }
        if (!r->nic_open) r->nic = (int16_t)cand[(int)((long long)k * nc / LOOMI_MAX(m, 1))];
    }
}

int loomi_topo_local_nic(const struct loomi_topo_rank *me, int li, int n)
{
    const struct loomi_topo_host *h = &me->host;
    if (h->nnics <= 0) return -1;
    if (li < 0 || li >= n || n > 65536) {
        /* Alone with what it knows: the NICs by its binding, if any. */
        int cand[LOOMI_TOPO_MAX_NICS], key;
        if (!me->bound || me->numa < 0) return -1;
        return nic_candidates(h, me->numa, package_of_numa(h, me->numa), cand, &key) ? cand[0]
                                                                                   : -1;
    }
    /* place_host over the host as this rank sees it: itself as it is,
     * the others unbound.  With GPUs the choice depends on the local
     * index alone, so every rank's matches what the job picture gives. */
    struct loomi_topo_rank *all = malloc((size_t)n * sizeof *all);
    int *order = malloc((size_t)n * sizeof *order);
    int nic = -1;
    if (all && order) {
        for (int q = 0; q < n; q++) {
            all[q] = *me;
            all[q].nic = -1;
            all[q].nic_open = 0;
            if (q != li) {
                all[q].bound = 0;
                all[q].numa = -1;
            }
            order[q] = q;
        }
        place_host(all, order, n);
        nic = all[li].nic;
    }
    free(all);
    free(order);
    return nic;
}

static int cmp_id(const void *a, const void *b, void *ctx)
{
    const struct loomi_topo_rank *rk = ctx;
    int x = *(const int *)a, y = *(const int *)b;
    if (rk[x].host.id != rk[y].host.id) return rk[x].host.id < rk[y].host.id ? -1 : 1;
    return x < y ? -1 : x > y;
}

loom_result_t loomi_topo_job_build(const struct loomi_topo_rank *ranks, int nranks,
                                   struct loomi_topo_job *job)
{
    memset(job, 0, sizeof *job);
    if (!ranks || nranks <= 0)
        return loomi_fail(LOOM_ERR_INVALID_ARGUMENT, -1, "topology: %d ranks", nranks);
    size_t n = (size_t)nranks;
    struct loomi_topo_rank *copy = malloc(n * sizeof *copy);
    int *order = malloc(n * sizeof *order), *host_of = malloc(n * sizeof *host_of);
    if (!copy || !order || !host_of) {
        free(copy);
        free(order);
        free(host_of);
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "topology: job of %d ranks", nranks);
    }
    memcpy(copy, ranks, n * sizeof *copy);
    /* Group by host id (sorting, so large jobs stay cheap); a host is
     * named by its lowest rank, which every other rank must agree with. */
    for (int r = 0; r < nranks; r++) order[r] = r;
    qsort_r(order, n, sizeof *order, cmp_id, copy);
    for (int i = 0; i < nranks; i++) {
        int r = order[i];
        int first = i > 0 && copy[order[i - 1]].host.id == copy[r].host.id ? host_of[order[i - 1]] : r;
        host_of[r] = first;
        const char *d = first != r ? host_diff(&copy[first].host, &copy[r].host) : NULL;
        if (d) {
            loom_result_t rc = loomi_fail(LOOM_ERR_MISMATCH, -1,
                                          "topology: ranks %d and %d claim the same host (id %016" PRIx64
                                          ") but describe it differently (%s)",
                                          first, r, copy[r].host.id, d);
            free(copy);
            free(order);
            free(host_of);
            return rc;
        }
    }
    free(order);
    struct loomi_hostmap *map = loomi_hostmap_build(nranks, host_of);
    free(host_of);
    if (!map) {
        free(copy);
        return loomi_fail(LOOM_ERR_NO_MEMORY, -1, "topology: host map of %d ranks", nranks);
    }
    for (int hst = 0; hst < map->nhosts; hst++)
        place_host(copy, map->host_ranks + map->host_start[hst], loomi_host_size(map, hst));
    job->nranks = nranks;
    job->ranks = copy;
    job->map = map;
    return LOOM_SUCCESS;
}

/* Orders hosts by the machine they run on: its id, or for a host of
 * unknown machine the host itself (never pooled with a known one). */
static int machine_cmp(const struct loomi_topo_host *a, const struct loomi_topo_host *b)
{
    const int ua = !a->machine, ub = !b->machine;
    if (ua != ub) return ua - ub;
    const uint64_t x = ua ? a->id : a->machine, y = ub ? b->id : b->machine;
    return (x > y) - (x < y);
}

int loomi_topo_machine_ranks(const struct loomi_topo_job *job, int rank)
{
    const struct loomi_topo_host *me = &job->ranks[rank].host;
    int n = 0;
    for (int q = 0; q < job->nranks; q++) n += machine_cmp(me, &job->ranks[q].host) == 0;
    return n;
}

static int cmp_host_machine(const void *a, const void *b)
{
    return machine_cmp(*(const struct loomi_topo_host *const *)a,
                       *(const struct loomi_topo_host *const *)b);
}

int loomi_topo_most_machine_ranks(const struct loomi_topo_job *job)
{
    const int n = job->nranks;
    const struct loomi_topo_host **k = n > 0 ? malloc((size_t)n * sizeof *k) : NULL;
    if (!k) return 0;
    /* Sorted, not counted per rank, which would be quadratic. */
    for (int q = 0; q < n; q++) k[q] = &job->ranks[q].host;
    qsort(k, (size_t)n, sizeof *k, cmp_host_machine);
    int most = 0;
    for (int i = 0, run = 0; i < n; i++) {
        run = i && machine_cmp(k[i], k[i - 1]) == 0 ? run + 1 : 1;
        if (run > most) most = run;
    }
    free(k);
    return most;
}

void loomi_topo_job_free(struct loomi_topo_job *job)
{
    if (!job) return;
    free(job->ranks);
    free(job->map);
    job->ranks = NULL;
    job->map = NULL;
}

/* ------------------------------------------------------------ printing */

static void fmt_bytes(char *out, size_t n, uint64_t b)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    uint64_t div = 1;
    while (u < 4 && b >= div * 1024) {
        div *= 1024;
        u++;
    }
    if (b % div == 0) snprintf(out, n, "%" PRIu64 " %s", b / div, unit[u]);
    else snprintf(out, n, "%.1f %s", (double)b / (double)div, unit[u]);
}

static void print_dev(FILE *f, const char *kind, int i, const struct loomi_topo_dev *d)
{
    fprintf(f, "  %s %d: %s %s numa %d package %d", kind, i, d->name, d->busid[0] ? d->busid : "-",
            d->numa, d->package);
    if (kind[0] == 'n') {
        if (d->speed_mbps) fprintf(f, " %u Mb/s", d->speed_mbps);
        else fprintf(f, " speed unknown");
    }
    fputc('\n', f);
}

void loomi_topo_print(FILE *f, const struct loomi_topo_job *job)
{
    if (!job || !job->map || !job->ranks) return;
    const struct loomi_hostmap *m = job->map;
    fprintf(f, "topology: %d ranks on %d hosts\n", job->nranks, m->nhosts);
    for (int hst = 0; hst < m->nhosts; hst++) {
        const int *hr = m->host_ranks + m->host_start[hst];
        const struct loomi_topo_host *h = &job->ranks[hr[0]].host;
        char l3[32], mem[32];
        fmt_bytes(l3, sizeof l3, h->l3_bytes);
        fmt_bytes(mem, sizeof mem, h->mem_bytes);
        fprintf(f, "host %d: %s (%s, id %016" PRIx64 "): %d packages, %d NUMA, %d cores, %d PUs, "
                   "L3 %s, memory %s, %d NICs, %d GPUs, %d ranks\n",
                hst, h->name, h->source, h->id, h->npackages, h->nnuma, h->ncores, h->npus,
                h->l3_bytes ? l3 : "unknown", h->mem_bytes ? mem : "unknown", h->nnics, h->ngpus,
                loomi_host_size(m, hst));
        for (int i = 0; i < h->nnics; i++) print_dev(f, "nic", i, &h->nics[i]);
        for (int i = 0; i < h->ngpus; i++) print_dev(f, "gpu", i, &h->gpus[i]);
        for (int li = 0; li < loomi_host_size(m, hst); li++) {
            const struct loomi_topo_rank *r = &job->ranks[hr[li]];
            fprintf(f, "  rank %d: local %d pid %d numa %d gpu %d%s%s%s nic %d%s%s%s", hr[li], li,
                    (int)r->pid, r->numa, r->gpu, r->gpu >= 0 ? " (" : "",
                    r->gpu >= 0 ? h->gpus[r->gpu].name : "", r->gpu >= 0 ? ")" : "", r->nic,
                    r->nic >= 0 ? " (" : "", r->nic >= 0 ? h->nics[r->nic].name : "",
                    r->nic < 0 ? "" : r->nic_open ? ", open)" : ")");
            if (r->bound) fprintf(f, " bound %d PUs from %d\n", r->npus, r->first_pu);
            else fprintf(f, " unbound\n");
        }
    }
}
