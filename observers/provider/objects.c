/* Loopback verbs provider: object lifetimes (PD, MR, MW, CQ, completion
 * channel, QP), the key table behind lkeys/rkeys, the QP state machine, and
 * the destroy commands, which are real uverbs commands on the context's
 * descriptor so that a seccomp filter sees exactly what it sees on an RNIC.
 * Dependency rules follow the kernel: a PD with MRs/MWs/QPs, a CQ with QPs, a
 * channel with CQs, an MR with bound windows cannot be destroyed (EBUSY). */
#define _GNU_SOURCE
#include "provider.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static struct pctx *ctx_of(struct ibv_context *ctx)
{
	return pctx_of(ctx);
}

static void cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
}

/* ---------------------------------------------------- uverbs commands -- */

int uverbs_destroy(struct ibv_context *ctx, uint16_t object, uint16_t method,
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

	memset(&io, 0, sizeof(io));
	memset(resp, 0, sizeof(resp));
	if (cfg.cmd_style == 1) {
		/* Legacy write(): ib_uverbs_cmd_hdr + the core request. */
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
	if (cfg.cmd_style == 2) {
		/* The legacy command carried by UVERBS_METHOD_INVOKE_WRITE. */
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
			io.attrs[1].len = 4; /* up to 8 bytes travel inline */
			memcpy(&io.attrs[1].data, &handle, 4);
			io.hdr.num_attrs = 2;
		}
	} else {
		/* The native method, as current rdma-core sends it. */
		io.hdr.object_id = object;
		io.hdr.method_id = method;
		io.attrs[0].attr_id = 0; /* UVERBS_ATTR_DESTROY_<KIND>_HANDLE */
		io.attrs[0].flags = UVERBS_ATTR_F_MANDATORY;
		io.attrs[0].data = handle;
		io.hdr.num_attrs = 1;
		if (has_resp) {
			io.attrs[1].attr_id = 1; /* UVERBS_ATTR_DESTROY_<KIND>_RESP */
			io.attrs[1].len = 8;
			io.attrs[1].data = (uintptr_t)resp;
			io.hdr.num_attrs = 2;
		}
	}
	io.hdr.length = (uint16_t)(sizeof(io.hdr) + sizeof(io.attrs[0]) * io.hdr.num_attrs);
	io.hdr.driver_id = RDMA_DRIVER_UNKNOWN;
	/* /dev/null has no ioctl: ENOTTY means the command got through. */
	if (ioctl(ctx->cmd_fd, RDMA_VERBS_IOCTL, &io) < 0 && errno != ENOTTY)
		return errno;
	return 0;
}

/* ------------------------------------------------------------- key table -- */

uint32_t key_alloc(struct pctx *c, int kind, void *obj)
{
	uint32_t idx;
	struct keyent *e;

	if (c->freekey) {
		idx = c->freekey;
		c->freekey = c->keys[idx].next_free;
	} else {
		if (c->nkeys >= (1u << 24))
			return 0;
		if (c->nkeys >= c->capkeys) {
			uint32_t cap = c->capkeys ? c->capkeys * 2 : 64;
			struct keyent *n = realloc(c->keys, sizeof(*n) * cap);

			if (!n)
				return 0;
			memset(n + c->capkeys, 0, sizeof(*n) * (cap - c->capkeys));
			c->keys = n;
			c->capkeys = cap;
		}
		idx = c->nkeys++;
		/* A per-slot starting tag, so keys of two contexts rarely match. */
		c->keys[idx].tag = (uint8_t)(idx * 37u + (uint32_t)(uintptr_t)c / 64u);
	}
	e = &c->keys[idx];
	e->kind = kind;
	e->obj = obj;
	e->tag++; /* a reused slot never hands out a stale key again */
	return idx << 8 | e->tag;
}

void key_free(struct pctx *c, uint32_t key)
{
	uint32_t idx = key >> 8;

	if (!idx || idx >= c->nkeys || c->keys[idx].kind == KEY_FREE)
		return;
	c->keys[idx].kind = KEY_FREE;
	c->keys[idx].obj = NULL;
	c->keys[idx].next_free = c->freekey;
	c->freekey = idx;
}

static struct keyent *key_lookup(struct pctx *c, uint32_t key)
{
	uint32_t idx = key >> 8;

	if (!idx || idx >= c->nkeys || c->keys[idx].kind == KEY_FREE ||
	    c->keys[idx].tag != (uint8_t)key)
		return NULL;
	return &c->keys[idx];
}

/* addr..addr+len inside base..base+blen, without overflow. */
static int in_range(uint64_t addr, uint64_t len, uint64_t base, uint64_t blen)
{
	return addr >= base && addr - base <= blen && len <= blen - (addr - base);
}

int mem_acquire(struct pctx *c, struct ibv_pd *pd, struct pqp *qp, uint32_t key,
		uint64_t addr, uint64_t len, int access, int remote, struct memref *out)
{
	struct keyent *e;
	struct pmr *mr = NULL;
	int ok = 0;

	out->ptr = NULL;
	out->mr = NULL;
	if (len == 0)
		return 0; /* a zero-length transfer touches no memory and no key */
	pthread_mutex_lock(&c->lock);
	e = key_lookup(c, key);
	if (e && e->kind == KEY_MR) {
		mr = e->obj;
		ok = !mr->dead && mr->mr.pd == pd && (mr->access & access) == access &&
		     in_range(addr, len, mr->iova, mr->mr.length);
	} else if (e && e->kind == KEY_MW && remote) {
		struct pmw *mw = e->obj;

		mr = mw->mr;
		ok = mw->bound && mr && !mr->dead && mw->mw.pd == pd &&
		     (mw->mw.type == IBV_MW_TYPE_1 || mw->qp == qp) &&
		     (mw->access & access) == access && in_range(addr, len, mw->addr, mw->length);
	}
	if (ok) {
		mr->busy++;
		out->mr = mr;
		out->ptr = (uint8_t *)mr->mr.addr + (addr - mr->iova);
	}
	pthread_mutex_unlock(&c->lock);
	return ok ? 0 : -1;
}

