/* Test driver for the observers: plays an engine against the loopback verbs
 * provider (docs/provider.md) and prints what the engine saw as JSON lines on
 * stdout (the pytest wrapper compares them with the observer log).  Every
 * engine QP is connected, in this same process, to a peer QP on a context of
 * its own (own PD, MR and CQ, which the engine never polls), so the observers
 * only see the engine's side, as on a real host.
 *
 * Built three ways: DRIVER_DIRECT links libibverbs.so.1 (the provider)
 * directly; the dlopen build dlopens it with RTLD_LOCAL and dlsyms every
 * entry point, as engines using a loader do; DRIVER_SHARED makes the direct
 * driver a library (libobs_engine.so, entry obs_driver_main) that the
 * DRIVER_LOADER build dlopens with RTLD_LOCAL, so libibverbs is loaded but
 * never global, as Python loads pyverbs.  Needs ORBITE_PROVIDER_ROOT (a fake
 * host with mlx5_0 and mlx5_1 whose GID 3 is a local IPv4 address).
 * Usage: obs_driver <scenario> [classic|ext]: ext creates the engine's CQs
 * and QPs with ibv_create_cq_ex / ibv_create_qp_ex, posts with the ibv_wr_*
 * family and polls with ibv_start_poll / ibv_next_poll / ibv_end_poll (the
 * same WRs, one wr_start..wr_complete batch per list). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef DRIVER_LOADER
/* The engine library sits in lib/ next to this program. */
int main(int argc, char **argv)
{
	char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 32);
	int (*entry)(int, char **);
	char *slash;
	void *h;

	if (n <= 0)
		return 4;
	path[n] = '\0';
	slash = strrchr(path, '/');
	strcpy(slash ? slash + 1 : path, "lib/libobs_engine.so");
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "driver: %s\n", dlerror());
		return 4;
	}
	*(void **)&entry = dlsym(h, "obs_driver_main");
	return entry ? entry(argc, argv) : 4;
}
#else
#include "orbite_provider.h"
#include "qp_connect.h"

#define CHECK(cond)                                                        \
	do {                                                               \
		if (!(cond)) {                                             \
			fprintf(stderr, "driver: %s:%d: check failed: %s\n", \
				__FILE__, __LINE__, #cond);                \
			exit(3);                                           \
		}                                                          \
	} while (0)

static struct {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_mr_iova)(struct ibv_pd *, void *, size_t, uint64_t, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *,
				    struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*destroy_qp)(struct ibv_qp *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	long (*held)(const char *);
	long (*outstanding)(struct ibv_qp *);
	struct ibv_qp_ex *(*qp_to_qp_ex)(struct ibv_qp *);
} V;

static void load_api(void)
{
#ifdef DRIVER_DIRECT
	V.get_device_list = (ibv_get_device_list);
	V.free_device_list = ibv_free_device_list;
	V.open_device = ibv_open_device;
	V.close_device = ibv_close_device;
	V.alloc_pd = ibv_alloc_pd;
	V.dealloc_pd = ibv_dealloc_pd;
	V.reg_mr = (ibv_reg_mr);
	V.reg_mr_iova = (ibv_reg_mr_iova);
	V.dereg_mr = ibv_dereg_mr;
	V.create_comp_channel = ibv_create_comp_channel;
	V.destroy_comp_channel = ibv_destroy_comp_channel;
	V.create_cq = ibv_create_cq;
	V.destroy_cq = ibv_destroy_cq;
	V.create_qp = ibv_create_qp;
	V.destroy_qp = ibv_destroy_qp;
	V.modify_qp = ibv_modify_qp;
	V.query_gid = ibv_query_gid;
	V.held = orbite_provider_held;
	V.outstanding = orbite_provider_qp_outstanding;
	V.qp_to_qp_ex = ibv_qp_to_qp_ex;
#else
	void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);

	CHECK(h != NULL);
#define LOAD(field, name)                                  \
	do {                                               \
		*(void **)&V.field = dlsym(h, name);       \
		CHECK(V.field != NULL);                    \
	} while (0)
	LOAD(get_device_list, "ibv_get_device_list");
	LOAD(free_device_list, "ibv_free_device_list");
	LOAD(open_device, "ibv_open_device");
	LOAD(close_device, "ibv_close_device");
	LOAD(alloc_pd, "ibv_alloc_pd");
	LOAD(dealloc_pd, "ibv_dealloc_pd");
	LOAD(reg_mr, "ibv_reg_mr");
	LOAD(reg_mr_iova, "ibv_reg_mr_iova");
	LOAD(dereg_mr, "ibv_dereg_mr");
	LOAD(create_comp_channel, "ibv_create_comp_channel");
	LOAD(destroy_comp_channel, "ibv_destroy_comp_channel");
	LOAD(create_cq, "ibv_create_cq");
	LOAD(destroy_cq, "ibv_destroy_cq");
	LOAD(create_qp, "ibv_create_qp");
	LOAD(destroy_qp, "ibv_destroy_qp");
	LOAD(modify_qp, "ibv_modify_qp");
	LOAD(query_gid, "ibv_query_gid");
	LOAD(held, "orbite_provider_held");
	LOAD(outstanding, "orbite_provider_qp_outstanding");
	LOAD(qp_to_qp_ex, "ibv_qp_to_qp_ex");
#undef LOAD
#endif
}

