/* Test driver for the observers: plays an engine against the fake verbs
 * device and prints what the engine saw as JSON lines on stdout (the pytest
 * wrapper compares them with the observer log).
 *
 * Built twice: DRIVER_DIRECT links libibverbs.so.1 (the fake) directly; the
 * other build dlopens it with RTLD_LOCAL and dlsyms every entry point, as
 * engines using a loader do.  Usage: obs_driver <scenario> */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_verbs.h"

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
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *,
				    struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*destroy_qp)(struct ibv_qp *);
	long (*held)(const char *);
	void (*fail_post)(struct ibv_qp *, int, int);
	void (*error_after)(struct ibv_qp *, int, enum ibv_wc_status);
	int (*outstanding)(struct ibv_qp *);
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
	V.dereg_mr = ibv_dereg_mr;
	V.create_comp_channel = ibv_create_comp_channel;
	V.destroy_comp_channel = ibv_destroy_comp_channel;
	V.create_cq = ibv_create_cq;
	V.destroy_cq = ibv_destroy_cq;
	V.create_qp = ibv_create_qp;
	V.destroy_qp = ibv_destroy_qp;
	V.held = fake_verbs_held;
	V.fail_post = fake_verbs_qp_fail_post;
	V.error_after = fake_verbs_qp_error_after;
	V.outstanding = fake_verbs_qp_outstanding;
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
	LOAD(dereg_mr, "ibv_dereg_mr");
	LOAD(create_comp_channel, "ibv_create_comp_channel");
	LOAD(destroy_comp_channel, "ibv_destroy_comp_channel");
	LOAD(create_cq, "ibv_create_cq");
	LOAD(destroy_cq, "ibv_destroy_cq");
	LOAD(create_qp, "ibv_create_qp");
	LOAD(destroy_qp, "ibv_destroy_qp");
	LOAD(held, "fake_verbs_held");
	LOAD(fail_post, "fake_verbs_qp_fail_post");
	LOAD(error_after, "fake_verbs_qp_error_after");
	LOAD(outstanding, "fake_verbs_qp_outstanding");
#undef LOAD
#endif
}

/* ---------------------------------------------------------------- rig -- */

struct rig {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp[3];
	char buf[1 << 16];
};

static struct ibv_device **devs;

