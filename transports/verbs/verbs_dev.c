/*
 * verbs_dev.c - the verbs transport's device: libibverbs, loaded at run
 * time (dlopen), and the choice of device, port and GID (LOOM_IB_HCA,
 * LOOM_IB_GID_INDEX, the topology's hint); loomi_verbs_available.
 */
#include "config.h"

#ifdef HAVE_VERBS_H

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/verbs/verbs_internal.h"

/* ------------------------------------------------------- libibverbs */

/* Every libibverbs function used (verbs_internal.h). */
struct loomi_verbs_lib loomi_verbs_ib;

static pthread_once_t ib_once = PTHREAD_ONCE_INIT;
static char ib_why[256]; /* empty: loaded */

static void ib_load(void)
{
    loomi_verbs_ib.lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!loomi_verbs_ib.lib) {
        snprintf(ib_why, sizeof ib_why, "libibverbs.so.1 cannot be loaded (%s)", dlerror());
        return;
    }
#define SYM(field, name)                                                                     \
    do {                                                                                     \
        *(void **)&loomi_verbs_ib.field = dlsym(loomi_verbs_ib.lib, name);                   \
        if (!loomi_verbs_ib.field) {                                                         \
            snprintf(ib_why, sizeof ib_why, "libibverbs.so.1 lacks %s", name);              \
            return;                                                                          \
        }                                                                                    \
    } while (0)
    SYM(get_device_list, "ibv_get_device_list");
    SYM(free_device_list, "ibv_free_device_list");
    SYM(get_device_name, "ibv_get_device_name");
    SYM(open_device, "ibv_open_device");
    SYM(close_device, "ibv_close_device");
    SYM(query_device, "ibv_query_device");
    SYM(query_port, "ibv_query_port");
    SYM(query_gid, "ibv_query_gid");
    SYM(alloc_pd, "ibv_alloc_pd");
    SYM(dealloc_pd, "ibv_dealloc_pd");
    SYM(reg_mr, "ibv_reg_mr");
    SYM(dereg_mr, "ibv_dereg_mr");
    SYM(create_comp_channel, "ibv_create_comp_channel");
    SYM(destroy_comp_channel, "ibv_destroy_comp_channel");
    SYM(create_cq, "ibv_create_cq");
    SYM(destroy_cq, "ibv_destroy_cq");
    SYM(get_cq_event, "ibv_get_cq_event");
    SYM(ack_cq_events, "ibv_ack_cq_events");
    SYM(create_qp, "ibv_create_qp");
    SYM(modify_qp, "ibv_modify_qp");
    SYM(destroy_qp, "ibv_destroy_qp");
    SYM(wc_status_str, "ibv_wc_status_str");
#undef SYM
    /* Optional: rdma-core 34 and later (GPUDirect RDMA through dmabuf,
     * verbs.c); NULL where the library is older. */
    *(void **)&loomi_verbs_ib.reg_dmabuf_mr = dlsym(loomi_verbs_ib.lib, "ibv_reg_dmabuf_mr");
}

static int port_query(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
    struct verbs_context *vctx = verbs_get_ctx_op(c, query_port);
    memset(a, 0, sizeof *a);
    if (vctx) return vctx->query_port(c, port, a, sizeof *a);
    return loomi_verbs_ib.query_port(c, port, a);
}

/* ------------------------------------------------------ device choice */


static int is_v4_mapped(const union ibv_gid *g)
{
    static const unsigned char pre[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return !memcmp(g->raw, pre, 12);
}

static int gid_is_zero(const union ibv_gid *g)
{
    for (int i = 0; i < 16; i++)
        if (g->raw[i]) return 0;
    return 1;
}

/* "RoCE v2", "IB/RoCE v1", or "" when sysfs does not say. */
static void gid_type(const char *dev, int port, int idx, char *out, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
             idx);
    out[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(out, (int)n, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\n")] = 0;
}

/* Pick the GID: LOOM_IB_GID_INDEX, else RoCE v2 with an IPv4-mapped
 * address, else RoCE v2, else any non-zero entry. */
static int pick_gid(struct ibv_context *c, struct dev_choice *d, int tbl_len, char *why, size_t n)
{
    const char *env = getenv("LOOM_IB_GID_INDEX");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v >= tbl_len) {
            snprintf(why, n, "LOOM_IB_GID_INDEX=%s is not an index of %s port %d's GID table "
                     "(0..%d)", env, d->name, d->port, tbl_len - 1);
            return -1;
        }
        if (loomi_verbs_ib.query_gid(c, (uint8_t)d->port, (int)v, &d->gid)) {
            snprintf(why, n, "LOOM_IB_GID_INDEX=%s: cannot read that GID of %s port %d", env,
                     d->name, d->port);
            return -1;
        }
        d->gid_index = (int)v;
        return 0;
    }
    int best = -1, best_score = 0;
    for (int i = 0; i < tbl_len && i < 256; i++) {
        union ibv_gid g;
        if (loomi_verbs_ib.query_gid(c, (uint8_t)d->port, i, &g) || gid_is_zero(&g)) continue;
        char ty[32];
        gid_type(d->name, d->port, i, ty, sizeof ty);
        int v2 = strstr(ty, "v2") != NULL;
        int score = 1 + (v2 ? 2 : 0) + (v2 && is_v4_mapped(&g) ? 4 : 0);
        if (score > best_score) {
            best_score = score;
            best = i;
            d->gid = g;
        }
    }
    if (best < 0) {
        if (d->link_layer == IBV_LINK_LAYER_INFINIBAND && d->lid) {
            d->gid_index = -1;
            return 0;
        }
        snprintf(why, n, "%s port %d has no usable GID", d->name, d->port);
        return -1;
    }
    d->gid_index = best;
    return 0;
}

