/* Core of the OrbiTE native observers: interposition, WR ledger, log.
 *
 * Interposition facts this file respects (DESIGN section 7):
 *  - ibv_post_send/ibv_poll_cq are inline calls through context->ops, so the
 *    ops are wrapped right after ibv_open_device and restored before
 *    ibv_close_device;
 *  - an engine that dlopens libibverbs with RTLD_LOCAL and dlsyms it bypasses
 *    symbol interposition, so dlsym itself is interposed: a lookup of a hooked
 *    name in a library handle returns our wrapper and remembers the real one.
 */
#define _GNU_SOURCE
#include "obs.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define OBS_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------ log -- */

static int log_fd = -1;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static void write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		buf += n;
		len -= (size_t)n;
	}
}

int obs_log_fd(void)
{
	return log_fd;
}

void obs_warn(const char *fmt, ...)
{
	char buf[512];
	int off = snprintf(buf, sizeof(buf), "orbite %s: ", obs_tool.name);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf + off, sizeof(buf) - (size_t)off - 1, fmt, ap);
	va_end(ap);
	strcat(buf, "\n");
	write_all(2, buf, strlen(buf));
}

void obs_log(const char *fmt, ...)
{
	char stackbuf[1024];
	char *buf = stackbuf;
	va_list ap;
	int n;

	if (log_fd < 0)
		return;
	va_start(ap, fmt);
	n = vsnprintf(stackbuf, sizeof(stackbuf) - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(stackbuf) - 1) {
		buf = malloc((size_t)n + 2);
		if (!buf)
			return;
		va_start(ap, fmt);
		vsnprintf(buf, (size_t)n + 1, fmt, ap);
		va_end(ap);
	}
	buf[n++] = '\n';
	/* One write per line on an O_APPEND descriptor: lines from concurrent
	 * threads never interleave, and nothing is lost to a SIGKILL. */
	pthread_mutex_lock(&log_lock);
	write_all(log_fd, buf, (size_t)n);
	pthread_mutex_unlock(&log_lock);
	if (buf != stackbuf)
		free(buf);
}

int obs_env_long(const char *name, long dflt, long min, long max, long *out)
{
	const char *s = getenv(name);
	char *end;
	long v;

	*out = dflt;
	if (!s || !*s)
		return 0;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < min || v > max) {
		obs_warn("%s=%s is not an integer in [%ld, %ld]", name, s, min, max);
		return -1;
	}
	*out = v;
	return 0;
}

/* ---------------------------------------------------------- real symbols -- */

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_fn;

static void resolve_dlsym(void)
{
	void *p;

	if (__atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE))
		return;
	/* dlvsym is not interposed, so this reaches libc's dlsym. */
	p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!p)
		p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	__atomic_store_n(&real_dlsym_fn, (dlsym_fn)p, __ATOMIC_RELEASE);
}

struct ibv_context *ibv_open_device(struct ibv_device *device) OBS_EXPORT;
int ibv_close_device(struct ibv_context *context) OBS_EXPORT;

static struct obs_hook core_hooks[] = {
	{ "ibv_open_device", (void *)ibv_open_device, NULL },
	{ "ibv_close_device", (void *)ibv_close_device, NULL },
	{ NULL, NULL, NULL },
};

static struct obs_hook *find_hook(const char *name)
{
	struct obs_hook *h;

	for (h = core_hooks; h->name; h++)
		if (!strcmp(h->name, name))
			return h;
	for (h = obs_tool.hooks; h && h->name; h++)
		if (!strcmp(h->name, name))
			return h;
	return NULL;
}

void *obs_real(const char *name)
{
	struct obs_hook *h = find_hook(name);
	void *r;

	if (h) {
		r = __atomic_load_n(&h->real, __ATOMIC_ACQUIRE);
		if (r)
			return r;
	}
	resolve_dlsym();
	if (!real_dlsym_fn)
		return NULL;
	r = real_dlsym_fn(RTLD_NEXT, name);
	if (h && r == h->wrapper)
		r = NULL;
	if (h && r)
		__atomic_store_n(&h->real, r, __ATOMIC_RELEASE);
	return r;
}