/* ---------------------------------------------------------------- rig -- */

/* The GID every QP of the driver uses: the fake host's RoCE v2 IPv4 entry. */
#define GID_INDEX 3
#define PEER_RECVS 16
#define RECV_LEN 8192

/* An engine's side (ctx, pd, mr, cq, QPs: what the observers watch) and the
 * peer side its QPs are connected to (a second context on the same device). */
struct rig {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp[3];
	struct ibv_context *pctx;
	struct ibv_pd *ppd;
	struct ibv_mr *pmr;
	struct ibv_cq *pcq;
	struct ibv_qp *pqp[3];
	char buf[1 << 16];
	char pbuf[PEER_RECVS * RECV_LEN];
};

static struct ibv_device **devs;
static int ext; /* the extended API (argv[2] "ext") */

/* ----------------------------------------------------- classic or ext -- */

/* Extended CQs the driver made, with what it asked for: a CQ without
 * IBV_WC_EX_WITH_QP_NUM serves one QP, whose number the driver knows. */
#define MAX_XCQ 64
static struct {
	struct ibv_cq *cq;
	int with_qp_num;
	uint32_t qpn;
} xcqs[MAX_XCQ];
static int nxcq;

static struct ibv_cq *cq_create(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *ch, int with_qp_num)
{
	struct ibv_cq_init_attr_ex a;
	struct ibv_cq_ex *x;

	if (!ext)
		return V.create_cq(ctx, cqe, NULL, ch, 0);
	memset(&a, 0, sizeof(a));
	a.cqe = (uint32_t)cqe;
	a.channel = ch;
	a.wc_flags = with_qp_num ? IBV_WC_EX_WITH_QP_NUM : 0;
	x = ibv_create_cq_ex(ctx, &a);
	if (!x)
		return NULL;
	CHECK(nxcq < MAX_XCQ);
	xcqs[nxcq].cq = ibv_cq_ex_to_cq(x);
	xcqs[nxcq++].with_qp_num = with_qp_num;
	return ibv_cq_ex_to_cq(x);
}

static int xcq_index(struct ibv_cq *cq)
{
	int i;

	for (i = 0; i < nxcq; i++)
		if (xcqs[i].cq == cq)
			return i;
	return -1;
}

/* The engine's post: ibv_post_send, or the same list as one wr_* batch
 * (which the provider takes whole or not at all: bad is then the first). */
static int post_any(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct ibv_qp_ex *x;
	struct ibv_send_wr *w;
	int ret;

	if (!ext)
		return ibv_post_send(qp, wr, bad);
	x = V.qp_to_qp_ex(qp);
	CHECK(x);
	ibv_wr_start(x);
	for (w = wr; w; w = w->next) {
		x->wr_id = w->wr_id;
		x->wr_flags = w->send_flags;
		switch (w->opcode) {
		case IBV_WR_RDMA_READ:
			ibv_wr_rdma_read(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr);
			break;
		case IBV_WR_RDMA_WRITE:
			ibv_wr_rdma_write(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr);
			break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			ibv_wr_rdma_write_imm(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr, w->imm_data);
			break;
		case IBV_WR_SEND:
			ibv_wr_send(x);
			break;
		default:
			CHECK(!"opcode the driver does not post");
		}
		if (w->num_sge == 1)
			ibv_wr_set_sge(x, w->sg_list[0].lkey, w->sg_list[0].addr, w->sg_list[0].length);
		else
			ibv_wr_set_sge_list(x, (size_t)w->num_sge, w->sg_list);
	}
	ret = ibv_wr_complete(x);
	*bad = ret ? wr : NULL;
	return ret;
}