/* Open the device to use: LOOM_IB_HCA=name[:port]; else `hint` (the NIC
 * the topology gives this rank: the one closest to its GPU or cores) when
 * it has an active port; else the first device with one.  Returns the
 * context, or NULL with why set. */
static struct ibv_context *open_named(struct dev_choice *d, const char *want, int want_port,
                                      const char *hca, char *why, size_t n);

struct ibv_context *loomi_verbs_open_choice(struct dev_choice *d, const char *hint, int rank,
                                            char *why, size_t n)
{
    pthread_once(&ib_once, ib_load);
    if (ib_why[0]) {
        snprintf(why, n, "%s", ib_why);
        return NULL;
    }
    const char *hca = getenv("LOOM_IB_HCA");
    char want[64] = "";
    int want_port = 0;
    if (hca && *hca) {
        snprintf(want, sizeof want, "%s", hca);
        char *colon = strchr(want, ':');
        if (colon) {
            *colon = 0;
            char *end;
            long p = strtol(colon + 1, &end, 10);
            if (*end || p < 1 || p > 255) {
                snprintf(why, n, "LOOM_IB_HCA=%s: bad port number", hca);
                return NULL;
            }
            want_port = (int)p;
        }
        return open_named(d, want, want_port, hca, why, n);
    }
    if (hint && *hint) {
        char hwhy[256];
        struct ibv_context *c = open_named(d, hint, 0, NULL, hwhy, sizeof hwhy);
        if (c) return c;
        LOOMI_INFO(rank, "verbs: the topology's NIC for this rank, %s, is not usable (%s); "
                         "taking the first device with an active port", hint, hwhy);
    }
    return open_named(d, "", 0, NULL, why, n);
}

/* The device named `want` ("": any), on port want_port (0: any active). */
static struct ibv_context *open_named(struct dev_choice *d, const char *want, int want_port,
                                      const char *hca, char *why, size_t n)
{
    int ndev = 0;
    struct ibv_device **list = loomi_verbs_ib.get_device_list(&ndev);
    if (!list || ndev <= 0) {
        snprintf(why, n, "no RDMA device found (libibverbs loaded; is a driver such as "
                         "rdma_rxe, mlx5_ib or irdma loaded?)");
        if (list) loomi_verbs_ib.free_device_list(list);
        return NULL;
    }
    struct ibv_context *ctx = NULL;
    if (hca) snprintf(why, n, "LOOM_IB_HCA=%s: no RDMA device with an active port", hca);
    else if (want[0]) snprintf(why, n, "%s: no such RDMA device with an active port", want);
    else snprintf(why, n, "no RDMA device with an active port");
    for (int i = 0; i < ndev && !ctx; i++) {
        const char *name = loomi_verbs_ib.get_device_name(list[i]);
        if (!name || (want[0] && strcmp(name, want))) continue;
        struct ibv_context *c = loomi_verbs_ib.open_device(list[i]);
        if (!c) continue;
        struct ibv_device_attr da;
        if (loomi_verbs_ib.query_device(c, &da)) {
            loomi_verbs_ib.close_device(c);
            continue;
        }
        for (int p = 1; p <= da.phys_port_cnt && !ctx; p++) {
            if (want_port && p != want_port) continue;
            struct ibv_port_attr pa;
            if (port_query(c, (uint8_t)p, &pa) || pa.state != IBV_PORT_ACTIVE) continue;
            memset(d, 0, sizeof *d);
            snprintf(d->name, sizeof d->name, "%s", name);
            d->port = p;
            d->lid = pa.lid;
            d->link_layer = pa.link_layer;
            d->mtu = pa.active_mtu;
            if (pick_gid(c, d, pa.gid_tbl_len, why, n)) continue;
            ctx = c;
        }
        if (!ctx) loomi_verbs_ib.close_device(c);
    }
    loomi_verbs_ib.free_device_list(list);
    return ctx;
}

int loomi_verbs_available(char *why, size_t n)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int known = -1;
    static char reason[256];
    pthread_mutex_lock(&mu);
    if (known < 0) {
        struct dev_choice d;
        struct ibv_context *c = loomi_verbs_open_choice(&d, NULL, -1, reason, sizeof reason);
        known = c != NULL;
        if (c) loomi_verbs_ib.close_device(c);
    }
    snprintf(why, n, "%s", known ? "" : reason);
    int k = known;
    pthread_mutex_unlock(&mu);
    return k;
}

#endif /* HAVE_VERBS_H */
