/* Fake verbs device: a stand-in libibverbs.so.1 for the observer tests.
 * See fake_verbs.h for what it models. */
#define _GNU_SOURCE
#include "fake_verbs.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define MAX_DEV 4

enum { H_CTX, H_PD, H_MR, H_MW, H_CQ, H_CHANNEL, H_QP, H_COUNT };
static const char *const held_names[H_COUNT] = { "ctx", "pd", "mr", "mw", "cq", "channel", "qp" };
static long held[H_COUNT];

static void held_add(int k, long d)
{
	__atomic_add_fetch(&held[k], d, __ATOMIC_SEQ_CST);
}

long fake_verbs_held(const char *kind)
{
	int k;

	for (k = 0; k < H_COUNT; k++)
		if (!strcmp(kind, held_names[k]))
			return __atomic_load_n(&held[k], __ATOMIC_SEQ_CST);
	return -1;
}

struct fake_ctx {
	struct ibv_context ctx;
	pthread_mutex_t lock;
	uint32_t next_handle;
	uint32_t next_qpn;
};

struct cqe_slot {
	struct ibv_wc wc;
	struct fake_qp *qp;
};

struct fake_cq {
	struct ibv_cq cq;
	pthread_mutex_t lock;
	struct cqe_slot *ring;
	int cap, head, count;
};

struct fake_qp {
	struct ibv_qp qp;
	pthread_mutex_t lock;
	int max_send_wr;
	int outstanding;
	int fail_index, fail_err;   /* one-shot post failure, -1 = none */
	int ok_left;                /* successes before the error, -1 = never */
	enum ibv_wc_status err_status;
	int errored;
};

static struct ibv_device devices[MAX_DEV];
static struct ibv_device *device_ptrs[MAX_DEV + 1];
static int ndevices;

/* ------------------------------------------------------------ commands -- */

static int cmd_style(void)
{
	const char *s = getenv("FAKE_VERBS_CMD");

	if (s && !strcmp(s, "write"))
		return 1;
	if (s && !strcmp(s, "invoke_write"))
		return 2;
	return 0;
}

/* Issue the destroy command for one object exactly as libibverbs lays it out.
 * /dev/null answers ENOTTY to the ioctl and accepts the write: both mean the
 * "kernel" got the command; any other error (EIO from the observer's filter)
 * is the destroy's result. */
static int destroy_cmd(struct ibv_context *ctx, uint16_t object, uint16_t method,
		       uint32_t write_cmd, uint32_t handle, int has_resp)
{
	struct {
		struct ib_uverbs_ioctl_hdr hdr;
		struct ib_uverbs_attr attrs[4];
	} io;
	struct {
		uint64_t response;
		uint32_t handle;
		uint32_t reserved;
	} core16 = { 0, handle, 0 };
	uint8_t resp[32];
	int style = cmd_style();

	memset(&io, 0, sizeof(io));
	memset(resp, 0, sizeof(resp));
	if (style == 1) {
		struct {
			struct ib_uverbs_cmd_hdr hdr;
			uint8_t core[16];
		} w;
		size_t core_len = has_resp ? 16 : 4;

		memset(&w, 0, sizeof(w));
		w.hdr.command = write_cmd;
		w.hdr.in_words = (uint16_t)((sizeof(w.hdr) + core_len) / 4);
		w.hdr.out_words = has_resp ? 2 : 0;
		if (has_resp) {
			core16.response = (uintptr_t)resp;
			memcpy(w.core, &core16, 16);
		} else {
			memcpy(w.core, &handle, 4);
		}
		if (write(ctx->cmd_fd, &w, sizeof(w.hdr) + core_len) < 0)
			return errno;
		return 0;
	}
	if (style == 2) {
		io.hdr.object_id = UVERBS_OBJECT_DEVICE;
		io.hdr.method_id = UVERBS_METHOD_INVOKE_WRITE;
		io.attrs[0].attr_id = UVERBS_ATTR_WRITE_CMD;
		io.attrs[0].flags = UVERBS_ATTR_F_MANDATORY;
		io.attrs[0].data = write_cmd;
		io.attrs[1].attr_id = UVERBS_ATTR_CORE_IN;
		io.attrs[1].flags = UVERBS_ATTR_F_MANDATORY;
		if (has_resp) {
			io.attrs[1].len = 16;
			io.attrs[1].data = (uintptr_t)&core16;
			io.attrs[2].attr_id = UVERBS_ATTR_CORE_OUT;
			io.attrs[2].len = 8;
			io.attrs[2].data = (uintptr_t)resp;
			io.hdr.num_attrs = 3;
		} else {
			/* up to 8 bytes travel inline */
			io.attrs[1].len = 4;
			memcpy(&io.attrs[1].data, &handle, 4);
			io.hdr.num_attrs = 2;
		}
	} else {
		io.hdr.object_id = object;
		io.hdr.method_id = method;
		io.attrs[0].attr_id = 0; /* UVERBS_ATTR_DESTROY_*_HANDLE */
		io.attrs[0].flags = UVERBS_ATTR_F_MANDATORY;
		io.attrs[0].data = handle;
		io.hdr.num_attrs = 1;
		if (has_resp) {
			io.attrs[1].attr_id = 1; /* UVERBS_ATTR_DESTROY_*_RESP */
			io.attrs[1].len = 8;
			io.attrs[1].data = (uintptr_t)resp;
			io.hdr.num_attrs = 2;
		}
	}
	io.hdr.length = (uint16_t)(sizeof(io.hdr) + sizeof(io.attrs[0]) * io.hdr.num_attrs);
	if (ioctl(ctx->cmd_fd, RDMA_VERBS_IOCTL, &io) < 0 && errno != ENOTTY)
		return errno;
	return 0;
}