void mem_release(struct pctx *c, struct memref *m)
{
	if (!m->mr)
		return;
	pthread_mutex_lock(&c->lock);
	if (--m->mr->busy == 0 && m->mr->dead)
		pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	m->mr = NULL;
}

/* ------------------------------------------------------------------- PD -- */

PROV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct pctx *c = ctx_of(ctx);
	struct ppd *p = calloc(1, sizeof(*p));

	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	p->pd.context = ctx;
	p->pd.handle = ctx_new_handle(c);
	pthread_mutex_lock(&c->lock);
	p->next = c->pds;
	c->pds = p;
	pthread_mutex_unlock(&c->lock);
	held_add(H_PD, 1);
	return &p->pd;
}

static void unlink_pd(struct pctx *c, struct ppd *p)
{
	struct ppd **pp;

	for (pp = &c->pds; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			return;
		}
}

PROV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	struct pctx *c = ctx_of(pd->context);
	struct ppd *p = (struct ppd *)pd;
	int ret = uverbs_destroy(pd->context, UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY,
				 IB_USER_VERBS_CMD_DEALLOC_PD, pd->handle, 0);

	if (ret)
		return ret;
	pthread_mutex_lock(&c->lock);
	if (p->usecnt) {
		pthread_mutex_unlock(&c->lock);
		return EBUSY;
	}
	unlink_pd(c, p);
	pthread_mutex_unlock(&c->lock);
	free(p);
	held_add(H_PD, -1);
	return 0;
}

static void pd_use(struct ibv_pd *pd, long d)
{
	((struct ppd *)pd)->usecnt += d; /* ctx->lock held */
}

/* ------------------------------------------------------------------- MR -- */

/* The kernel pins the pages: an unmapped range fails with EFAULT. */
static int range_mapped(void *addr, size_t length)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)addr & ~(uintptr_t)(page - 1);
	uintptr_t end = ((uintptr_t)addr + length + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
	unsigned char vec[256];

	if ((uintptr_t)addr + length < (uintptr_t)addr)
		return 0;
	while (start < end) {
		size_t pages = (end - start) / (size_t)page;

		if (pages > sizeof(vec))
			pages = sizeof(vec);
		if (mincore((void *)start, pages * (size_t)page, vec) && errno == ENOMEM)
			return 0;
		start += pages * (size_t)page;
	}
	return 1;
}

static struct ibv_mr *reg_common(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				 unsigned int access)
{
	struct pctx *c = ctx_of(pd->context);
	struct pmr *m;
	uint32_t key;

	access &= ~(unsigned int)IBV_ACCESS_OPTIONAL_RANGE; /* best effort flags */
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE)) {
		errno = EINVAL; /* as ib_check_mr_access */
		return NULL;
	}
	if (!length) {
		errno = EINVAL;
		return NULL;
	}
	if (!range_mapped(addr, length)) {
		errno = EFAULT;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = length;
	m->iova = iova;
	m->access = (int)access;
	m->mr.handle = ctx_new_handle(c);
	pthread_mutex_lock(&c->lock);
	key = key_alloc(c, KEY_MR, m);
	if (key)
		pd_use(pd, 1);
	pthread_mutex_unlock(&c->lock);
	if (!key) {
		free(m);
		errno = ENOMEM;
		return NULL;
	}
	m->mr.lkey = m->mr.rkey = key;
	held_add(H_MR, 1);
	return &m->mr;
}

PROV_EXPORT struct ibv_mr *(ibv_reg_mr)(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return reg_common(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

PROV_EXPORT struct ibv_mr *(ibv_reg_mr_iova)(struct ibv_pd *pd, void *addr, size_t length,
					     uint64_t iova, int access)
{
	return reg_common(pd, addr, length, iova, (unsigned int)access);
}

PROV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
					    uint64_t iova, unsigned int access)
{
	return reg_common(pd, addr, length, iova, access);
}

PROV_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	struct pctx *c = ctx_of(mr->context);
	struct pmr *m = (struct pmr *)mr;
	int ret = uverbs_destroy(mr->context, UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY,
				 IB_USER_VERBS_CMD_DEREG_MR, mr->handle, 0);

	if (ret)
		return ret;
	pthread_mutex_lock(&c->lock);
	if (m->mw_bound) {
		pthread_mutex_unlock(&c->lock);
		return EBUSY; /* windows bound to it (IBA: deregister fails) */
	}
	m->dead = 1;
	key_free(c, mr->lkey);
	/* No transfer may touch the memory once dereg returns. */
	while (m->busy)
		pthread_cond_wait(&c->cond, &c->lock);
	pd_use(mr->pd, -1);
	pthread_mutex_unlock(&c->lock);
	free(m);
	held_add(H_MR, -1);
	return 0;
}

/* ------------------------------------------------------------------- MW -- */

struct ibv_mw *obj_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	struct pctx *c = ctx_of(pd->context);
	struct pmw *w;
	uint32_t key;

	if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) {
		errno = EINVAL;
		return NULL;
	}
	w = calloc(1, sizeof(*w));
	if (!w) {
		errno = ENOMEM;
		return NULL;
	}
	w->mw.context = pd->context;
	w->mw.pd = pd;
	w->mw.type = type;
	w->mw.handle = ctx_new_handle(c);
	pthread_mutex_lock(&c->lock);
	key = key_alloc(c, KEY_MW, w);
	if (key)
		pd_use(pd, 1);
	pthread_mutex_unlock(&c->lock);
	if (!key) {
		free(w);
		errno = ENOMEM;
		return NULL;
	}
	w->mw.rkey = key;
	held_add(H_MW, 1);
	return &w->mw;
}

/* ctx->lock held */
static void mw_unbind(struct pmw *w)
{
	if (w->bound && w->mr)
		w->mr->mw_bound--;
	w->bound = 0;
	w->mr = NULL;
	w->qp = NULL;
}