OBS_EXPORT void *dlsym(void *handle, const char *name)
{
	resolve_dlsym();
	if (handle != RTLD_NEXT && handle != RTLD_DEFAULT &&
	    !strncmp(name, "ibv_", 4)) {
		struct obs_hook *h = find_hook(name);

		if (h) {
			void *real = real_dlsym_fn(handle, name);

			if (!real || real == h->wrapper)
				return real;
			__atomic_store_n(&h->real, real, __ATOMIC_RELEASE);
			return h->wrapper;
		}
	}
	/* Kept a sibling call (see -foptimize-sibling-calls in the Makefile):
	 * glibc resolves RTLD_NEXT relative to its return address, which must
	 * stay the original caller's. */
	return real_dlsym_fn(handle, name);
}

/* ---------------------------------------------------------------- ledger -- */

typedef int (*post_send_fn)(struct ibv_qp *, struct ibv_send_wr *,
			    struct ibv_send_wr **);
typedef int (*poll_cq_fn)(struct ibv_cq *, int, struct ibv_wc *);

#define MAX_CTX 64
#define NBUCKET 4096

struct ctx_rec {
	struct ibv_context *ctx;
	char dev[IBV_SYSFS_NAME_MAX];
	post_send_fn post_send;
	poll_cq_fn poll_cq;
};

struct parent_cnt {
	uint64_t parent;
	long count;
};

struct qp_stat {
	struct ibv_context *ctx; /* NULL once the context is closed */
	uint32_t qpn;
	long inflight, max_inflight;
	struct parent_cnt *parents;
	int nparents, capparents;
	long active_parents, max_parents;
};

struct wr_ent {
	struct wr_ent *next;
	struct ibv_context *ctx;
	struct ibv_cq *cq;
	uint32_t qpn;
	uint64_t wr_id;
	uint64_t bytes;
	const char *opcode;
	struct qp_stat *qs;
	int committed; /* accepted by post_send; owned by the ledger */
	int done;      /* completed before its post_send returned */
};

static pthread_mutex_t ledger = PTHREAD_MUTEX_INITIALIZER;
static struct ctx_rec ctxs[MAX_CTX];
static int nctx;
static struct qp_stat **qstats;
static int nqstats, capqstats;
static struct wr_ent *buckets[NBUCKET];
static long accepted_wrs, joined_wrs, withheld_wrs;
static int parent_shift = -1; /* ORBITE_OBSERVER_PARENT_SHIFT, -1 = off */

static const char *const status_names[] = {
	"IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_QP_OP_ERR",
	"IBV_WC_LOC_EEC_OP_ERR", "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR",
	"IBV_WC_MW_BIND_ERR", "IBV_WC_BAD_RESP_ERR", "IBV_WC_LOC_ACCESS_ERR",
	"IBV_WC_REM_INV_REQ_ERR", "IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_OP_ERR",
	"IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR",
	"IBV_WC_LOC_RDD_VIOL_ERR", "IBV_WC_REM_INV_RD_REQ_ERR",
	"IBV_WC_REM_ABORT_ERR", "IBV_WC_INV_EECN_ERR",
	"IBV_WC_INV_EEC_STATE_ERR", "IBV_WC_FATAL_ERR",
	"IBV_WC_RESP_TIMEOUT_ERR", "IBV_WC_GENERAL_ERR", "IBV_WC_TM_ERR",
	"IBV_WC_TM_RNDV_INCOMPLETE",
};

static const char *status_name(int status)
{
	if (status >= 0 &&
	    (size_t)status < sizeof(status_names) / sizeof(status_names[0]))
		return status_names[status];
	return "UNKNOWN";
}

static struct ctx_rec *find_ctx(struct ibv_context *ctx)
{
	int i;

	for (i = 0; i < nctx; i++)
		if (ctxs[i].ctx == ctx)
			return &ctxs[i];
	return NULL;
}

int obs_context_dev(struct ibv_context *ctx, char *buf, size_t len)
{
	struct ctx_rec *r;
	int found = 0;

	pthread_mutex_lock(&ledger);
	r = find_ctx(ctx);
	if (r && len) {
		snprintf(buf, len, "%s", r->dev);
		found = 1;
	}
	pthread_mutex_unlock(&ledger);
	return found;
}

static struct qp_stat *get_qstat(struct ibv_context *ctx, uint32_t qpn)
{
	struct qp_stat *qs;
	int i;