static uint32_t new_handle(struct ibv_context *ctx)
{
	struct fake_ctx *fc = (struct fake_ctx *)ctx;
	uint32_t h;

	pthread_mutex_lock(&fc->lock);
	h = fc->next_handle++;
	pthread_mutex_unlock(&fc->lock);
	return h;
}

/* -------------------------------------------------------------- devices -- */

static void init_devices(void)
{
	const char *names = getenv("FAKE_VERBS_DEVICES");
	char buf[256];
	char *save = NULL, *tok;

	if (ndevices)
		return;
	snprintf(buf, sizeof(buf), "%s", names && *names ? names : "mlx5_0,mlx5_1");
	for (tok = strtok_r(buf, ",", &save); tok && ndevices < MAX_DEV;
	     tok = strtok_r(NULL, ",", &save)) {
		struct ibv_device *d = &devices[ndevices];

		snprintf(d->name, sizeof(d->name), "%s", tok);
		snprintf(d->dev_name, sizeof(d->dev_name), "uverbs%d", ndevices);
		d->node_type = IBV_NODE_CA;
		d->transport_type = IBV_TRANSPORT_IB;
		device_ptrs[ndevices++] = d;
	}
	device_ptrs[ndevices] = NULL;
}

struct ibv_device **ibv_get_device_list(int *num)
{
	struct ibv_device **list;

	init_devices();
	list = calloc((size_t)ndevices + 1, sizeof(*list));
	if (!list)
		return NULL;
	memcpy(list, device_ptrs, sizeof(*list) * (size_t)ndevices);
	if (num)
		*num = ndevices;
	return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	return status == IBV_WC_SUCCESS ? "success" : "error";
}

/* ---------------------------------------------------------- data path -- */

static int fake_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr,
			  struct ibv_send_wr **bad_wr)
{
	struct fake_qp *q = (struct fake_qp *)ibqp;
	struct fake_cq *cq = (struct fake_cq *)ibqp->send_cq;
	struct ibv_send_wr *w;
	int i, ret = 0;

	pthread_mutex_lock(&q->lock);
	for (i = 0, w = wr; w; w = w->next, i++) {
		struct cqe_slot slot;
		int k;

		if (i == q->fail_index) {
			q->fail_index = -1;
			ret = q->fail_err;
		} else if (__atomic_load_n(&q->outstanding, __ATOMIC_SEQ_CST) >= q->max_send_wr) {
			ret = ENOMEM; /* send queue full */
		}
		if (ret) {
			*bad_wr = w;
			break;
		}
		memset(&slot, 0, sizeof(slot));
		slot.qp = q;
		slot.wc.wr_id = w->wr_id;
		slot.wc.qp_num = ibqp->qp_num;
		if (q->errored || q->ok_left == 0) {
			/* Only wr_id, status and qp_num are valid in an error
			 * completion: poison the rest. */
			slot.wc.status = q->errored ? IBV_WC_WR_FLUSH_ERR : q->err_status;
			q->errored = 1;
			slot.wc.opcode = (enum ibv_wc_opcode)0x5a;
			slot.wc.byte_len = 0xdeadbeef;
			slot.wc.vendor_err = 0x77;
		} else {
			if (q->ok_left > 0)
				q->ok_left--;
			slot.wc.status = IBV_WC_SUCCESS;
			slot.wc.opcode = w->opcode == IBV_WR_RDMA_READ ? IBV_WC_RDMA_READ :
					 w->opcode == IBV_WR_SEND ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
			for (k = 0; k < w->num_sge; k++)
				slot.wc.byte_len += w->sg_list[k].length;
		}
		__atomic_add_fetch(&q->outstanding, 1, __ATOMIC_SEQ_CST);
		pthread_mutex_lock(&cq->lock);
		if (cq->count == cq->cap) {
			pthread_mutex_unlock(&cq->lock);
			__atomic_sub_fetch(&q->outstanding, 1, __ATOMIC_SEQ_CST);
			*bad_wr = w;
			ret = ENOMEM;
			break;
		}
		cq->ring[(cq->head + cq->count) % cq->cap] = slot;
		cq->count++;
		pthread_mutex_unlock(&cq->lock);
	}
	pthread_mutex_unlock(&q->lock);
	return ret;
}