int obj_dealloc_mw(struct ibv_mw *mw)
{
	struct pctx *c = ctx_of(mw->context);
	struct pmw *w = (struct pmw *)mw;
	int ret = uverbs_destroy(mw->context, UVERBS_OBJECT_MW, UVERBS_METHOD_MW_DESTROY,
				 IB_USER_VERBS_CMD_DEALLOC_MW, mw->handle, 0);

	if (ret)
		return ret;
	pthread_mutex_lock(&c->lock);
	mw_unbind(w);
	key_free(c, mw->rkey);
	pd_use(mw->pd, -1);
	pthread_mutex_unlock(&c->lock);
	free(w);
	held_add(H_MW, -1);
	return 0;
}

/* ------------------------------------------------------ channels, CQs -- */

PROV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	struct pctx *c = ctx_of(ctx);
	struct pchan *ch = calloc(1, sizeof(*ch));
	int sv[2];

	if (!ch) {
		errno = ENOMEM;
		return NULL;
	}
	/* A real descriptor that becomes readable with each event; the
	 * provider sends on its end with send(), never write(). */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		free(ch);
		return NULL;
	}
	ch->ch.context = ctx;
	ch->ch.fd = sv[0];
	ch->wfd = sv[1];
	ch->ch.refcnt = 0;
	pthread_mutex_lock(&c->lock);
	ch->next = c->chans;
	c->chans = ch;
	pthread_mutex_unlock(&c->lock);
	held_add(H_CHANNEL, 1);
	return &ch->ch;
}

PROV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	struct ibv_context *ctx = channel->context;
	struct pctx *c = ctx_of(ctx);
	struct pchan *ch = (struct pchan *)channel, **pp;

	if (!ctx) {
		/* Its context was closed before it: only the descriptor is left. */
		if (close(channel->fd) == 0) {
			close(ch->wfd);
			held_add(H_CHANNEL, -1);
		}
		free(ch);
		return 0;
	}
	pthread_mutex_lock(&ctx->mutex);
	if (channel->refcnt) {
		pthread_mutex_unlock(&ctx->mutex);
		return EBUSY;
	}
	/* As libibverbs: close()'s result is ignored and the channel freed;
	 * the kernel object (the descriptor) only goes when close() did. */
	if (close(channel->fd) == 0) {
		close(ch->wfd);
		held_add(H_CHANNEL, -1);
	}
	pthread_mutex_lock(&c->lock);
	for (pp = &c->chans; *pp; pp = &(*pp)->next)
		if (*pp == ch) {
			*pp = ch->next;
			break;
		}
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_unlock(&ctx->mutex);
	free(ch);
	return 0;
}

static uint64_t next_cq_id = 1;

/* One CQ for ibv_create_cq and ibv_create_cq_ex (same ring, same poll). */
static struct pcq *cq_create(struct ibv_context *ctx, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	struct pctx *c = ctx_of(ctx);
	struct pcq *q;

	if (cqe <= 0 || cqe > 4194303 || comp_vector < 0 || comp_vector >= ctx->num_comp_vectors) {
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (!q || !(q->ring = calloc((size_t)cqe, sizeof(*q->ring)))) {
		free(q);
		errno = ENOMEM;
		return NULL;
	}
	q->cap = cqe;
	pthread_mutex_init(&q->lock, NULL);
	q->cq.context = ctx;
	q->cq.channel = channel;
	q->cq.cq_context = cq_context;
	q->cq.cqe = cqe;
	q->cq.handle = ctx_new_handle(c);
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	q->id = __atomic_fetch_add(&next_cq_id, 1, __ATOMIC_RELAXED);
	if (channel) {
		pthread_mutex_lock(&ctx->mutex);
		channel->refcnt++;
		pthread_mutex_unlock(&ctx->mutex);
	}
	pthread_mutex_lock(&c->lock);
	q->next = c->cqs;
	c->cqs = q;
	pthread_mutex_unlock(&c->lock);
	held_add(H_CQ, 1);
	return q;
}

PROV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
					 struct ibv_comp_channel *channel, int comp_vector)
{
	struct pcq *q = cq_create(ctx, cqe, cq_context, channel, comp_vector);

	return q ? &q->cq : NULL;
}

/* The wc_flags mlx5 serves that the model fills; timestamps, CVLAN, flow
 * tags and tag matching are not modelled. */
#define CQ_EX_WC_FLAGS                                                                     \
	(IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |            \
	 IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |                 \
	 IBV_WC_EX_WITH_DLID_PATH_BITS)

struct ibv_cq_ex *obj_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr)
{
	struct pcq *q;

	/* mlx5: an unknown comp_mask bit or a PD that is no parent domain
	 * (none is modelled) is EINVAL; a wc_flag or flag it cannot serve is
	 * EOPNOTSUPP. */
	if (attr->comp_mask & ~(uint32_t)(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD) ||
	    (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD)) {
		errno = EINVAL;
		return NULL;
	}
	if ((attr->wc_flags & ~(uint64_t)CQ_EX_WC_FLAGS) ||
	    ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
	     (attr->flags & ~(uint32_t)IBV_CREATE_CQ_ATTR_SINGLE_THREADED))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	q = cq_create(ctx, (int)attr->cqe, attr->cq_context, attr->channel, (int)attr->comp_vector);
	if (!q)
		return NULL;
	q->wc_flags = attr->wc_flags;
	cq_ex_init_ops(q);
	return &q->cqx;
}

static void free_cq(struct pcq *q)
{
	if (q->cq.channel) {
		pthread_mutex_lock(&q->cq.context->mutex);
		q->cq.channel->refcnt--;
		pthread_mutex_unlock(&q->cq.context->mutex);
	}
	pthread_mutex_destroy(&q->lock);
	pthread_mutex_destroy(&q->cq.mutex);
	pthread_cond_destroy(&q->cq.cond);
	free(q->ring);
	free(q);
	held_add(H_CQ, -1);
}