	for (i = 0; i < nqstats; i++)
		if (qstats[i]->ctx == ctx && qstats[i]->qpn == qpn)
			return qstats[i];
	if (nqstats == capqstats) {
		int cap = capqstats ? capqstats * 2 : 16;
		struct qp_stat **n = realloc(qstats, sizeof(*n) * (size_t)cap);

		if (!n)
			return NULL;
		qstats = n;
		capqstats = cap;
	}
	qs = calloc(1, sizeof(*qs));
	if (!qs)
		return NULL;
	qs->ctx = ctx;
	qs->qpn = qpn;
	qstats[nqstats++] = qs;
	return qs;
}

static void parent_add(struct qp_stat *qs, uint64_t parent, long delta)
{
	int i;

	if (parent_shift < 0 || !qs)
		return;
	for (i = 0; i < qs->nparents; i++)
		if (qs->parents[i].parent == parent)
			break;
	if (i == qs->nparents) {
		if (delta < 0)
			return;
		if (qs->nparents == qs->capparents) {
			int cap = qs->capparents ? qs->capparents * 2 : 8;
			struct parent_cnt *n =
				realloc(qs->parents, sizeof(*n) * (size_t)cap);

			if (!n)
				return;
			qs->parents = n;
			qs->capparents = cap;
		}
		qs->parents[i].parent = parent;
		qs->parents[i].count = 0;
		qs->nparents++;
	}
	if (qs->parents[i].count == 0 && delta > 0)
		qs->active_parents++;
	qs->parents[i].count += delta;
	if (qs->parents[i].count == 0 && delta < 0) {
		qs->active_parents--;
		qs->parents[i] = qs->parents[--qs->nparents];
	}
}

static unsigned bucket_of(struct ibv_context *ctx, struct ibv_cq *cq,
			  uint32_t qpn, uint64_t wr_id)
{
	uint64_t h = (uint64_t)(uintptr_t)ctx * 0x9e3779b97f4a7c15ull;

	h ^= (uint64_t)(uintptr_t)cq * 0xc2b2ae3d27d4eb4full;
	h ^= ((uint64_t)qpn << 32) ^ wr_id;
	h ^= h >> 29;
	h *= 0xbf58476d1ce4e5b9ull;
	h ^= h >> 32;
	return (unsigned)(h % NBUCKET);
}

static void ledger_insert(struct wr_ent *e)
{
	struct wr_ent **p = &buckets[bucket_of(e->ctx, e->cq, e->qpn, e->wr_id)];

	/* Appended: of duplicate keys, the oldest is found (and joined) first. */
	while (*p)
		p = &(*p)->next;
	e->next = NULL;
	*p = e;
}

static struct wr_ent *ledger_take(struct ibv_context *ctx, struct ibv_cq *cq,
				  uint32_t qpn, uint64_t wr_id)
{
	struct wr_ent **p = &buckets[bucket_of(ctx, cq, qpn, wr_id)];

	for (; *p; p = &(*p)->next) {
		struct wr_ent *e = *p;

		if (e->ctx == ctx && e->cq == cq && e->qpn == qpn &&
		    e->wr_id == wr_id) {
			*p = e->next;
			e->next = NULL;
			return e;
		}
	}
	return NULL;
}

static void ledger_unlink(struct wr_ent *e)
{
	struct wr_ent **p = &buckets[bucket_of(e->ctx, e->cq, e->qpn, e->wr_id)];

	for (; *p; p = &(*p)->next)
		if (*p == e) {
			*p = e->next;
			e->next = NULL;
			return;
		}
}

static const char *payload_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_READ:
		return "RDMA_READ";
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		return "RDMA_WRITE";
	default:
		return NULL;
	}
}

static uint64_t wr_bytes(const struct ibv_send_wr *wr)
{
	uint64_t sum = 0;
	int i;

	for (i = 0; i < wr->num_sge; i++)
		sum += wr->sg_list[i].length;
	return sum;
}

/* ------------------------------------------------------- wrapped data ops -- */