static int fake_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
	struct fake_cq *cq = (struct fake_cq *)ibcq;
	int n = 0;

	pthread_mutex_lock(&cq->lock);
	while (n < num && cq->count > 0) {
		struct cqe_slot *s = &cq->ring[cq->head];

		wc[n++] = s->wc;
		__atomic_sub_fetch(&s->qp->outstanding, 1, __ATOMIC_SEQ_CST);
		cq->head = (cq->head + 1) % cq->cap;
		cq->count--;
	}
	pthread_mutex_unlock(&cq->lock);
	return n;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			  struct ibv_recv_wr **bad_wr)
{
	(void)qp;
	*bad_wr = wr;
	return EOPNOTSUPP;
}

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)cq;
	(void)solicited_only;
	return 0;
}

static struct ibv_mw *fake_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct ibv_mw *mw = calloc(1, sizeof(*mw));

	if (!mw)
		return NULL;
	mw->context = pd->context;
	mw->pd = pd;
	mw->type = type;
	mw->handle = new_handle(pd->context);
	mw->rkey = mw->handle << 8;
	held_add(H_MW, 1);
	return mw;
}

static int fake_dealloc_mw(struct ibv_mw *mw)
{
	int ret = destroy_cmd(mw->context, UVERBS_OBJECT_MW, UVERBS_METHOD_MW_DESTROY,
			      IB_USER_VERBS_CMD_DEALLOC_MW, mw->handle, 0);

	if (ret)
		return ret;
	free(mw);
	held_add(H_MW, -1);
	return 0;
}

/* ------------------------------------------------------------ contexts -- */

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct fake_ctx *fc = calloc(1, sizeof(*fc));
	int idx = (int)(device - devices);

	if (!fc)
		return NULL;
	fc->ctx.device = device;
	fc->ctx.cmd_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	fc->ctx.async_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (fc->ctx.cmd_fd < 0 || fc->ctx.async_fd < 0) {
		if (fc->ctx.cmd_fd >= 0)
			close(fc->ctx.cmd_fd);
		if (fc->ctx.async_fd >= 0)
			close(fc->ctx.async_fd);
		free(fc);
		return NULL;
	}
	fc->ctx.num_comp_vectors = 1;
	pthread_mutex_init(&fc->ctx.mutex, NULL);
	pthread_mutex_init(&fc->lock, NULL);
	fc->ctx.ops.post_send = fake_post_send;
	fc->ctx.ops.post_recv = fake_post_recv;
	fc->ctx.ops.poll_cq = fake_poll_cq;
	fc->ctx.ops.req_notify_cq = fake_req_notify_cq;
	fc->ctx.ops.alloc_mw = fake_alloc_mw;
	fc->ctx.ops.dealloc_mw = fake_dealloc_mw;
	fc->next_handle = 1;
	fc->next_qpn = 0x100 + 0x1000 * (uint32_t)(idx >= 0 && idx < MAX_DEV ? idx : 0);
	held_add(H_CTX, 1);
	return &fc->ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
	struct fake_ctx *fc = (struct fake_ctx *)ctx;

	close(ctx->cmd_fd);
	close(ctx->async_fd);
	pthread_mutex_destroy(&fc->lock);
	pthread_mutex_destroy(&ctx->mutex);
	free(fc);
	held_add(H_CTX, -1);
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd)
		return NULL;
	pd->context = ctx;
	pd->handle = new_handle(ctx);
	held_add(H_PD, 1);
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	int ret = destroy_cmd(pd->context, UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY,
			      IB_USER_VERBS_CMD_DEALLOC_PD, pd->handle, 0);

	if (ret)
		return ret;
	free(pd);
	held_add(H_PD, -1);
	return 0;
}