PROV_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct pctx *c = ctx_of(cq->context);
	struct pcq *q = (struct pcq *)cq, **pp;
	int ret = uverbs_destroy(cq->context, UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_DESTROY,
				 IB_USER_VERBS_CMD_DESTROY_CQ, cq->handle, 1);

	if (ret)
		return ret;
	pthread_mutex_lock(&c->lock);
	if (q->usecnt) {
		pthread_mutex_unlock(&c->lock);
		return EBUSY;
	}
	for (pp = &c->cqs; *pp; pp = &(*pp)->next)
		if (*pp == q) {
			*pp = q->next;
			break;
		}
	pthread_mutex_unlock(&c->lock);
	/* As libibverbs: wait until every event handed out was acknowledged. */
	pthread_mutex_lock(&cq->mutex);
	while (cq->comp_events_completed != q->events_delivered)
		pthread_cond_wait(&cq->cond, &cq->mutex);
	pthread_mutex_unlock(&cq->mutex);
	free_cq(q);
	return 0;
}

PROV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq,
				 void **cq_context)
{
	struct pctx *c = ctx_of(channel->context);

	if (!c) {
		errno = EIO;
		return -1;
	}
	for (;;) {
		struct ib_uverbs_comp_event_desc ev;
		struct pcq *q;
		ssize_t n = read(channel->fd, &ev, sizeof(ev));

		if (n < 0 && errno == EINTR)
			continue;
		if (n != (ssize_t)sizeof(ev))
			return -1;
		pthread_mutex_lock(&c->lock);
		for (q = c->cqs; q; q = q->next)
			if (q->id == ev.cq_handle && q->cq.channel == channel)
				break;
		if (q) {
			pthread_mutex_lock(&q->cq.mutex);
			q->events_delivered++;
			pthread_mutex_unlock(&q->cq.mutex);
		}
		pthread_mutex_unlock(&c->lock);
		/* An event of a CQ destroyed meanwhile is gone, as the kernel
		 * drops the queued events of a destroyed CQ. */
		if (!q)
			continue;
		*cq = &q->cq;
		*cq_context = q->cq.cq_context;
		return 0;
	}
}

PROV_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	pthread_mutex_lock(&cq->mutex);
	cq->comp_events_completed += nevents;
	pthread_cond_signal(&cq->cond);
	pthread_mutex_unlock(&cq->mutex);
}

/* ------------------------------------------------------------------ SRQ -- */

int rq_ring_alloc(uint32_t n, uint32_t nsge, struct rwqe **rq, struct ibv_sge **pool)
{
	uint32_t i;

	*rq = calloc(n, sizeof(**rq));
	*pool = calloc((size_t)n * nsge, sizeof(**pool));
	if (!*rq || !*pool) {
		free(*rq);
		free(*pool);
		return -1;
	}
	for (i = 0; i < n; i++)
		(*rq)[i].sge = *pool + (size_t)i * nsge;
	return 0;
}

static void free_srq(struct psrq *s)
{
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->srq.mutex);
	pthread_cond_destroy(&s->srq.cond);
	free(s->rq);
	free(s->sge_pool);
	free(s);
	held_add(H_SRQ, -1);
}

/* As mlx5: max_wr up to max_srq_wr, max_sge up to max_srq_sge (EINVAL
 * beyond); srq_limit is not armed at creation (ibv_modify_srq arms it). */
PROV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct pctx *c = ctx_of(pd->context);
	struct psrq *s;
	uint32_t n = attr->attr.max_wr, nsge = attr->attr.max_sge;

	if (n == 0 || n > MAX_WR - 1 || nsge > MAX_SGE) {
		errno = EINVAL;
		return NULL;
	}
	if (!nsge)
		nsge = 1;
	s = calloc(1, sizeof(*s));
	if (!s || rq_ring_alloc(n, nsge, &s->rq, &s->sge_pool)) {
		free(s);
		errno = ENOMEM;
		return NULL;
	}
	s->c = c;
	s->max_wr = n;
	s->max_sge = attr->attr.max_sge;
	pthread_mutex_init(&s->lock, NULL);
	cond_init(&s->cond);
	s->srq.context = pd->context;
	s->srq.srq_context = attr->srq_context;
	s->srq.pd = pd;
	s->srq.handle = ctx_new_handle(c);
	pthread_mutex_init(&s->srq.mutex, NULL);
	pthread_cond_init(&s->srq.cond, NULL);
	pthread_mutex_lock(&c->lock);
	s->next = c->srqs;
	c->srqs = s;
	pd_use(pd, 1);
	pthread_mutex_unlock(&c->lock);
	held_add(H_SRQ, 1);
	return &s->srq;
}

/* Reached for what ibv_create_srq_ex does not hand to ibv_create_srq: XRC
 * and tag-matching SRQs are not modelled. */
struct ibv_srq *obj_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *attr)
{
	uint32_t known = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			 IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;

	if ((attr->comp_mask & ~known) || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !attr->pd ||
	    attr->pd->context != ctx) {
		errno = EINVAL;
		return NULL;
	}
	if ((attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) && attr->srq_type == IBV_SRQT_BASIC &&
	    !(attr->comp_mask & (IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM))) {
		struct ibv_srq_init_attr a = { attr->srq_context, attr->attr };
		struct ibv_srq *srq = ibv_create_srq(attr->pd, &a);

		return srq;
	}
	errno = EOPNOTSUPP;
	return NULL;
}