/* The engine's poll: ibv_poll_cq, or one start/next/end_poll pass. */
static int poll_any(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct ibv_poll_cq_attr attr = { 0 };
	struct ibv_cq_ex *x = (struct ibv_cq_ex *)cq;
	int n = 0, ret, k;

	if (!ext)
		return ibv_poll_cq(cq, num, wc);
	k = xcq_index(cq);
	CHECK(k >= 0);
	ret = ibv_start_poll(x, &attr);
	if (ret == ENOENT)
		return 0;
	if (ret)
		return -1;
	do {
		memset(&wc[n], 0, sizeof(wc[n]));
		wc[n].wr_id = x->wr_id;
		wc[n].status = x->status;
		wc[n].qp_num = xcqs[k].with_qp_num ? ibv_wc_read_qp_num(x) : xcqs[k].qpn;
		n++;
	} while (n < num && (ret = ibv_next_poll(x)) == 0);
	ibv_end_poll(x);
	return ret && ret != ENOENT ? -1 : n;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The engine's QPs (ext: with the wr_* family); the peers' stay classic. */
static struct ibv_qp *qp_create(struct ibv_pd *pd, struct ibv_cq *cq, int sq_depth, int recvs, int engine)
{
	struct ibv_qp_init_attr qa;

	if (ext && engine) {
		struct ibv_qp_init_attr_ex xa;
		int k = xcq_index(cq);

		memset(&xa, 0, sizeof(xa));
		xa.send_cq = xa.recv_cq = cq;
		xa.qp_type = IBV_QPT_RC;
		xa.cap.max_send_wr = (uint32_t)sq_depth;
		xa.cap.max_send_sge = 1;
		xa.cap.max_recv_wr = (uint32_t)recvs;
		xa.cap.max_recv_sge = 1;
		xa.cap.max_inline_data = 64;
		xa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		xa.pd = pd;
		xa.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_RDMA_WRITE |
				    IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND;
		{
			struct ibv_qp *qp = ibv_create_qp_ex(pd->context, &xa);

			if (qp && k >= 0 && !xcqs[k].with_qp_num)
				xcqs[k].qpn = qp->qp_num;
			return qp;
		}
	}
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = (uint32_t)sq_depth;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_wr = (uint32_t)recvs;
	qa.cap.max_recv_sge = 1;
	return V.create_qp(pd, &qa);
}

/* RESET -> INIT -> RTR -> RTS towards (gid, qpn). */
static void qp_connect(struct ibv_qp *qp, const union ibv_gid *gid, uint32_t qpn)
{
	CHECK(qp_connect_via(V.modify_qp, qp, 1, GID_INDEX, gid, qpn,
			     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, 7) == 0);
}

static void qp_to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	CHECK(V.modify_qp(qp, &a, IBV_QP_STATE) == 0);
}

/* One side of a rig: its own context, PD, MR over buf and CQ. */
static void side_open(int dev, char *buf, size_t len, int access, struct ibv_context **ctx,
		      struct ibv_pd **pd, struct ibv_mr **mr, struct ibv_cq **cq, int with_qp_num)
{
	*ctx = V.open_device(devs[dev]);
	CHECK(*ctx);
	*pd = V.alloc_pd(*ctx);
	CHECK(*pd);
	*mr = V.reg_mr(*pd, buf, len, access);
	CHECK(*mr);
	*cq = cq_create(*ctx, 256, NULL, with_qp_num);
	CHECK(*cq);
}

static void rig_open(struct rig *r, int dev, int nqp, int sq_depth)
{
	const int remote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	union ibv_gid gid;
	int i, k;

	memset(r, 0, sizeof(*r));
	/* A CQ of one QP is made without QP numbers (ext). */
	side_open(dev, r->buf, sizeof(r->buf), IBV_ACCESS_LOCAL_WRITE, &r->ctx, &r->pd, &r->mr, &r->cq, nqp > 1);
	side_open(dev, r->pbuf, sizeof(r->pbuf), remote, &r->pctx, &r->ppd, &r->pmr, &r->pcq, 1);
	CHECK(V.query_gid(r->ctx, 1, GID_INDEX, &gid) == 0);
	for (i = 0; i < nqp; i++) {
		/* every QP of a rig shares the rig's CQ */
		r->qp[i] = qp_create(r->pd, r->cq, sq_depth, 0, 1);
		CHECK(r->qp[i]);
		r->pqp[i] = qp_create(r->ppd, r->pcq, 1, PEER_RECVS, 0);
		CHECK(r->pqp[i]);
		qp_connect(r->qp[i], &gid, r->pqp[i]->qp_num);
		qp_connect(r->pqp[i], &gid, r->qp[i]->qp_num);
		/* receive WRs for the SENDs and WRITE_WITH_IMMs of the engine */
		for (k = 0; k < PEER_RECVS; k++) {
			struct ibv_sge sge = { (uintptr_t)(r->pbuf + k * RECV_LEN), RECV_LEN, r->pmr->lkey };
			struct ibv_recv_wr rw, *bad = NULL;

			memset(&rw, 0, sizeof(rw));
			rw.wr_id = (uint64_t)k;
			rw.sg_list = &sge;
			rw.num_sge = 1;
			CHECK(ibv_post_recv(r->pqp[i], &rw, &bad) == 0);
		}
	}
}

/* One side of a rig, once its QPs are gone. */
static void side_close(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_mr *mr, struct ibv_cq *cq)
{
	CHECK(V.destroy_cq(cq) == 0);
	CHECK(V.dereg_mr(mr) == 0);
	CHECK(V.dealloc_pd(pd) == 0);
	CHECK(V.close_device(ctx) == 0);
}

static void rig_close(struct rig *r)
{
	int i;

	for (i = 0; i < 3; i++) {
		if (r->qp[i])
			CHECK(V.destroy_qp(r->qp[i]) == 0);
		if (r->pqp[i])
			CHECK(V.destroy_qp(r->pqp[i]) == 0);
	}
	side_close(r->ctx, r->pd, r->mr, r->cq);
	side_close(r->pctx, r->ppd, r->pmr, r->pcq);
}