static int obs_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			 struct ibv_send_wr **bad_wr)
{
	struct ibv_context *ctx = qp->context;
	struct wr_ent *local[16], **batch = local;
	struct ibv_send_wr *w, *stop, *bad_local = NULL;
	struct ctx_rec *rec;
	struct qp_stat *qs;
	post_send_fn orig;
	char dev[IBV_SYSFS_NAME_MAX];
	size_t n = 0, cap = 16, i;
	int ret, rejecting = 0;

	pthread_mutex_lock(&ledger);
	rec = find_ctx(ctx);
	if (!rec) {
		pthread_mutex_unlock(&ledger);
		if (bad_wr)
			*bad_wr = wr;
		return EINVAL;
	}
	orig = rec->post_send;
	/* Copied: a concurrent close may move the record. */
	memcpy(dev, rec->dev, sizeof(dev));
	qs = get_qstat(ctx, qp->qp_num);
	/* Record before posting: a completion polled by another thread before
	 * this call returns must still find (and join) its WR. */
	for (w = wr; w; w = w->next) {
		const char *op = payload_opcode(w->opcode);
		struct wr_ent *e;

		if (!op)
			continue;
		if (n == cap) {
			struct wr_ent **nb = malloc(sizeof(*nb) * cap * 2);

			if (!nb)
				break;
			memcpy(nb, batch, sizeof(*nb) * n);
			if (batch != local)
				free(batch);
			batch = nb;
			cap *= 2;
		}
		e = calloc(1, sizeof(*e));
		if (!e)
			break;
		e->ctx = ctx;
		e->cq = qp->send_cq;
		e->qpn = qp->qp_num;
		e->wr_id = w->wr_id;
		e->bytes = wr_bytes(w);
		e->opcode = op;
		e->qs = qs;
		ledger_insert(e);
		batch[n++] = e;
	}
	pthread_mutex_unlock(&ledger);

	if (!bad_wr)
		bad_wr = &bad_local;
	ret = orig(qp, wr, bad_wr);

	pthread_mutex_lock(&ledger);
	/* Only the WRs before bad_wr were accepted when the post failed. */
	stop = NULL;
	if (ret) {
		stop = wr;
		for (w = wr; w; w = w->next)
			if (w == *bad_wr) {
				stop = w;
				break;
			}
	}
	i = 0;
	for (w = wr; w && i < n; w = w->next) {
		struct wr_ent *e;

		if (ret && w == stop)
			rejecting = 1; /* bad_wr and everything after it */
		if (!payload_opcode(w->opcode))
			continue;
		e = batch[i++];
		if (rejecting) {
			if (!e->done)
				ledger_unlink(e);
			free(e);
			batch[i - 1] = NULL;
			continue;
		}
		accepted_wrs++;
		obs_log("{\"ev\":\"wr\",\"ctx\":\"%p\",\"dev\":\"%s\",\"cq\":\"%p\","
			"\"qpn\":%" PRIu32 ",\"wr_id\":%" PRIu64
			",\"opcode\":\"%s\",\"bytes\":%" PRIu64 "}",
			(void *)e->ctx, dev, (void *)e->cq, e->qpn, e->wr_id,
			e->opcode, e->bytes);
		/* Counted only while really outstanding: a WR whose completion
		 * was polled before post_send returned is not, so the maximum is
		 * a lower bound that never exceeds the send queue. */
		if (qs && !e->done) {
			qs->inflight++;
			parent_add(qs, e->wr_id >> (parent_shift < 0 ? 0 : parent_shift), 1);
		}
	}
	if (qs) {
		if (qs->inflight > qs->max_inflight)
			qs->max_inflight = qs->inflight;
		if (qs->active_parents > qs->max_parents)
			qs->max_parents = qs->active_parents;
	}
	for (i = 0; i < n; i++) {
		struct wr_ent *e = batch[i];

		if (!e)
			continue;
		if (e->done)
			free(e); /* completed before post_send returned */
		else
			e->committed = 1;
	}
	pthread_mutex_unlock(&ledger);
	if (batch != local)
		free(batch);
	return ret;
}