PROV_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	struct psrq *s = (struct psrq *)srq;
	int ret = 0;

	if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT))
		return EINVAL;
	pthread_mutex_lock(&s->lock);
	if (mask & IBV_SRQ_MAX_WR) {
		/* A resize keeps what is queued (rxe's rule: not below it). */
		uint32_t n = attr->max_wr, nsge = s->max_sge ? s->max_sge : 1;
		struct rwqe *rq;
		struct ibv_sge *pool;
		uint64_t k;

		if (n == 0 || n > MAX_WR - 1 || n < s->head - s->tail ||
		    ((mask & IBV_SRQ_LIMIT) ? attr->srq_limit : s->limit) > n) {
			ret = EINVAL;
		} else if (rq_ring_alloc(n, nsge, &rq, &pool)) {
			ret = ENOMEM;
		} else {
			for (k = s->tail; k < s->head; k++) {
				struct rwqe *from = &s->rq[k % s->max_wr], *to = &rq[(k - s->tail) % n];

				to->wr_id = from->wr_id;
				to->num_sge = from->num_sge;
				memcpy(to->sge, from->sge, sizeof(*to->sge) * (size_t)from->num_sge);
			}
			free(s->rq);
			free(s->sge_pool);
			s->rq = rq;
			s->sge_pool = pool;
			s->head -= s->tail;
			s->tail = 0;
			s->max_wr = n;
		}
	}
	if (!ret && (mask & IBV_SRQ_LIMIT)) {
		if (attr->srq_limit > s->max_wr)
			ret = EINVAL;
		else
			s->limit = attr->srq_limit; /* 0 disarms */
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

PROV_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	struct psrq *s = (struct psrq *)srq;

	pthread_mutex_lock(&s->lock);
	attr->max_wr = s->max_wr;
	attr->max_sge = s->max_sge;
	attr->srq_limit = s->limit;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

PROV_EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	struct psrq *s = (struct psrq *)srq, **pp;
	struct pctx *c = s->c;
	int ret = uverbs_destroy(srq->context, UVERBS_OBJECT_SRQ, UVERBS_METHOD_SRQ_DESTROY,
				 IB_USER_VERBS_CMD_DESTROY_SRQ, srq->handle, 1);

	if (ret)
		return ret;
	pthread_mutex_lock(&c->lock);
	if (s->usecnt) {
		pthread_mutex_unlock(&c->lock);
		return EBUSY;
	}
	for (pp = &c->srqs; *pp; pp = &(*pp)->next)
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	pd_use(srq->pd, -1);
	pthread_mutex_unlock(&c->lock);
	free_srq(s);
	return 0;
}

/* ------------------------------------------------------------------- QP -- */

static uint32_t qpn_seq;

/* One listening socket per distinct IPv4 address of the device's GIDs, all
 * on the same ephemeral port, which the QPN carries (port << 8 | seq). */
static int qp_listen(struct pqp *q)
{
	uint32_t addrs[MAX_LISTEN];
	int n = dev_ipv4_addrs(q->c->dev, addrs, MAX_LISTEN), attempt, i;
	char list[MAX_LISTEN * 18] = "";

	for (i = 0; i < n; i++) {
		char a[INET_ADDRSTRLEN];

		inet_ntop(AF_INET, &addrs[i], a, sizeof(a));
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s", i ? "," : "", a);
	}
	for (attempt = 0; attempt < 64; attempt++) {
		uint16_t port = 0;
		int retry = 0;

		q->nlfd = 0;
		for (i = 0; i < n && !retry; i++) {
			struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = addrs[i],
						  .sin_port = htons(port) };
			/* non-blocking: the responder takes whatever is there, never waits;
			 * a burst of connections waits in the backlog, not as dropped SYNs */
			int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
			socklen_t sl = sizeof(sa);

			if (fd < 0)
				break;
			if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 64)) {
				int err = errno;

				close(fd);
				if (err == EADDRINUSE && port)
					retry = 1;
				continue; /* EADDRNOTAVAIL: not configured on this host */
			}
			if (!port) {
				getsockname(fd, (struct sockaddr *)&sa, &sl);
				port = ntohs(sa.sin_port);
			}
			q->lfd[q->nlfd++] = fd;
		}
		if (!retry && q->nlfd) {
			q->lport = port;
			return 0;
		}
		while (q->nlfd)
			close(q->lfd[--q->nlfd]);
		if (!retry)
			break;
	}
	prov_warn("%s: cannot listen for RC connections: none of the device's IPv4 GID "
		  "addresses (%s) is configured on this host (in the simulated lab: "
		  "use loopback addresses or add them to lo)",
		  q->c->dev->dev.name, n ? list : "none");
	return -1;
}

static void free_qp_mem(struct pqp *q)
{
	free(q->sq);
	free(q->sge_pool);
	free(q->inl_pool);
	free(q->rq);
	free(q->rsge_pool);
	pthread_mutex_destroy(&q->lock);
	pthread_cond_destroy(&q->cond);
	pthread_cond_destroy(&q->txcv);
	pthread_mutex_destroy(&q->qp.mutex);
	pthread_cond_destroy(&q->qp.cond);
	qp_ex_free(q);
	free(q);
}

/* One QP for ibv_create_qp and ibv_create_qp_ex (is_ex: the latter with
 * IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, the wr_* family for send_ops). */