static void rig_open(struct rig *r, int dev, int nqp, int sq_depth)
{
	struct ibv_qp_init_attr qa;
	int i;

	memset(r, 0, sizeof(*r));
	r->ctx = V.open_device(devs[dev]);
	CHECK(r->ctx);
	r->pd = V.alloc_pd(r->ctx);
	CHECK(r->pd);
	r->mr = V.reg_mr(r->pd, r->buf, sizeof(r->buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(r->mr);
	r->cq = V.create_cq(r->ctx, 256, NULL, NULL, 0);
	CHECK(r->cq);
	for (i = 0; i < nqp; i++) {
		/* every QP of a rig shares the rig's CQ */
		memset(&qa, 0, sizeof(qa));
		qa.send_cq = r->cq;
		qa.recv_cq = r->cq;
		qa.qp_type = IBV_QPT_RC;
		qa.cap.max_send_wr = (uint32_t)sq_depth;
		qa.cap.max_send_sge = 1;
		r->qp[i] = V.create_qp(r->pd, &qa);
		CHECK(r->qp[i]);
	}
}

static void rig_close(struct rig *r)
{
	int i;

	for (i = 0; i < 3; i++)
		if (r->qp[i])
			CHECK(V.destroy_qp(r->qp[i]) == 0);
	CHECK(V.destroy_cq(r->cq) == 0);
	CHECK(V.dereg_mr(r->mr) == 0);
	CHECK(V.dealloc_pd(r->pd) == 0);
	CHECK(V.close_device(r->ctx) == 0);
}

/* Post `n` WRs as one list: opcodes cycle through `ops`. */
static int post_list(struct rig *r, struct ibv_qp *qp, uint64_t first_id, int n,
		     const enum ibv_wr_opcode *ops, int nops, uint32_t len,
		     uint64_t *bad_id)
{
	struct ibv_send_wr wr[32], *bad = NULL;
	struct ibv_sge sge[32];
	int i, ret;

	CHECK(n <= 32);
	for (i = 0; i < n; i++) {
		sge[i].addr = (uintptr_t)r->buf;
		sge[i].length = len + (uint32_t)i;
		sge[i].lkey = r->mr->lkey;
		memset(&wr[i], 0, sizeof(wr[i]));
		wr[i].wr_id = first_id + (uint64_t)i;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = 1;
		wr[i].opcode = ops[i % nops];
		wr[i].send_flags = IBV_SEND_SIGNALED;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
	}
	ret = ibv_post_send(qp, wr, &bad);
	if (bad_id)
		*bad_id = ret && bad ? bad->wr_id : UINT64_MAX;
	printf("{\"op\":\"post\",\"qpn\":%u,\"first\":%llu,\"n\":%d,\"ret\":%d,\"bad\":%lld}\n",
	       qp->qp_num, (unsigned long long)first_id, n, ret,
	       ret && bad ? (long long)bad->wr_id : -1LL);
	return ret;
}

static int drain(struct ibv_cq *cq, int tries)
{
	struct ibv_wc wc[16];
	int total = 0, n, i;

	while (tries-- > 0) {
		n = ibv_poll_cq(cq, 16, wc);
		CHECK(n >= 0);
		for (i = 0; i < n; i++)
			printf("{\"op\":\"cqe\",\"qpn\":%u,\"wr_id\":%llu,\"status\":%d}\n",
			       wc[i].qp_num, (unsigned long long)wc[i].wr_id, (int)wc[i].status);
		total += n;
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
	struct rig r[2];
	int d, q;

	for (d = 0; d < 2; d++)
		rig_open(&r[d], d, 2, 8);
	for (d = 0; d < 2; d++)
		for (q = 0; q < 2; q++) {
			uint64_t base = ((uint64_t)d << 40) | ((uint64_t)q << 20);

			CHECK(post_list(&r[d], r[d].qp[q], base, 4, payload_ops, 4, 4096, NULL) == 0);
			CHECK(post_list(&r[d], r[d].qp[q], base + 4, 2, payload_ops, 2, 100, NULL) == 0);
		}
	for (d = 0; d < 2; d++)
		drain(r[d].cq, 2);
	for (d = 0; d < 2; d++)
		rig_close(&r[d]);
	print_held("end");
}

/* bad_wr in the middle of a list, then a full send queue. */
static void sc_badwr(void)
{
	static const enum ibv_wr_opcode reads[] = { IBV_WR_RDMA_READ };
	struct rig r;
	uint64_t bad;

	rig_open(&r, 0, 1, 8);
	V.fail_post(r.qp[0], 2, EINVAL);
	CHECK(post_list(&r, r.qp[0], 100, 5, reads, 1, 1000, &bad) == EINVAL);
	CHECK(bad == 102);
	/* 2 outstanding; depth 8: WRs 6 and 7 of this list do not fit */
	CHECK(post_list(&r, r.qp[0], 200, 8, reads, 1, 1000, &bad) == ENOMEM);
	CHECK(bad == 206);
	drain(r.cq, 2);
	rig_close(&r);
}

/* Error completions: 2 successes, one remote access error, then flushes. */
static void sc_errors(void)
{
	static const enum ibv_wr_opcode writes[] = { IBV_WR_RDMA_WRITE };
	struct rig r;

	rig_open(&r, 1, 1, 8);
	V.error_after(r.qp[0], 2, IBV_WC_REM_ACCESS_ERR);
	CHECK(post_list(&r, r.qp[0], 300, 5, writes, 1, 2048, NULL) == 0);
	drain(r.cq, 2);
	rig_close(&r);
}

/* Concurrent posting threads on three QPs sharing one CQ, one poller. */
struct thr_arg {
	struct rig *r;
	int q;
	int rounds;
};

static volatile int posting_done;

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
			wr[i].next = i < 3 ? &wr[i + 1] : NULL;
		}
		/* A full queue rejects from bad_wr on: post the rest again
		 * once the poller made room. */
		for (i = 0; i < 4;) {
			bad = NULL;
			if (ibv_post_send(a->r->qp[a->q], &wr[i], &bad) == 0) {
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
	int n, idle = 0;

	while (!__atomic_load_n(&posting_done, __ATOMIC_SEQ_CST) || idle < 100) {
		n = ibv_poll_cq(r->cq, 8, wc);
		if (n > 0) {
			got += n;
			idle = 0;
		} else if (__atomic_load_n(&posting_done, __ATOMIC_SEQ_CST)) {
			idle++;
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
	__atomic_store_n(&posting_done, 1, __ATOMIC_SEQ_CST);
	CHECK(pthread_join(pl, &res) == 0);
	printf("{\"op\":\"threads\",\"posted\":%ld,\"polled\":%ld}\n", posted, (long)(intptr_t)res);
	rig_close(r);
	free(r);
}

/* Withheld completions: post, poll until nothing comes for many tries, and
 * print what the engine saw (the test checks none of the withheld ones ever
 * shows up), then an error completion, which must pass. */
static void sc_withhold(void)
{
	static const enum ibv_wr_opcode ops[] = { IBV_WR_RDMA_READ, IBV_WR_SEND };
	struct rig r;
	int i;

	rig_open(&r, 0, 1, 8);
	CHECK(post_list(&r, r.qp[0], 500, 6, ops, 2, 512, NULL) == 0);
	drain(r.cq, 50);
	CHECK(V.outstanding(r.qp[0]) == 0); /* consumed, not queued for later */
	for (i = 0; i < 3; i++)
		drain(r.cq, 10);
	V.error_after(r.qp[0], 1, IBV_WC_RETRY_EXC_ERR);
	CHECK(post_list(&r, r.qp[0], 600, 3, ops, 1, 512, NULL) == 0);
	drain(r.cq, 50);
	rig_close(&r);
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
			c[d].cq[i] = V.create_cq(c[d].ctx, 16, NULL, c[d].ch[i], 0);
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
			c[d].qp[i] = V.create_qp(c[d].pd[i], &qa);
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
	struct rig r;
	int ret;

	rig_open(&r, 0, 1, 8);
	CHECK(post_list(&r, r.qp[0], 700, 3, reads, 1, 4096, NULL) == 0);
	drain(r.cq, 20);
	ret = V.destroy_qp(r.qp[0]);
	printf("{\"op\":\"destroy\",\"kind\":\"qp\",\"dev\":0,\"index\":0,\"ret\":%d,\"retry\":false}\n", ret);
	if (ret == 0)
		r.qp[0] = NULL;
	print_held("after");
	if (r.qp[0]) {
		/* quarantined: left as is, the process exit releases it */
		r.qp[0] = NULL;
		printf("{\"op\":\"quarantined\"}\n");
		CHECK(V.held("qp") == 1);
		return;
	}
	rig_close(&r);
}

int main(int argc, char **argv)
{
	int n = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 2) {
		fprintf(stderr, "usage: obs_driver <scenario>\n");
		return 2;
	}
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
	else if (!strcmp(argv[1], "cleanup-qp"))
		sc_cleanup_qp();
	else {
		fprintf(stderr, "unknown scenario %s\n", argv[1]);
		return 2;
	}
	V.free_device_list(devs);
	printf("{\"op\":\"done\"}\n");
	return 0;
}