static int obs_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc)
{
	struct ibv_context *ctx = cq->context;
	struct ctx_rec *rec;
	poll_cq_fn orig;
	int n, i, out = 0;

	/* The ledger lock is held across the provider's poll: between the
	 * provider consuming a CQE (freeing its send-queue slot) and the ledger
	 * retiring its WR, no post_send may commit, or the in-flight count
	 * would include WRs that are already complete. */
	pthread_mutex_lock(&ledger);
	rec = find_ctx(ctx);
	orig = rec ? rec->poll_cq : NULL;
	if (!orig) {
		pthread_mutex_unlock(&ledger);
		return -1;
	}
	n = orig(cq, num, wc);
	for (i = 0; i < n; i++) {
		struct ibv_wc *c = &wc[i];
		/* Error completions carry only wr_id, status and qp_num: the
		 * join uses exactly those plus the CQ polled. */
		struct wr_ent *e = ledger_take(ctx, cq, c->qp_num, c->wr_id);
		int drop = 0;

		if (e) {
			if (e->committed) {
				if (e->qs) {
					e->qs->inflight--;
					parent_add(e->qs, e->wr_id >> (parent_shift < 0 ? 0 : parent_shift), -1);
				}
				free(e);
			} else {
				e->done = 1; /* its post_send call frees it */
			}
			if (c->status == IBV_WC_SUCCESS) {
				if (obs_tool.withhold && obs_tool.withhold(rec->dev)) {
					drop = 1;
					withheld_wrs++;
					obs_log("{\"ev\":\"withheld\",\"ctx\":\"%p\","
						"\"cq\":\"%p\",\"qpn\":%" PRIu32
						",\"wr_id\":%" PRIu64 "}",
						(void *)ctx, (void *)cq, c->qp_num,
						c->wr_id);
				} else {
					joined_wrs++;
				}
			}
		}
		if (drop)
			continue;
		obs_log("{\"ev\":\"cqe\",\"ctx\":\"%p\",\"cq\":\"%p\",\"qpn\":%" PRIu32
			",\"wr_id\":%" PRIu64 ",\"status\":%d,\"status_name\":\"%s\"}",
			(void *)ctx, (void *)cq, c->qp_num, c->wr_id, (int)c->status,
			status_name((int)c->status));
		if (out != i)
			wc[out] = *c;
		out++;
	}
	pthread_mutex_unlock(&ledger);
	return n < 0 ? n : out;
}

/* ------------------------------------------------------ context lifetime -- */

static void copy_dev_name(char *dst, struct ibv_context *ctx)
{
	size_t i;

	dst[0] = '\0';
	if (!ctx->device)
		return;
	/* Kept JSON-safe: device names are [A-Za-z0-9_.-]. */
	for (i = 0; i + 1 < IBV_SYSFS_NAME_MAX && ctx->device->name[i]; i++) {
		char ch = ctx->device->name[i];

		dst[i] = (ch == '"' || ch == '\\' || (unsigned char)ch < 0x20) ? '?' : ch;
	}
	dst[i] = '\0';
}

static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static void open_log(void);

OBS_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct ibv_context *(*real)(struct ibv_device *) =
		(struct ibv_context * (*)(struct ibv_device *)) obs_real("ibv_open_device");
	struct ibv_context *ctx;
	struct ctx_rec *rec;
	char dev[IBV_SYSFS_NAME_MAX];

	if (!real) {
		errno = ENOSYS;
		return NULL;
	}
	pthread_once(&log_once, open_log);
	ctx = real(device);
	if (!ctx)
		return NULL;
	copy_dev_name(dev, ctx);
	pthread_mutex_lock(&ledger);
	if (nctx == MAX_CTX) {
		pthread_mutex_unlock(&ledger);
		obs_warn("more than %d open contexts: %s is not observed", MAX_CTX, dev);
		return ctx;
	}
	rec = &ctxs[nctx++];
	rec->ctx = ctx;
	memcpy(rec->dev, dev, sizeof(dev));
	rec->post_send = ctx->ops.post_send;
	rec->poll_cq = ctx->ops.poll_cq;
	ctx->ops.post_send = obs_post_send;
	ctx->ops.poll_cq = obs_poll_cq;
	pthread_mutex_unlock(&ledger);
	if (obs_tool.context_opened)
		obs_tool.context_opened(ctx, dev);
	return ctx;
}