static struct ibv_qp *qp_create(struct ibv_pd *pd, struct ibv_qp_init_attr *attr, int is_ex,
				uint64_t send_ops)
{
	struct pctx *c = ctx_of(pd->context);
	struct ibv_qp_cap *cap = &attr->cap;
	struct pqp *q;
	uint32_t i, sq_n, ssge, rq_n, rsge;

	if (attr->qp_type != IBV_QPT_RC) {
		errno = EOPNOTSUPP; /* only RC is modelled */
		return NULL;
	}
	if (!attr->send_cq || !attr->recv_cq || cap->max_send_wr > MAX_WR ||
	    cap->max_recv_wr > MAX_WR || cap->max_send_sge > MAX_SGE ||
	    cap->max_recv_sge > MAX_SGE || cap->max_inline_data > MAX_INLINE ||
	    attr->send_cq->context != pd->context || attr->recv_cq->context != pd->context ||
	    (attr->srq && attr->srq->context != pd->context)) {
		errno = EINVAL;
		return NULL;
	}
	q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return NULL;
	}
	q->c = c;
	q->cap = *cap;
	sq_n = cap->max_send_wr ? cap->max_send_wr : 1;
	ssge = cap->max_send_sge ? cap->max_send_sge : 1;
	rq_n = cap->max_recv_wr ? cap->max_recv_wr : 1;
	rsge = cap->max_recv_sge ? cap->max_recv_sge : 1;
	q->sq = calloc(sq_n, sizeof(*q->sq));
	q->sge_pool = calloc((size_t)sq_n * ssge, sizeof(*q->sge_pool));
	q->inl_pool = calloc((size_t)sq_n, cap->max_inline_data ? cap->max_inline_data : 1);
	q->rq = calloc(rq_n, sizeof(*q->rq));
	q->rsge_pool = calloc((size_t)rq_n * rsge, sizeof(*q->rsge_pool));
	pthread_mutex_init(&q->lock, NULL);
	cond_init(&q->cond);
	cond_init(&q->txcv);
	pthread_mutex_init(&q->qp.mutex, NULL);
	pthread_cond_init(&q->qp.cond, NULL);
	q->ofd = q->ifd = q->wakefd = -1;
	for (i = 0; i < MAX_HANDSHAKES; i++)
		q->hs[i].fd = -1;
	if (!q->sq || !q->sge_pool || !q->inl_pool || !q->rq || !q->rsge_pool) {
		free_qp_mem(q);
		errno = ENOMEM;
		return NULL;
	}
	for (i = 0; i < sq_n; i++) {
		q->sq[i].sge = q->sge_pool + (size_t)i * ssge;
		q->sq[i].inl = q->inl_pool + (size_t)i * (cap->max_inline_data ? cap->max_inline_data : 1);
	}
	for (i = 0; i < rq_n; i++)
		q->rq[i].sge = q->rsge_pool + (size_t)i * rsge;
	q->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (q->wakefd < 0 || qp_listen(q)) {
		if (q->wakefd >= 0)
			close(q->wakefd);
		free_qp_mem(q);
		errno = EADDRNOTAVAIL;
		return NULL;
	}
	q->qp.context = pd->context;
	q->qp.qp_context = attr->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = attr->send_cq;
	q->qp.recv_cq = attr->recv_cq;
	q->qp.qp_type = IBV_QPT_RC;
	q->qp.state = IBV_QPS_RESET;
	q->qp.handle = ctx_new_handle(c);
	q->qp.qp_num = (uint32_t)q->lport << 8 |
		       (__atomic_fetch_add(&qpn_seq, 1, __ATOMIC_RELAXED) & 0xffu);
	q->sq_sig_all = attr->sq_sig_all;
	q->srq = (struct psrq *)attr->srq;
	q->qp.srq = attr->srq;
	q->pending_err = IBV_WC_SUCCESS;
	q->stall_next = UINT64_MAX;
	if (is_ex) {
		q->is_ex = 1;
		qp_ex_init_ops(q, send_ops);
	}
	if (qp_start_responder(q)) {
		while (q->nlfd)
			close(q->lfd[--q->nlfd]);
		close(q->wakefd);
		free_qp_mem(q);
		errno = EAGAIN;
		return NULL;
	}
	pthread_mutex_lock(&c->lock);
	if (c->nqps == c->capqps) {
		int ncap = c->capqps ? c->capqps * 2 : 16;
		struct pqp **n = realloc(c->qps, sizeof(*n) * (size_t)ncap);

		if (n) {
			c->qps = n;
			c->capqps = ncap;
		}
	}
	if (c->nqps < c->capqps)
		c->qps[c->nqps++] = q;
	pd_use(pd, 1);
	((struct pcq *)attr->send_cq)->usecnt++;
	((struct pcq *)attr->recv_cq)->usecnt++;
	if (q->srq)
		q->srq->usecnt++;
	pthread_mutex_unlock(&c->lock);
	held_add(H_QP, 1);
	return &q->qp;
}

PROV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	return qp_create(pd, attr, 0, 0);
}

/* The send_ops_flags the model serves on RC (mlx5 serves these and more:
 * TSO and ATOMIC_WRITE are not modelled). */
#define QP_EX_SEND_OPS                                                                        \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND | \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_READ | \
	 IBV_QP_EX_WITH_LOCAL_INV |                                                             \
	 IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |                          \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
/* The comp_mask bits mlx5 knows; of them only PD, CREATE_FLAGS (no flag)
 * and SEND_OPS_FLAGS are modelled. */
#define QP_EX_MLX5_MASK                                                                     \
	(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_CREATE_FLAGS |      \
	 IBV_QP_INIT_ATTR_MAX_TSO_HEADER | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH | \
	 IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)

struct ibv_qp *obj_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr)
{
	struct ibv_qp_init_attr a;
	uint32_t mask = attr->comp_mask;
	int is_ex = (mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0;

	if ((mask & ~(uint32_t)QP_EX_MLX5_MASK) || !(mask & IBV_QP_INIT_ATTR_PD) || !attr->pd ||
	    attr->pd->context != ctx) {
		errno = EINVAL; /* an RC QP needs its PD */
		return NULL;
	}
	if ((mask & ~(uint32_t)(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS |
				IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) ||
	    ((mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags) ||
	    (is_ex && (attr->send_ops_flags & ~(uint64_t)QP_EX_SEND_OPS))) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	memset(&a, 0, sizeof(a));
	a.qp_context = attr->qp_context;
	a.send_cq = attr->send_cq;
	a.recv_cq = attr->recv_cq;
	a.srq = attr->srq;
	a.cap = attr->cap;
	a.qp_type = attr->qp_type;
	a.sq_sig_all = attr->sq_sig_all;
	return qp_create(attr->pd, &a, is_ex, is_ex ? attr->send_ops_flags : 0);
}

PROV_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	struct pqp *q = (struct pqp *)qp;

	/* As rdma-core: NULL, errno untouched, for a QP without send_ops. */
	return q->is_ex ? &q->qpx : NULL;
}

/* Required attributes of each RC transition, as the kernel's state table. */
static int transition_ok(enum ibv_qp_state cur, enum ibv_qp_state next, int mask)
{
	const int init_req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	const int rtr_req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	const int rts_req = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			    IBV_QP_MAX_QP_RD_ATOMIC;

	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
		return 1;
	if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT)
		return (mask & init_req) == init_req;
	if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT)
		return 1;
	if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR)
		return (mask & rtr_req) == rtr_req;
	if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS)
		return (mask & rts_req) == rts_req;
	if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS)
		return 1;
	return 0;
}

