/* SPDX-License-Identifier: Apache-2.0
 * The reference runner's verbs shim: the verbs library is dlopen'ed from the path the case pins (a
 * sealed copy whose sha256 the runner checked), the exported verbs are looked up with dlsym (which
 * the preloaded observers interpose), and the data-path verbs that <infiniband/verbs.h> inlines
 * (post_send, poll_cq, req_notify_cq) are called through context->ops, as every engine does, so an
 * observer that wrapped the ops sees each call. Every call returns 0 or an errno value.
 *
 * The extended dialect (cargo feature verbs-ex picks it; both are always compiled) creates its CQs
 * with ibv_create_cq_ex and its QPs with ibv_create_qp_ex (send_ops_flags READ and WRITE), posts
 * with ibv_wr_start / ibv_wr_rdma_read|write / ibv_wr_set_sge / ibv_wr_complete and polls with
 * ibv_start_poll / ibv_next_poll / ibv_end_poll and the read_* accessors: inlines through the
 * verbs_context and the ibv_qp_ex / ibv_cq_ex function pointers, as an engine on them calls them. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <infiniband/verbs.h>

static struct {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	const char *(*get_device_name)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
	int (*destroy_comp_channel)(struct ibv_comp_channel *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
	int (*destroy_cq)(struct ibv_cq *);
	int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
	void (*ack_cq_events)(struct ibv_cq *, unsigned int);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
	long (*provider_held)(const char *);
	long long (*provider_counter)(const char *);
	long long (*provider_ctx_counter)(struct ibv_context *, const char *);
	long (*provider_qp_outstanding)(struct ibv_qp *);
	struct ibv_qp_ex *(*qp_to_qp_ex)(struct ibv_qp *);
} V;

static int err(void) { return errno ? errno : EIO; }

int orb_load(const char *target, char *msg, size_t msg_len)
{
	void *h = dlopen(target, RTLD_NOW | RTLD_GLOBAL);
	if (!h) {
		snprintf(msg, msg_len, "%s", dlerror());
		return -1;
	}
#define SYM(field, name)                                                              \
	do {                                                                          \
		*(void **)&V.field = dlsym(h, name);                                  \
		if (!V.field) {                                                       \
			snprintf(msg, msg_len, "no symbol %s", name);                 \
			return -1;                                                    \
		}                                                                     \
	} while (0)
	SYM(get_device_list, "ibv_get_device_list");
	SYM(free_device_list, "ibv_free_device_list");
	SYM(get_device_name, "ibv_get_device_name");
	SYM(open_device, "ibv_open_device");
	SYM(close_device, "ibv_close_device");
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
#undef SYM
	/* The loopback provider's own counters (docs/provider.md); absent on rdma-core. */
	*(void **)&V.provider_held = dlsym(h, "orbite_provider_held");
	*(void **)&V.provider_counter = dlsym(h, "orbite_provider_counter");
	/* Its per-context counters and per-QP send-queue slots: the second witnesses of a round's
	 * device figures and of its drain (absent on rdma-core: the ledger then says so). */
	*(void **)&V.provider_ctx_counter = dlsym(h, "orbite_provider_ctx_counter");
	*(void **)&V.provider_qp_outstanding = dlsym(h, "orbite_provider_qp_outstanding");
	/* Exported since IBVERBS_1.6; only the extended dialect needs it (orb_create_qp_ex says so). */
	*(void **)&V.qp_to_qp_ex = dlsym(h, "ibv_qp_to_qp_ex");
	return 0;
}

int orb_has_provider_counters(void) { return V.provider_held && V.provider_counter; }
long orb_provider_held(const char *kind) { return V.provider_held ? V.provider_held(kind) : 0; }
long long orb_provider_counter(const char *name) { return V.provider_counter ? V.provider_counter(name) : 0; }
int orb_has_ctx_counters(void) { return V.provider_ctx_counter != NULL; }
int orb_has_qp_outstanding(void) { return V.provider_qp_outstanding != NULL; }
/* -1: no such counter (or no hook). */
long long orb_provider_ctx_counter(void *ctx, const char *name)
{
	return V.provider_ctx_counter ? V.provider_ctx_counter(ctx, name) : -1;
}
long orb_provider_qp_outstanding(void *qp) { return V.provider_qp_outstanding ? V.provider_qp_outstanding(qp) : -1; }

/* 0 and *ctx, ENODEV when the library lists no such device. */
int orb_open_device(const char *name, void **ctx)
{
	int n = 0, i, ret = ENODEV;
	struct ibv_device **list;
	errno = 0;
	list = V.get_device_list(&n);
	if (!list)
		return err();
	for (i = 0; i < n; i++) {
		if (strcmp(V.get_device_name(list[i]), name) == 0) {
			errno = 0;
			*ctx = V.open_device(list[i]);
			ret = *ctx ? 0 : err();
			break;
		}
	}
	V.free_device_list(list);
	return ret;
}

int orb_close_device(void *ctx) { return V.close_device(ctx); }