OBS_EXPORT int ibv_close_device(struct ibv_context *ctx)
{
	int (*real)(struct ibv_context *) =
		(int (*)(struct ibv_context *))obs_real("ibv_close_device");
	struct ctx_rec *rec;
	int i;

	if (!real)
		return ENOSYS;
	if (obs_tool.context_closing)
		obs_tool.context_closing(ctx);
	pthread_mutex_lock(&ledger);
	rec = find_ctx(ctx);
	if (rec) {
		if (ctx->ops.post_send == obs_post_send)
			ctx->ops.post_send = rec->post_send;
		if (ctx->ops.poll_cq == obs_poll_cq)
			ctx->ops.poll_cq = rec->poll_cq;
		/* Drop the context's open WRs (they stay counted as accepted
		 * and unjoined): a later context may reuse the pointer. */
		for (i = 0; i < NBUCKET; i++) {
			struct wr_ent **p = &buckets[i];

			while (*p) {
				struct wr_ent *e = *p;

				if (e->ctx != ctx) {
					p = &e->next;
					continue;
				}
				*p = e->next;
				if (e->committed)
					free(e);
				else
					e->done = 1;
			}
		}
		for (i = 0; i < nqstats; i++)
			if (qstats[i]->ctx == ctx)
				qstats[i]->ctx = NULL;
		*rec = ctxs[--nctx];
	}
	pthread_mutex_unlock(&ledger);
	return real(ctx);
}

/* ------------------------------------------------------------ start/exit -- */

static void write_summary(void)
{
	char *inflight = NULL, *parents = NULL;
	size_t ilen = 0, plen = 0;
	FILE *fi, *fp;
	int i, j;

	fi = open_memstream(&inflight, &ilen);
	fp = open_memstream(&parents, &plen);
	if (!fi || !fp) {
		if (fi)
			fclose(fi);
		if (fp)
			fclose(fp);
		return;
	}
	pthread_mutex_lock(&ledger);
	fputc('{', fi);
	fputc('{', fp);
	/* Keyed by QPN as contract 3 says; one QPN seen on several contexts
	 * reports the largest of its values. */
	for (i = 0, j = 0; i < nqstats; i++) {
		long mi = qstats[i]->max_inflight, mp = qstats[i]->max_parents;
		int k, dup = 0;

		for (k = 0; k < i; k++)
			if (qstats[k]->qpn == qstats[i]->qpn)
				dup = 1;
		if (dup)
			continue;
		for (k = i + 1; k < nqstats; k++)
			if (qstats[k]->qpn == qstats[i]->qpn) {
				if (qstats[k]->max_inflight > mi)
					mi = qstats[k]->max_inflight;
				if (qstats[k]->max_parents > mp)
					mp = qstats[k]->max_parents;
			}
		fprintf(fi, "%s\"%" PRIu32 "\":%ld", j ? "," : "", qstats[i]->qpn, mi);
		if (parent_shift >= 0)
			fprintf(fp, "%s\"%" PRIu32 "\":%ld", j ? "," : "", qstats[i]->qpn, mp);
		j++;
	}
	fputc('}', fi);
	fputc('}', fp);
	fclose(fi);
	fclose(fp);
	obs_log("{\"ev\":\"summary\",\"accepted_wrs\":%ld,\"joined\":%ld,"
		"\"unjoined\":%ld,\"max_inflight_per_qp\":%s,"
		"\"max_outstanding_parents_per_qp\":%s}",
		accepted_wrs, joined_wrs, accepted_wrs - joined_wrs, inflight,
		parents);
	pthread_mutex_unlock(&ledger);
	free(inflight);
	free(parents);
}

/* The log is opened by the first ibv_open_device, so that a process that
 * inherits LD_PRELOAD but never opens a device (a helper the runner spawns)
 * cannot truncate the runner's log. */
static void open_log(void)
{
	const char *path = getenv("ORBITE_OBSERVER_LOG");
	int fd, high;

	if (!path || !*path) {
		obs_warn("ORBITE_OBSERVER_LOG is not set: nothing is recorded");
		return;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0) {
		obs_warn("cannot open ORBITE_OBSERVER_LOG=%s: %s", path, strerror(errno));
		return;
	}
	/* Out of the way of engines that dup2 onto low descriptors. */
	high = fcntl(fd, F_DUPFD_CLOEXEC, 200);
	if (high >= 0) {
		close(fd);
		fd = high;
	}
	log_fd = fd;
	obs_log("{\"schema\":\"orbite.observer-log\",\"version\":1,"
		"\"tool\":\"%s\",\"pid\":%d}",
		obs_tool.name, (int)getpid());
}

__attribute__((constructor)) static void obs_start(void)
{
	long shift;

	if (obs_env_long("ORBITE_OBSERVER_PARENT_SHIFT", -1, 0, 63, &shift) == 0)
		parent_shift = (int)shift;
	if (obs_tool.init)
		obs_tool.init();
}

__attribute__((destructor)) static void obs_stop(void)
{
	if (log_fd >= 0)
		write_summary();
}