static int check_av(struct pqp *q, const struct ibv_ah_attr *ah, int port)
{
	struct ibv_port_attr pa;
	union ibv_gid gid;
	char rel[96], buf[32];

	memset(&pa, 0, sizeof(pa));
	if (orbite_ibv_query_port(q->qp.context, (uint8_t)port, &pa))
		return EINVAL;
	/* RoCE needs a GRH: the destination is named by its GID. */
	if (pa.link_layer == IBV_LINK_LAYER_ETHERNET && !ah->is_global)
		return EINVAL;
	if (ah->is_global) {
		if (ah->grh.sgid_index >= pa.gid_tbl_len ||
		    dev_gid(q->c->dev, port, ah->grh.sgid_index, &gid))
			return EINVAL;
		snprintf(rel, sizeof(rel), "ports/%d/gid_attrs/types/%d", port, ah->grh.sgid_index);
		if (sysfs_read(q->c->dev->sysdir, rel, buf, sizeof(buf)) <= 0)
			return EINVAL; /* an unused GID slot */
	}
	return 0;
}

PROV_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	struct pqp *q = (struct pqp *)qp;
	enum ibv_qp_state cur, next;
	int port, ret;

	pthread_mutex_lock(&q->lock);
	cur = qp->state;
	next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	if (((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) ||
	    next == IBV_QPS_SQD || next == IBV_QPS_SQE || next == IBV_QPS_UNKNOWN ||
	    !transition_ok(cur, next, mask)) {
		pthread_mutex_unlock(&q->lock);
		return EINVAL;
	}
	port = (mask & IBV_QP_PORT) ? attr->port_num : q->port;
	if (((mask & IBV_QP_PORT) && (port < 1 || port > q->c->dev->nports)) ||
	    ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) ||
	    ((mask & IBV_QP_DEST_QPN) && attr->dest_qp_num >= (1u << 24)) ||
	    ((mask & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096)) ||
	    ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > 16) ||
	    ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > 16)) {
		pthread_mutex_unlock(&q->lock);
		return EINVAL;
	}
	if (mask & IBV_QP_AV) {
		ret = check_av(q, &attr->ah_attr, port);
		if (ret) {
			pthread_mutex_unlock(&q->lock);
			return ret;
		}
	}
	if (mask & IBV_QP_PORT)
		q->port = port;
	if (mask & IBV_QP_ACCESS_FLAGS) /* read by the responder without the lock */
		__atomic_store_n(&q->access, (int)attr->qp_access_flags, __ATOMIC_RELEASE);
	if (mask & IBV_QP_AV) {
		q->ah = attr->ah_attr;
		q->dgid = attr->ah_attr.grh.dgid;
		q->sgid_index = attr->ah_attr.grh.sgid_index;
		dev_gid(q->c->dev, q->port, q->sgid_index, &q->sgid);
	}
	if (mask & IBV_QP_PATH_MTU)
		q->path_mtu = attr->path_mtu;
	if (mask & IBV_QP_DEST_QPN)
		q->dest_qpn = attr->dest_qp_num;
	if (mask & IBV_QP_RQ_PSN)
		q->rq_psn = attr->rq_psn;
	if (mask & IBV_QP_SQ_PSN)
		q->sq_psn = attr->sq_psn;
	if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
		q->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
		q->max_rd_atomic = attr->max_rd_atomic;
	if (mask & IBV_QP_MIN_RNR_TIMER)
		q->min_rnr_timer = attr->min_rnr_timer;
	if (mask & IBV_QP_TIMEOUT)
		q->timeout = attr->timeout;
	if (mask & IBV_QP_RETRY_CNT)
		q->retry_cnt = attr->retry_cnt;
	if (mask & IBV_QP_RNR_RETRY)
		q->rnr_retry = attr->rnr_retry;

	if (next == cur) {
		pthread_mutex_unlock(&q->lock);
		return 0;
	}
	if (next == IBV_QPS_ERR) {
		qp_set_error_locked(q, IBV_WC_WR_FLUSH_ERR);
		pthread_mutex_unlock(&q->lock);
		return 0;
	}
	if (next == IBV_QPS_RESET) {
		qp->state = IBV_QPS_RESET;
		qp_wake(q);
		pthread_mutex_unlock(&q->lock);
		qp_stop_requester(q);
		pthread_mutex_lock(&q->lock);
		/* Work requests are discarded without completions. */
		q->sq_head = q->sq_tx = q->sq_rx = 0;
		__atomic_store_n(&q->sq_tail, 0, __ATOMIC_SEQ_CST);
		q->rq_head = q->rq_tail = 0;
		q->flushed = 0;
		q->pending_err = IBV_WC_SUCCESS;
		if (q->ifd >= 0)
			shutdown(q->ifd, SHUT_RDWR);
		pthread_mutex_unlock(&q->lock);
		cq_purge_qp((struct pcq *)qp->send_cq, q);
		cq_purge_qp((struct pcq *)qp->recv_cq, q);
		return 0;
	}
	qp->state = next;
	qp_wake(q);
	ret = 0;
	if (next == IBV_QPS_RTS && qp_start_requester(q))
		ret = ENOMEM;
	pthread_mutex_unlock(&q->lock);
	return ret;
}

PROV_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
			     struct ibv_qp_init_attr *init)
{
	struct pqp *q = (struct pqp *)qp;