/* Real provider errors a scenario plants in its next post_list: the WR at
 * this index carries 2 SGEs on a 1-SGE QP (post_send rejects it, EINVAL),
 * or a wrong rkey (the peer NAKs it: IBV_WC_REM_ACCESS_ERR, the rest flush). */
static int bad_sge_at = -1, bad_rkey_at = -1;

/* Post `n` WRs as one list: opcodes cycle through `ops`. */
static int post_list(struct rig *r, struct ibv_qp *qp, uint64_t first_id, int n,
		     const enum ibv_wr_opcode *ops, int nops, uint32_t len,
		     uint64_t *bad_id)
{
	struct ibv_send_wr wr[32], *bad = NULL;
	struct ibv_sge sge[32][2];
	int i, ret;

	CHECK(n <= 32);
	for (i = 0; i < n; i++) {
		sge[i][0].addr = (uintptr_t)r->buf;
		sge[i][0].length = len + (uint32_t)i;
		sge[i][0].lkey = r->mr->lkey;
		sge[i][1] = sge[i][0];
		memset(&wr[i], 0, sizeof(wr[i]));
		wr[i].wr_id = first_id + (uint64_t)i;
		wr[i].sg_list = sge[i];
		wr[i].num_sge = i == bad_sge_at ? 2 : 1;
		wr[i].opcode = ops[i % nops];
		wr[i].send_flags = IBV_SEND_SIGNALED;
		wr[i].wr.rdma.remote_addr = (uintptr_t)r->pbuf;
		wr[i].wr.rdma.rkey = i == bad_rkey_at ? r->pmr->rkey ^ 0x5a00 : r->pmr->rkey;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	bad_sge_at = bad_rkey_at = -1;
	ret = post_any(qp, wr, &bad);
	if (bad_id)
		*bad_id = ret && bad ? bad->wr_id : UINT64_MAX;
	printf("{\"op\":\"post\",\"qpn\":%u,\"first\":%llu,\"n\":%d,\"ret\":%d,\"bad\":%lld}\n",
	       qp->qp_num, (unsigned long long)first_id, n, ret,
	       ret && bad ? (long long)bad->wr_id : -1LL);
	return ret;
}

/* Poll cq, printing every completion the engine gets, until `want` of them
 * (want > 0), or until the provider holds no send-queue slot of qp any more
 * (qp != NULL: every completion was polled, handed over or withheld), or
 * `ms` passed; then keep polling a while, so that a completion an observer
 * kept back would show up. */
static int drain(struct ibv_cq *cq, struct ibv_qp *qp, int want, int ms)
{
	struct ibv_wc wc[16];
	uint64_t end = now_ms() + (uint64_t)ms;
	int total = 0, n, i, extra = 20;

	for (;;) {
		n = poll_any(cq, 16, wc);
		CHECK(n >= 0);
		for (i = 0; i < n; i++)
			printf("{\"op\":\"cqe\",\"qpn\":%u,\"wr_id\":%llu,\"status\":%d}\n",
			       wc[i].qp_num, (unsigned long long)wc[i].wr_id, (int)wc[i].status);
		total += n;
		if ((want > 0 && total >= want) || (qp && V.outstanding(qp) == 0) || now_ms() > end) {
			if (extra-- == 0)
				break;
		}
		if (n == 0)
			usleep(200);
	}
	return total;
}

static void print_held(const char *when)
{
	static const char *const kinds[] = { "ctx", "pd", "mr", "mw", "cq", "channel", "qp" };
	size_t i;

	printf("{\"op\":\"held\",\"when\":\"%s\"", when);
	for (i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		printf(",\"%s\":%ld", kinds[i], V.held(kinds[i]));
	printf("}\n");
}

static const enum ibv_wr_opcode payload_ops[] = {
	IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND,
};

/* ---------------------------------------------------------- scenarios -- */

/* Two contexts; on each, two QPs share one CQ; payload and non-payload WRs;
 * up to 6 in flight per QP before the first poll. */
static void sc_accounting(void)
{
	struct rig *r = calloc(2, sizeof(*r));
	int d, q;

	CHECK(r);
	for (d = 0; d < 2; d++)
		rig_open(&r[d], d, 2, 8);
	for (d = 0; d < 2; d++)
		for (q = 0; q < 2; q++) {
			uint64_t base = ((uint64_t)d << 40) | ((uint64_t)q << 20);

			CHECK(post_list(&r[d], r[d].qp[q], base, 4, payload_ops, 4, 4096, NULL) == 0);
			CHECK(post_list(&r[d], r[d].qp[q], base + 4, 2, payload_ops, 2, 100, NULL) == 0);
		}
	for (d = 0; d < 2; d++)
		CHECK(drain(r[d].cq, NULL, 12, 10000) == 12);
	for (d = 0; d < 2; d++)
		rig_close(&r[d]);
	free(r);
	print_held("end");
}

/* bad_wr in the middle of a list, then a full send queue. */
static void sc_badwr(void)
{
	static const enum ibv_wr_opcode reads[] = { IBV_WR_RDMA_READ };
	struct rig *r = malloc(sizeof(*r));
	uint64_t bad;

	CHECK(r);
	rig_open(r, 0, 1, 8);
	bad_sge_at = 2;
	CHECK(post_list(r, r->qp[0], 100, 5, reads, 1, 1000, &bad) == EINVAL);
	/* ext: wr_complete refuses the whole batch */
	CHECK(bad == (ext ? 100 : 102));
	/* 2 outstanding (slots are held until their CQE is polled); depth 8:
	 * WRs 6 and 7 of this list do not fit (ext: none is outstanding) */
	CHECK(post_list(r, r->qp[0], 200, 8, reads, 1, 1000, &bad) == (ext ? 0 : ENOMEM));
	CHECK(bad == (ext ? UINT64_MAX : 206));
	CHECK(drain(r->cq, NULL, 8, 10000) == 8);
	rig_close(r);
	free(r);
}

/* Error completions: 2 successes, one remote access error (a wrong rkey),
 * then flushes. */
static void sc_errors(void)
{
	static const enum ibv_wr_opcode writes[] = { IBV_WR_RDMA_WRITE };
	struct rig *r = malloc(sizeof(*r));

	CHECK(r);
	rig_open(r, 1, 1, 8);
	bad_rkey_at = 2;
	CHECK(post_list(r, r->qp[0], 300, 5, writes, 1, 2048, NULL) == 0);
	CHECK(drain(r->cq, NULL, 5, 10000) == 5);
	rig_close(r);
	free(r);
}

/* Concurrent posting threads on three QPs sharing one CQ, one poller. */
struct thr_arg {
	struct rig *r;
	int q;
	int rounds;
};

static volatile int posting_done;
static long posted_total;

static void *poster(void *p)
{
	struct thr_arg *a = p;
	static const enum ibv_wr_opcode ops[] = { IBV_WR_RDMA_READ, IBV_WR_RDMA_WRITE };
	struct ibv_send_wr wr[4], *bad;
	struct ibv_sge sge[4];
	int round, i, posted = 0;

	for (round = 0; round < a->rounds; round++) {
		for (i = 0; i < 4; i++) {
			sge[i].addr = (uintptr_t)a->r->buf;
			sge[i].length = 64;
			sge[i].lkey = a->r->mr->lkey;
			memset(&wr[i], 0, sizeof(wr[i]));
			wr[i].wr_id = ((uint64_t)a->q << 32) | (uint64_t)(round * 4 + i);
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
			wr[i].opcode = ops[i % 2];
			wr[i].send_flags = IBV_SEND_SIGNALED;
			wr[i].wr.rdma.remote_addr = (uintptr_t)a->r->pbuf;
			wr[i].wr.rdma.rkey = a->r->pmr->rkey;
			wr[i].next = i < 3 ? &wr[i + 1] : NULL;
		}
		/* A full queue rejects from bad_wr on: post the rest again
		 * once the poller made room. */
		for (i = 0; i < 4;) {
			bad = NULL;
			if (post_any(a->r->qp[a->q], &wr[i], &bad) == 0) {
				posted += 4 - i;
				break;
			}
			posted += (int)(bad - &wr[i]);
			i = (int)(bad - wr);
			sched_yield();
		}
	}
	return (void *)(intptr_t)posted;
}

static void *poller(void *p)
{
	struct rig *r = p;
	struct ibv_wc wc[8];
	long got = 0;
	int n;
	uint64_t end = 0;

	/* Until every posted WR completed (or 30 s after posting ended). */
	while (!__atomic_load_n(&posting_done, __ATOMIC_SEQ_CST) ||
	       got < __atomic_load_n(&posted_total, __ATOMIC_SEQ_CST)) {
		n = poll_any(r->cq, 8, wc);
		CHECK(n >= 0);
		got += n;
		if (__atomic_load_n(&posting_done, __ATOMIC_SEQ_CST)) {
			if (!end)
				end = now_ms() + 30000;
			else if (now_ms() > end)
				break;
		}
	}
	return (void *)(intptr_t)got;
}

static void sc_threads(void)
{
	struct rig *r = malloc(sizeof(*r));
	struct thr_arg args[3];
	pthread_t pt[3], pl;
	long posted = 0;
	void *res;
	int i;

	CHECK(r);
	rig_open(r, 0, 3, 64);
	CHECK(pthread_create(&pl, NULL, poller, r) == 0);
	for (i = 0; i < 3; i++) {
		args[i] = (struct thr_arg){ r, i, 1000 };
		CHECK(pthread_create(&pt[i], NULL, poster, &args[i]) == 0);
	}
	for (i = 0; i < 3; i++) {
		CHECK(pthread_join(pt[i], &res) == 0);
		posted += (intptr_t)res;
	}
	__atomic_store_n(&posted_total, posted, __ATOMIC_SEQ_CST);
	__atomic_store_n(&posting_done, 1, __ATOMIC_SEQ_CST);
	CHECK(pthread_join(pl, &res) == 0);
	printf("{\"op\":\"threads\",\"posted\":%ld,\"polled\":%ld}\n", posted, (long)(intptr_t)res);
	rig_close(r);
	free(r);
}

/* Withheld completions: post, poll until the provider's send queue is empty
 * (every completion polled) and many times after, and print what the engine
 * saw (the test checks none of the withheld ones ever shows up); then one
 * more READ, the peer moved to ERR, and two READs: the first fails with
 * IBV_WC_RETRY_EXC_ERR (nobody answers), the second is flushed; error
 * completions must pass. */
static void sc_withhold(void)
{
	static const enum ibv_wr_opcode ops[] = { IBV_WR_RDMA_READ, IBV_WR_SEND };
	struct rig *r = malloc(sizeof(*r));
	int i;

	CHECK(r);
	rig_open(r, 0, 1, 8);
	CHECK(post_list(r, r->qp[0], 500, 6, ops, 2, 512, NULL) == 0);
	drain(r->cq, r->qp[0], -1, 10000);
	CHECK(V.outstanding(r->qp[0]) == 0); /* consumed, not queued for later */
	for (i = 0; i < 3; i++)
		drain(r->cq, NULL, -1, 10);
	CHECK(post_list(r, r->qp[0], 600, 1, ops, 1, 512, NULL) == 0);
	drain(r->cq, r->qp[0], -1, 10000);
	CHECK(V.outstanding(r->qp[0]) == 0);
	qp_to_error(r->pqp[0]);
	CHECK(post_list(r, r->qp[0], 601, 2, ops, 1, 512, NULL) == 0);
	drain(r->cq, r->qp[0], -1, 40000);
	rig_close(r);
	free(r);
}

/* Two objects of every kind on two contexts, destroyed kind by kind; each
 * result printed; with `retry`, a failed destroy is tried once more. */
static void sc_destroy(int retry)
{
	struct {
		struct ibv_context *ctx;
		struct ibv_comp_channel *ch[2];
		struct ibv_cq *cq[2];
		struct ibv_pd *pd[2];
		struct ibv_mr *mr[2];
		struct ibv_mw *mw[2];
		struct ibv_qp *qp[2];
	} c[2];
	static char buf[4096];
	struct ibv_qp_init_attr qa;
	int d, i, ret;

	memset(c, 0, sizeof(c));
	for (d = 0; d < 2; d++) {
		c[d].ctx = V.open_device(devs[d]);
		CHECK(c[d].ctx);
		for (i = 0; i < 2; i++) {
			c[d].ch[i] = V.create_comp_channel(c[d].ctx);
			CHECK(c[d].ch[i]);
			c[d].cq[i] = cq_create(c[d].ctx, 16, c[d].ch[i], 1);
			CHECK(c[d].cq[i]);
			c[d].pd[i] = V.alloc_pd(c[d].ctx);
			CHECK(c[d].pd[i]);
			c[d].mr[i] = V.reg_mr(c[d].pd[i], buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
			CHECK(c[d].mr[i]);
			c[d].mw[i] = ibv_alloc_mw(c[d].pd[i], IBV_MW_TYPE_2);
			CHECK(c[d].mw[i]);
			memset(&qa, 0, sizeof(qa));
			qa.send_cq = qa.recv_cq = c[d].cq[i];
			qa.qp_type = IBV_QPT_RC;
			qa.cap.max_send_wr = 8;
			c[d].qp[i] = ext ? qp_create(c[d].pd[i], c[d].cq[i], 8, 0, 1) : V.create_qp(c[d].pd[i], &qa);
			CHECK(c[d].qp[i]);
		}
	}
	print_held("built");
#define DESTROY(kind, call)                                                        \
	do {                                                                       \
		ret = call;                                                        \
		printf("{\"op\":\"destroy\",\"kind\":\"%s\",\"dev\":%d,\"index\":%d," \
		       "\"ret\":%d,\"retry\":false}\n", kind, d, i, ret);          \
		if (ret && retry) {                                                \
			ret = call;                                                \
			printf("{\"op\":\"destroy\",\"kind\":\"%s\",\"dev\":%d,"   \
			       "\"index\":%d,\"ret\":%d,\"retry\":true}\n",        \
			       kind, d, i, ret);                                   \
		}                                                                  \
	} while (0)
	for (d = 0; d < 2; d++)
		for (i = 0; i < 2; i++)
			DESTROY("qp", V.destroy_qp(c[d].qp[i]));
	for (d = 0; d < 2; d++)
		for (i = 0; i < 2; i++)
			DESTROY("mw", ibv_dealloc_mw(c[d].mw[i]));
	for (d = 0; d < 2; d++)
		for (i = 0; i < 2; i++)
			DESTROY("mr", V.dereg_mr(c[d].mr[i]));
	for (d = 0; d < 2; d++)
		for (i = 0; i < 2; i++)
			DESTROY("cq", V.destroy_cq(c[d].cq[i]));
	for (d = 0; d < 2; d++)
		for (i = 0; i < 2; i++)
			DESTROY("channel", V.destroy_comp_channel(c[d].ch[i]));
	for (d = 0; d < 2; d++)
		for (i = 0; i < 2; i++)
			DESTROY("pd", V.dealloc_pd(c[d].pd[i]));
#undef DESTROY
	print_held("destroyed");
	for (d = 0; d < 2; d++)
		CHECK(V.close_device(c[d].ctx) == 0);
}

/* The qp selector: one successful payload completion withheld, then the
 * QP destroy fails. */
static void sc_cleanup_qp(void)
{
	static const enum ibv_wr_opcode reads[] = { IBV_WR_RDMA_READ };
	struct rig *r = malloc(sizeof(*r));
	int ret;

	CHECK(r);
	rig_open(r, 0, 1, 8);
	CHECK(post_list(r, r->qp[0], 700, 3, reads, 1, 4096, NULL) == 0);
	drain(r->cq, r->qp[0], -1, 10000);
	ret = V.destroy_qp(r->qp[0]);
	printf("{\"op\":\"destroy\",\"kind\":\"qp\",\"dev\":0,\"index\":0,\"ret\":%d,\"retry\":false}\n", ret);
	if (ret == 0)
		r->qp[0] = NULL;
	print_held("after");
	if (r->qp[0]) {
		/* quarantined: left as is (and its peer), the process exit
		 * releases them */
		printf("{\"op\":\"quarantined\"}\n");
		CHECK(V.held("qp") == 2);
		return;
	}
	rig_close(r);
	free(r);
}

/* Digests: the arena layout of docs/content.md at a small scale (guard G,
 * payload L, 2 parents, slices of SLICE bytes) in the engine's buffer; the
 * peer's buffer holds pattern(i) at offset i.  READ pulls each slice of each
 * parent from the same offset of the peer's buffer; WRITE pushes the engine's
 * own bytes (the pattern) there.  Variants:
 *   digests        READ, local MR registered with ibv_reg_mr
 *   digests-iova   the same, local MR registered with an iova (SGEs name it)
 *   digests-corrupt  READ, one peer byte flipped (parent 1, slice 1, byte 5)
 *   digests-guard  READ, the engine writes the first byte of parent 0's
 *                  trailing guard while the WRs are in flight
 *   digests-write  WRITE
 *   digests-dereg  READ of one slice, the local MR deregistered before the
 *                  completion is polled */
#define DG_GUARD 1024
#define DG_PAYLOAD 5000
#define DG_PARENTS 2
#define DG_SLICE 2048
#define DG_STRIDE (DG_GUARD + DG_PAYLOAD + DG_GUARD)
#define DG_IOVA 0x100000u

static uint8_t pattern(size_t i)
{
	return (uint8_t)((i * 131u + 7u) ^ (i >> 8));
}

static void sc_digests(const char *variant)
{
	const int write = !strcmp(variant, "digests-write");
	const int iova = !strcmp(variant, "digests-iova");
	const int dereg = !strcmp(variant, "digests-dereg");
	struct ibv_send_wr wr[16], *bad = NULL;
	struct ibv_sge sge[16];
	struct rig *r = malloc(sizeof(*r));
	uint64_t base;
	size_t i;
	int p, k, n = 0;

	CHECK(r);
	rig_open(r, 0, 1, 16);
	for (i = 0; i < sizeof(r->pbuf); i++)
		r->pbuf[i] = (char)(write ? 0 : pattern(i));
	for (i = 0; i < sizeof(r->buf); i++)
		r->buf[i] = (char)(write ? pattern(i) : (i % DG_STRIDE < DG_GUARD ||
							 i % DG_STRIDE >= DG_GUARD + DG_PAYLOAD ? 0x5c : 0xa5));
	if (!strcmp(variant, "digests-corrupt"))
		r->pbuf[DG_STRIDE + DG_GUARD + DG_SLICE + 5] ^= 0x01;
	if (iova) {
		/* Swap the rig's MR for one that SGEs name by an iova. */
		CHECK(V.dereg_mr(r->mr) == 0);
		r->mr = V.reg_mr_iova(r->pd, r->buf, sizeof(r->buf), DG_IOVA, IBV_ACCESS_LOCAL_WRITE);
		CHECK(r->mr);
	}
	base = iova ? DG_IOVA : (uintptr_t)r->buf;
	for (p = 0; p < DG_PARENTS; p++)
		for (k = 0; k * DG_SLICE < DG_PAYLOAD; k++) {
			size_t off = (size_t)p * DG_STRIDE + DG_GUARD + (size_t)k * DG_SLICE;
			size_t len = DG_PAYLOAD - (size_t)k * DG_SLICE < DG_SLICE ? DG_PAYLOAD - (size_t)k * DG_SLICE
										 : DG_SLICE;

			sge[n].addr = base + off;
			sge[n].length = (uint32_t)len;
			sge[n].lkey = r->mr->lkey;
			memset(&wr[n], 0, sizeof(wr[n]));
			wr[n].wr_id = 900 + (uint64_t)n;
			wr[n].sg_list = &sge[n];
			wr[n].num_sge = 1;
			wr[n].opcode = write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
			wr[n].send_flags = IBV_SEND_SIGNALED;
			wr[n].wr.rdma.remote_addr = (uintptr_t)r->pbuf + off;
			wr[n].wr.rdma.rkey = r->pmr->rkey;
			wr[n].next = NULL;
			if (n)
				wr[n - 1].next = &wr[n];
			printf("{\"op\":\"slice\",\"wr_id\":%llu,\"parent\":%d,\"off\":%zu,\"len\":%zu}\n",
			       (unsigned long long)wr[n].wr_id, p, off, len);
			n++;
		}
	if (dereg)
		wr[0].next = NULL, n = 1;
	printf("{\"op\":\"layout\",\"guard\":%d,\"payload\":%d,\"parents\":%d,\"mr_len\":%zu,\"n\":%d}\n",
	       DG_GUARD, DG_PAYLOAD, DG_PARENTS, sizeof(r->buf), n);
	CHECK(post_any(r->qp[0], wr, &bad) == 0);
	if (!strcmp(variant, "digests-guard"))
		r->buf[DG_GUARD + DG_PAYLOAD] ^= 0x10; /* a stray write of the engine's */
	if (dereg) {
		usleep(100000); /* the READ lands; the provider then lets the MR go */
		CHECK(V.dereg_mr(r->mr) == 0);
		r->mr = V.reg_mr(r->pd, r->buf, sizeof(r->buf), IBV_ACCESS_LOCAL_WRITE);
		CHECK(r->mr);
	}
	CHECK(drain(r->cq, NULL, n, 10000) == n);
	rig_close(r);
	free(r);
}

/* ext only: a batch of two READs aborted (never posted), then a batch of an
 * inline WRITE (64 bytes copied at the call, no MR) and a READ. */
static void sc_abort(void)
{
	struct rig *r = malloc(sizeof(*r));
	struct ibv_qp_ex *x;

	CHECK(r && ext);
	rig_open(r, 0, 1, 8);
	x = V.qp_to_qp_ex(r->qp[0]);
	CHECK(x);
	ibv_wr_start(x);
	x->wr_id = 900;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(x, r->pmr->rkey, (uintptr_t)r->pbuf);
	ibv_wr_set_sge(x, r->mr->lkey, (uintptr_t)r->buf, 1000);
	x->wr_id = 901;
	ibv_wr_rdma_read(x, r->pmr->rkey, (uintptr_t)r->pbuf);
	ibv_wr_set_sge(x, r->mr->lkey, (uintptr_t)r->buf, 1000);
	ibv_wr_abort(x);
	ibv_wr_start(x);
	x->wr_id = 902;
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(x, r->pmr->rkey, (uintptr_t)r->pbuf);
	ibv_wr_set_inline_data(x, r->buf, 64);
	x->wr_id = 903;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_read(x, r->pmr->rkey, (uintptr_t)r->pbuf);
	ibv_wr_set_sge_list(x, 1, &(struct ibv_sge){ (uintptr_t)r->buf, 1000, r->mr->lkey });
	CHECK(ibv_wr_complete(x) == 0);
	CHECK(drain(r->cq, NULL, 2, 10000) == 2);
	rig_close(r);
	free(r);
}

#ifdef DRIVER_SHARED
__attribute__((visibility("default"))) int obs_driver_main(int argc, char **argv);
int obs_driver_main(int argc, char **argv)
#else
int main(int argc, char **argv)
#endif
{
	int n = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "classic") && strcmp(argv[2], "ext"))) {
		fprintf(stderr, "usage: obs_driver <scenario> [classic|ext]\n");
		return 2;
	}
	ext = argc == 3 && !strcmp(argv[2], "ext");
	load_api();
	devs = V.get_device_list(&n);
	CHECK(devs && n >= 2);
	if (!strcmp(argv[1], "accounting"))
		sc_accounting();
	else if (!strcmp(argv[1], "badwr"))
		sc_badwr();
	else if (!strcmp(argv[1], "errors"))
		sc_errors();
	else if (!strcmp(argv[1], "threads"))
		sc_threads();
	else if (!strcmp(argv[1], "withhold"))
		sc_withhold();
	else if (!strcmp(argv[1], "destroy"))
		sc_destroy(0);
	else if (!strcmp(argv[1], "destroy-retry"))
		sc_destroy(1);
	else if (!strcmp(argv[1], "abort"))
		sc_abort();
	else if (!strcmp(argv[1], "cleanup-qp"))
		sc_cleanup_qp();
	else if (!strncmp(argv[1], "digests", 7))
		sc_digests(argv[1]);
	else {
		fprintf(stderr, "unknown scenario %s\n", argv[1]);
		return 2;
	}
	V.free_device_list(devs);
	printf("{\"op\":\"done\"}\n");
	return 0;
}
#endif