struct ibv_mr *(ibv_reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	struct ibv_mr *mr = calloc(1, sizeof(*mr));

	(void)access;
	if (!mr)
		return NULL;
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->handle = new_handle(pd->context);
	mr->lkey = mr->rkey = mr->handle;
	held_add(H_MR, 1);
	return mr;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
				uint64_t iova, unsigned int access)
{
	(void)iova;
	return (ibv_reg_mr)(pd, addr, length, (int)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	int ret = destroy_cmd(mr->context, UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY,
			      IB_USER_VERBS_CMD_DEREG_MR, mr->handle, 0);

	if (ret)
		return ret;
	free(mr);
	held_add(H_MR, -1);
	return 0;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));

	if (!ch)
		return NULL;
	ch->context = ctx;
	ch->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (ch->fd < 0) {
		free(ch);
		return NULL;
	}
	held_add(H_CHANNEL, 1);
	return ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	struct ibv_context *ctx = ch->context;

	pthread_mutex_lock(&ctx->mutex);
	if (ch->refcnt) {
		pthread_mutex_unlock(&ctx->mutex);
		return EBUSY;
	}
	/* As libibverbs does: close()'s result is ignored and the channel is
	 * freed.  The held counter follows the kernel object, which only goes
	 * away when close() really happened. */
	if (close(ch->fd) == 0)
		held_add(H_CHANNEL, -1);
	free(ch);
	pthread_mutex_unlock(&ctx->mutex);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct fake_cq *cq = calloc(1, sizeof(*cq));

	(void)comp_vector;
	if (!cq || cqe <= 0)
		goto fail;
	cq->ring = calloc((size_t)cqe, sizeof(*cq->ring));
	if (!cq->ring)
		goto fail;
	cq->cap = cqe;
	pthread_mutex_init(&cq->lock, NULL);
	cq->cq.context = ctx;
	cq->cq.channel = channel;
	cq->cq.cq_context = cq_context;
	cq->cq.cqe = cqe;
	cq->cq.handle = new_handle(ctx);
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	if (channel) {
		pthread_mutex_lock(&ctx->mutex);
		channel->refcnt++;
		pthread_mutex_unlock(&ctx->mutex);
	}
	held_add(H_CQ, 1);
	return &cq->cq;
fail:
	free(cq);
	errno = ENOMEM;
	return NULL;
}

int ibv_destroy_cq(struct ibv_cq *ibcq)
{
	struct fake_cq *cq = (struct fake_cq *)ibcq;
	int ret = destroy_cmd(ibcq->context, UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_DESTROY,
			      IB_USER_VERBS_CMD_DESTROY_CQ, ibcq->handle, 1);

	if (ret)
		return ret;
	if (ibcq->channel) {
		pthread_mutex_lock(&ibcq->context->mutex);
		ibcq->channel->refcnt--;
		pthread_mutex_unlock(&ibcq->context->mutex);
	}
	pthread_mutex_destroy(&cq->lock);
	pthread_mutex_destroy(&ibcq->mutex);
	pthread_cond_destroy(&ibcq->cond);
	free(cq->ring);
	free(cq);
	held_add(H_CQ, -1);
	return 0;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct fake_qp *q = calloc(1, sizeof(*q));
	struct fake_ctx *fc = (struct fake_ctx *)pd->context;

	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&q->lock, NULL);
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	q->qp.context = pd->context;
	q->qp.pd = pd;
	q->qp.send_cq = attr->send_cq;
	q->qp.recv_cq = attr->recv_cq;
	q->qp.qp_type = attr->qp_type;
	q->qp.qp_context = attr->qp_context;
	q->qp.state = IBV_QPS_RESET;
	q->qp.handle = new_handle(pd->context);
	pthread_mutex_lock(&fc->lock);
	q->qp.qp_num = fc->next_qpn++;
	pthread_mutex_unlock(&fc->lock);
	q->max_send_wr = attr->cap.max_send_wr ? (int)attr->cap.max_send_wr : 8;
	q->fail_index = -1;
	q->ok_left = -1;
	held_add(H_QP, 1);
	return &q->qp;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	if (mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct fake_qp *q = (struct fake_qp *)qp;
	int ret = destroy_cmd(qp->context, UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY,
			      IB_USER_VERBS_CMD_DESTROY_QP, qp->handle, 1);

	if (ret)
		return ret;
	pthread_mutex_destroy(&q->lock);
	pthread_mutex_destroy(&qp->mutex);
	pthread_cond_destroy(&qp->cond);
	free(q);
	held_add(H_QP, -1);
	return 0;
}

/* ------------------------------------------------------------- control -- */

void fake_verbs_qp_fail_post(struct ibv_qp *qp, int index, int err)
{
	struct fake_qp *q = (struct fake_qp *)qp;

	pthread_mutex_lock(&q->lock);
	q->fail_index = index;
	q->fail_err = err;
	pthread_mutex_unlock(&q->lock);
}

void fake_verbs_qp_error_after(struct ibv_qp *qp, int ok, enum ibv_wc_status status)
{
	struct fake_qp *q = (struct fake_qp *)qp;

	pthread_mutex_lock(&q->lock);
	q->ok_left = ok;
	q->err_status = status;
	pthread_mutex_unlock(&q->lock);
}

int fake_verbs_qp_outstanding(struct ibv_qp *qp)
{
	return __atomic_load_n(&((struct fake_qp *)qp)->outstanding, __ATOMIC_SEQ_CST);
}