	(void)mask; /* every attribute is returned, as providers do */
	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	pthread_mutex_lock(&q->lock);
	attr->qp_state = qp->state;
	attr->cur_qp_state = qp->state;
	attr->path_mtu = (enum ibv_mtu)q->path_mtu;
	attr->qp_access_flags = (unsigned int)q->access;
	attr->port_num = (uint8_t)q->port;
	attr->ah_attr = q->ah;
	attr->dest_qp_num = q->dest_qpn;
	attr->rq_psn = q->rq_psn;
	attr->sq_psn = q->sq_psn;
	attr->max_rd_atomic = (uint8_t)q->max_rd_atomic;
	attr->max_dest_rd_atomic = (uint8_t)q->max_dest_rd_atomic;
	attr->min_rnr_timer = (uint8_t)q->min_rnr_timer;
	attr->timeout = (uint8_t)q->timeout;
	attr->retry_cnt = (uint8_t)q->retry_cnt;
	attr->rnr_retry = (uint8_t)q->rnr_retry;
	attr->cap = q->cap;
	init->qp_context = qp->qp_context;
	init->send_cq = qp->send_cq;
	init->recv_cq = qp->recv_cq;
	init->cap = q->cap;
	init->qp_type = qp->qp_type;
	init->sq_sig_all = q->sq_sig_all;
	init->srq = qp->srq;
	pthread_mutex_unlock(&q->lock);
	return 0;
}

/* Release a QP that no thread uses any more; ctx->lock held. */
static void qp_release_locked(struct pctx *c, struct pqp *q)
{
	int i;

	for (i = 0; i < c->nqps; i++)
		if (c->qps[i] == q) {
			c->qps[i] = c->qps[--c->nqps];
			break;
		}
	/* Type-2 windows bound through it are invalidated with it. */
	for (i = 1; i < (int)c->nkeys; i++)
		if (c->keys[i].kind == KEY_MW && ((struct pmw *)c->keys[i].obj)->qp == q)
			mw_unbind(c->keys[i].obj);
	pd_use(q->qp.pd, -1);
	((struct pcq *)q->qp.send_cq)->usecnt--;
	((struct pcq *)q->qp.recv_cq)->usecnt--;
	if (q->srq)
		q->srq->usecnt--;
}

static void qp_teardown(struct pqp *q)
{
	qp_stop_all(q);
	while (q->nlfd)
		close(q->lfd[--q->nlfd]);
	close(q->wakefd);
	cq_purge_qp((struct pcq *)q->qp.send_cq, q);
	cq_purge_qp((struct pcq *)q->qp.recv_cq, q);
}

PROV_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	struct pqp *q = (struct pqp *)qp;
	struct pctx *c = q->c;
	int ret = uverbs_destroy(qp->context, UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY,
				 IB_USER_VERBS_CMD_DESTROY_QP, qp->handle, 1);

	if (ret)
		return ret; /* the QP is exactly as it was */
	qp_teardown(q);
	pthread_mutex_lock(&c->lock);
	qp_release_locked(c, q);
	pthread_mutex_unlock(&c->lock);
	free_qp_mem(q);
	held_add(H_QP, -1);
	return 0;
}

/* ------------------------------------------------------- context close -- */

void objects_close_context(struct pctx *c)
{
	struct pcq *cq;
	struct ppd *pd;
	uint32_t i;

	pthread_mutex_lock(&c->lock);
	c->closing = 1;
	while (c->nqps) {
		struct pqp *q = c->qps[c->nqps - 1];

		pthread_mutex_unlock(&c->lock);
		qp_teardown(q);
		pthread_mutex_lock(&c->lock);
		qp_release_locked(c, q);
		free_qp_mem(q);
		held_add(H_QP, -1);
	}
	for (i = 1; i < c->nkeys; i++) {
		if (c->keys[i].kind == KEY_MW) {
			free(c->keys[i].obj);
			held_add(H_MW, -1);
		} else if (c->keys[i].kind == KEY_MR) {
			free(c->keys[i].obj);
			held_add(H_MR, -1);
		}
		c->keys[i].kind = KEY_FREE;
	}
	while (c->srqs) {
		struct psrq *sq = c->srqs;

		c->srqs = sq->next;
		free_srq(sq);
	}
	while ((cq = c->cqs)) {
		c->cqs = cq->next;
		pthread_mutex_unlock(&c->lock);
		free_cq(cq);
		pthread_mutex_lock(&c->lock);
	}
	while ((pd = c->pds)) {
		c->pds = pd->next;
		free(pd);
		held_add(H_PD, -1);
	}
	/* Completion channels are descriptors of their own: they outlive the
	 * context, as with libibverbs, until ibv_destroy_comp_channel. */
	while (c->chans) {
		struct pchan *ch = c->chans;

		c->chans = ch->next;
		ch->next = NULL;
		ch->ch.context = NULL;
	}
	pthread_mutex_unlock(&c->lock);
}

/* ------------------------------------------------------- key queries -- */

/* What the key domain of ctx says about `key` now (see orbite_provider.h):
 * the live object behind it and, for "windows" and "length", its bindings
 * and extent.  A quarantined MR or MW (a failed dereg/dealloc) still
 * answers; a released or stale key answers "kind" 0 and -1 otherwise. */
PROV_EXPORT long orbite_provider_key_query(struct ibv_context *ctx, uint32_t key, const char *what)
{
	struct pctx *c;
	struct keyent *e;
	long out = -1;

	if (!ctx || !what)
		return -1;
	c = ctx_of(ctx);
	pthread_mutex_lock(&c->lock);
	e = key_lookup(c, key);
	if (!strcmp(what, "kind")) {
		out = e ? (e->kind == KEY_MR ? 1 : 2) : 0;
	} else if (e && !strcmp(what, "windows")) {
		out = e->kind == KEY_MR ? ((struct pmr *)e->obj)->mw_bound : ((struct pmw *)e->obj)->bound;
	} else if (e && !strcmp(what, "length")) {
		out = e->kind == KEY_MR ? (long)((struct pmr *)e->obj)->mr.length
					: (long)((struct pmw *)e->obj)->length;
	}
	pthread_mutex_unlock(&c->lock);
	return out;
}