int orb_query_gid(void *ctx, int port, int index, uint8_t *out)
{
	union ibv_gid gid;
	errno = 0;
	if (V.query_gid(ctx, (uint8_t)port, index, &gid))
		return err();
	memcpy(out, gid.raw, 16);
	return 0;
}

int orb_alloc_pd(void *ctx, void **pd)
{
	errno = 0;
	*pd = V.alloc_pd(ctx);
	return *pd ? 0 : err();
}

int orb_dealloc_pd(void *pd) { return V.dealloc_pd(pd); }

int orb_reg_mr(void *pd, void *addr, size_t len, void **mr, uint64_t *mr_addr, uint32_t *lkey, uint32_t *rkey)
{
	struct ibv_mr *m;
	errno = 0;
	m = V.reg_mr(pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
	if (!m)
		return err();
	*mr = m;
	*mr_addr = (uint64_t)(uintptr_t)m->addr;
	*lkey = m->lkey;
	*rkey = m->rkey;
	return 0;
}

int orb_dereg_mr(void *mr) { return V.dereg_mr(mr); }

int orb_create_channel(void *ctx, void **ch, int *fd)
{
	struct ibv_comp_channel *c;
	errno = 0;
	c = V.create_comp_channel(ctx);
	if (!c)
		return err();
	*ch = c;
	*fd = c->fd;
	return 0;
}

int orb_destroy_channel(void *ch) { return V.destroy_comp_channel(ch); }

int orb_create_cq(void *ctx, int depth, void *ch, void **cq)
{
	errno = 0;
	*cq = V.create_cq(ctx, depth, NULL, ch, 0);
	return *cq ? 0 : err();
}

int orb_destroy_cq(void *cq) { return V.destroy_cq(cq); }

/* An extended CQ whose completions carry byte_len and qp_num besides wr_id and status. Its
 * ibv_cq (ibv_cq_ex_to_cq, the same address) is what QPs, events and destroy take. */
int orb_create_cq_ex(void *ctx, int depth, void *ch, void **cq)
{
	struct ibv_cq_init_attr_ex attr;
	struct ibv_cq_ex *cqx;
	memset(&attr, 0, sizeof(attr));
	attr.cqe = (uint32_t)depth;
	attr.channel = ch;
	attr.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM;
	errno = 0;
	cqx = ibv_create_cq_ex(ctx, &attr);
	if (!cqx)
		return err();
	*cq = ibv_cq_ex_to_cq(cqx);
	return 0;
}

int orb_create_qp(void *pd, void *cq, uint32_t max_send_wr, void **qp, uint32_t *qpn)
{
	struct ibv_qp_init_attr attr;
	struct ibv_qp *q;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = max_send_wr;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	errno = 0;
	q = V.create_qp(pd, &attr);
	if (!q)
		return err();
	*qp = q;
	*qpn = q->qp_num;
	return 0;
}

/* RESET -> INIT -> RTR -> RTS towards peer_qpn at peer_gid, GRH from this port's gid_index (RoCE).
 * *stage = the state that failed. */
int orb_connect_qp(void *qp, int port, int gid_index, uint32_t peer_qpn, const uint8_t *peer_gid, int *stage)
{
	struct ibv_qp_attr a;
	int ret;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.pkey_index = 0;
	a.port_num = (uint8_t)port;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	*stage = IBV_QPS_INIT;
	ret = V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer_qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = (uint8_t)port;
	a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
	a.ah_attr.grh.hop_limit = 64;
	memcpy(a.ah_attr.grh.dgid.raw, peer_gid, 16);
	*stage = IBV_QPS_RTR;
	ret = V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	*stage = IBV_QPS_RTS;
	return V.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int orb_destroy_qp(void *qp) { return V.destroy_qp(qp); }

/* An RC QP through the verbs_context's create_qp_ex, able to post RDMA READ and WRITE with the
 * ibv_wr_* calls; *qpx is the ibv_qp_ex they take. EOPNOTSUPP when the library has no
 * ibv_qp_to_qp_ex or the QP no ibv_qp_ex (the QP is destroyed again then). */
int orb_create_qp_ex(void *pd, void *cq, uint32_t max_send_wr, void **qp, void **qpx, uint32_t *qpn)
{
	struct ibv_qp_init_attr_ex attr;
	struct ibv_qp *q;
	struct ibv_qp_ex *x;
	if (!V.qp_to_qp_ex)
		return EOPNOTSUPP;
	memset(&attr, 0, sizeof(attr));
	attr.send_cq = cq;
	attr.recv_cq = cq;
	attr.qp_type = IBV_QPT_RC;
	attr.sq_sig_all = 0;
	attr.cap.max_send_wr = max_send_wr;
	attr.cap.max_recv_wr = 1;
	attr.cap.max_send_sge = 1;
	attr.cap.max_recv_sge = 1;
	/* Not IBV_QP_INIT_ATTR_PD alone: that would make the inline fall back to ibv_create_qp. */
	attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	attr.pd = pd;
	attr.send_ops_flags = IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_RDMA_WRITE;
	errno = 0;
	q = ibv_create_qp_ex(((struct ibv_pd *)pd)->context, &attr);
	if (!q)
		return err();
	x = V.qp_to_qp_ex(q);
	if (!x) {
		V.destroy_qp(q);
		return EOPNOTSUPP;
	}
	*qp = q;
	*qpx = x;
	*qpn = q->qp_num;
	return 0;
}

/* One signaled RDMA READ (read != 0) or WRITE of one SGE. */
int orb_post(void *qp, uint64_t wr_id, int read, uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t raddr,
	     uint32_t rkey)
{
	struct ibv_sge sge = {.addr = laddr, .length = len, .lkey = lkey};
	struct ibv_send_wr wr, *bad = NULL;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

/* Up to n completions: wr_id, status, byte_len, qp_num each. Returns the count or -1. */
int orb_poll(void *cq, int n, uint64_t *wr_id, int *status, uint32_t *byte_len, uint32_t *qpn)
{
	struct ibv_wc wc[64];
	int got, i;
	if (n > 64)
		n = 64;
	got = ibv_poll_cq(cq, n, wc);
	for (i = 0; i < got; i++) {
		wr_id[i] = wc[i].wr_id;
		status[i] = wc[i].status;
		byte_len[i] = wc[i].byte_len;
		qpn[i] = wc[i].qp_num;
	}
	return got;
}

/* The same WR as orb_post, as one ibv_wr_start .. ibv_wr_complete batch on the ibv_qp_ex. */
int orb_post_ex(void *qpx, uint64_t wr_id, int read, uint64_t laddr, uint32_t len, uint32_t lkey, uint64_t raddr,
		uint32_t rkey)
{
	struct ibv_qp_ex *x = qpx;
	ibv_wr_start(x);
	x->wr_id = wr_id;
	x->wr_flags = IBV_SEND_SIGNALED;
	if (read)
		ibv_wr_rdma_read(x, rkey, raddr);
	else
		ibv_wr_rdma_write(x, rkey, raddr);
	ibv_wr_set_sge(x, lkey, laddr, len);
	return ibv_wr_complete(x);
}

/* Up to n completions of an extended CQ, as orb_poll: one ibv_start_poll .. ibv_end_poll pass.
 * byte_len is read for successful completions only (an error completion's is undefined). */
int orb_poll_ex(void *cq, int n, uint64_t *wr_id, int *status, uint32_t *byte_len, uint32_t *qpn)
{
	struct ibv_cq_ex *cqx = (struct ibv_cq_ex *)cq;
	struct ibv_poll_cq_attr attr = {.comp_mask = 0};
	int got = 0, ret;
	if (n > 64)
		n = 64;
	ret = ibv_start_poll(cqx, &attr);
	if (ret == ENOENT)
		return 0;
	if (ret)
		return -ret;
	while (!ret) {
		wr_id[got] = cqx->wr_id;
		status[got] = cqx->status;
		byte_len[got] = cqx->status == IBV_WC_SUCCESS ? ibv_wc_read_byte_len(cqx) : 0;
		qpn[got] = ibv_wc_read_qp_num(cqx);
		if (++got == n)
			break;
		ret = ibv_next_poll(cqx);
	}
	ibv_end_poll(cqx);
	return ret && ret != ENOENT ? -ret : got;
}

int orb_req_notify(void *cq) { return ibv_req_notify_cq(cq, 0); }

int orb_get_cq_event(void *ch, void **cq)
{
	void *cq_ctx = NULL;
	errno = 0;
	if (V.get_cq_event(ch, (struct ibv_cq **)cq, &cq_ctx))
		return err();
	return 0;
}

void orb_ack_cq_events(void *cq, unsigned int n) { V.ack_cq_events(cq, n); }

/* Wait up to timeout_ms for any of fds to be readable; bit i of the result = fds[i] readable. */
int orb_wait_readable(const int *fds, int n, int timeout_ms)
{
	struct pollfd p[8];
	int i, mask = 0;
	if (n > 8)
		n = 8;
	for (i = 0; i < n; i++) {
		p[i].fd = fds[i];
		p[i].events = POLLIN;
		p[i].revents = 0;
	}
	if (poll(p, n, timeout_ms) < 0)
		return 0;
	for (i = 0; i < n; i++)
		if (p[i].revents & POLLIN)
			mask |= 1 << i;
	return mask;
}

/* A sealed memfd holding len bytes (the verified library), or -errno. */
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
int orb_sealed_copy(const uint8_t *data, size_t len)
{
	size_t off = 0;
	int fd = memfd_create("orbite-verbs-library", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	while (off < len) {
		ssize_t w = write(fd, data + off, len - off);
		if (w <= 0) {
			int e = errno ? errno : EIO;
			close(fd);
			return -e;
		}
		off += (size_t)w;
	}
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}
