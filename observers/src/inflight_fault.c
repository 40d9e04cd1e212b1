/* inflight_fault: armed by ORBITE_INFLIGHT_FAULT_ARMED=1 on the requester of
 * installed-inflight-dma (docs/inflight_dma.md).  It interrupts one payload
 * WR part way through its DMA: the engine only sees that WR fail.
 *
 * It passes ORBITE_INFLIGHT_FAULT_SKIP payload WRs untouched.  For the next
 * one (the selected WR) it asks the verbs provider to stop that WR's copy
 * after ORBITE_INFLIGHT_FAULT_BYTES bytes (orbite_provider_qp_stall: the
 * provider's test hook; the copy then waits for the QP to leave RTS), lets
 * the engine's post go to the real post_send, waits until the provider
 * reports the copy reached that point (its "stalls" counter), and moves the
 * QP to IBV_QPS_ERR with the real ibv_modify_qp (the QP state only: no port,
 * no device is touched; the port state is queried before and after).  The
 * provider then delivers the WR's flush completion, which this observer joins
 * to the WR by CQ, QPN and WR ID; the destroy of that QP is logged with its
 * result.  A READ's destination is local: its bytes are hashed when the
 * error completion is polled (a second witness of what landed).
 *
 *   ORBITE_INFLIGHT_FAULT_SKIP     payload WRs passed first (0)
 *   ORBITE_INFLIGHT_FAULT_BYTES    bytes the copy moves before it stops (> 0
 *                                  and below the selected WR's length)
 *   ORBITE_INFLIGHT_FAULT_WAIT_MS  how long to wait for the stall point
 *                                  (20000)
 *
 * Log events (besides the core's wr/cqe/data records):
 *   {"ev":"inflight_fault", ctx, cq, qpn, wr_id, opcode, bytes, stall_bytes,
 *    stalled, landed_local, modify_qp, state_before, state_after,
 *    port_state_before, port_state_after, post_ret}
 *   {"ev":"inflight_cqe", ctx, cq, qpn, wr_id, status, status_name, byte_len,
 *    dest_sha256 (READ) or null}
 *   {"ev":"inflight_destroy", qpn, ret, after_cqe}
 *   {"ev":"not_armed", reason}
 * It never invents data or completions.
 */
#define _GNU_SOURCE
#include "obs.h"
#include "sha256.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int armed;
static long skip, stall_bytes, wait_ms;
static long seen; /* payload WRs posted so far */
static char not_armed_reason[160];
static int not_armed_logged;
static pthread_mutex_t flock = PTHREAD_MUTEX_INITIALIZER;

/* The selected WR, once posted. */
static struct {
	int posted, cqe_seen, destroyed;
	struct ibv_context *ctx;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint32_t qpn;
	uint64_t wr_id;
	int read;
	void *laddr;
	uint64_t len;
} sel;

typedef int (*stall_fn)(struct ibv_qp *, uint64_t, long);
typedef long long (*counter_fn)(const char *);
typedef long long (*ctx_counter_fn)(struct ibv_context *, const char *);
typedef int (*modify_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);
typedef int (*query_qp_fn)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
typedef int (*query_port_fn)(struct ibv_context *, uint8_t, struct ibv_port_attr *);

static void refuse(const char *reason)
{
	snprintf(not_armed_reason, sizeof(not_armed_reason), "%s", reason);
	obs_warn("not armed: %s", reason);
}

static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int qp_state(struct ibv_qp *qp)
{
	query_qp_fn q = (query_qp_fn)obs_real("ibv_query_qp");
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	if (!q || q(qp, &a, IBV_QP_STATE, &ia))
		return -1;
	return (int)a.qp_state;
}

static int port_state(struct ibv_context *ctx)
{
	query_port_fn q = (query_port_fn)obs_real("ibv_query_port");
	struct ibv_port_attr a;

	memset(&a, 0, sizeof(a));
	if (!q || q(ctx, 1, &a))
		return -1;
	return (int)a.state;
}

static void inflight_context_opened(struct ibv_context *ctx, const char *dev)
{
	(void)ctx;
	(void)dev;
	pthread_mutex_lock(&flock);
	if (!armed && not_armed_reason[0] && !not_armed_logged) {
		not_armed_logged = 1;
		obs_log("{\"ev\":\"not_armed\",\"reason\":\"%s\"}", not_armed_reason);
	}
	pthread_mutex_unlock(&flock);
}

/* The selected WR: stop its copy part way, then the QP to ERR. */
static int interrupt(struct ibv_qp *qp, obs_go_fn go, void *arg, const struct obs_wr *w)
{
	stall_fn stall = (stall_fn)obs_real("orbite_provider_qp_stall");
	counter_fn counter = (counter_fn)obs_real("orbite_provider_counter");
	ctx_counter_fn ctx_counter = (ctx_counter_fn)obs_real("orbite_provider_ctx_counter");
	modify_fn modify = (modify_fn)obs_real("ibv_modify_qp");
	long long stalls0, landed0 = -1, landed = -1, end;
	int ret, mret = -1, stalled = 0, st_before, st_after, p_before, p_after;
	struct ibv_qp_attr attr;
	uint64_t len = obs_sge_bytes(w->sg_list, w->num_sge);

	if (!stall || !counter || !modify) {
		refuse("the verbs provider has no stall hook (orbite_provider_qp_stall): nothing interrupted");
		inflight_context_opened(NULL, NULL);
		return go(arg);
	}
	if ((uint64_t)stall_bytes >= len) {
		refuse("ORBITE_INFLIGHT_FAULT_BYTES is not below the selected WR's length: nothing interrupted");
		inflight_context_opened(NULL, NULL);
		armed = 0;
		return go(arg);
	}
	p_before = port_state(qp->context);
	stalls0 = counter("stalls");
	if (w->opcode == IBV_WR_RDMA_READ && ctx_counter)
		landed0 = ctx_counter(qp->context, "read_bytes_landed");
	stall(qp, (uint64_t)stall_bytes, wait_ms);
	pthread_mutex_lock(&flock);
	sel.posted = 1;
	sel.ctx = qp->context;
	sel.cq = qp->send_cq;
	sel.qp = qp;
	sel.qpn = qp->qp_num;
	sel.wr_id = w->wr_id;
	sel.read = w->opcode == IBV_WR_RDMA_READ;
	sel.laddr = w->num_sge ? (void *)(uintptr_t)w->sg_list[0].addr : NULL;
	sel.len = w->num_sge == 1 ? len : 0;
	pthread_mutex_unlock(&flock);
	ret = go(arg);
	st_before = qp_state(qp);
	if (!ret) {
		end = mono_ms() + wait_ms;
		while (!(stalled = counter("stalls") > stalls0) && mono_ms() < end)
			usleep(500);
		if (stalled) {
			if (landed0 >= 0)
				landed = ctx_counter(qp->context, "read_bytes_landed") - landed0;
			memset(&attr, 0, sizeof(attr));
			attr.qp_state = IBV_QPS_ERR;
			mret = modify(qp, &attr, IBV_QP_STATE);
		}
	}
	st_after = qp_state(qp);
	p_after = port_state(qp->context);
	obs_log("{\"ev\":\"inflight_fault\",\"ctx\":\"%p\",\"cq\":\"%p\",\"qpn\":%" PRIu32
		",\"wr_id\":%" PRIu64 ",\"opcode\":\"%s\",\"bytes\":%" PRIu64
		",\"stall_bytes\":%ld,\"stalled\":%d,\"landed_local\":%lld,\"modify_qp\":%d"
		",\"state_before\":%d,\"state_after\":%d,\"port_state_before\":%d"
		",\"port_state_after\":%d,\"post_ret\":%d}",
		(void *)qp->context, (void *)qp->send_cq, qp->qp_num, w->wr_id,
		obs_payload_opcode(w->opcode), len, stall_bytes, stalled, landed, mret,
		st_before, st_after, p_before, p_after, ret);
	return ret;
}

static int inflight_post(struct ibv_qp *qp, const struct obs_wr *wrs, size_t n, obs_go_fn go, void *arg)
{
	size_t i, hit = n;

	if (!armed)
		return go(arg);
	pthread_mutex_lock(&flock);
	for (i = 0; i < n; i++)
		if (seen++ == skip && !sel.posted)
			hit = i;
	pthread_mutex_unlock(&flock);
	/* The provider's stall hook applies to the next payload WR of the QP:
	 * only the first payload WR of a post can be the interrupted one. */
	if (hit == n)
		return go(arg);
	if (hit != 0) {
		refuse("the selected WR is not the first payload WR of its post: nothing interrupted");
		inflight_context_opened(NULL, NULL);
		armed = 0;
		return go(arg);
	}
	return interrupt(qp, go, arg, &wrs[0]);
}

/* Under the core's ledger lock: the selected WR's completion. */
static void inflight_completed(struct ibv_context *ctx, struct ibv_cq *cq, const struct ibv_wc *wc)
{
	const char *(*status_str)(enum ibv_wc_status) =
		(const char *(*)(enum ibv_wc_status))obs_real("ibv_wc_status_str");
	char hex[65] = "";
	int hashed = 0;

	pthread_mutex_lock(&flock);
	if (!sel.posted || sel.cqe_seen || ctx != sel.ctx || cq != sel.cq || wc->qp_num != sel.qpn ||
	    wc->wr_id != sel.wr_id) {
		pthread_mutex_unlock(&flock);
		return;
	}
	sel.cqe_seen = 1;
	if (sel.read && sel.laddr && sel.len) {
		uint8_t d[32];

		obs_sha256(sel.laddr, (size_t)sel.len, d);
		obs_sha256_hex(d, hex);
		hashed = 1;
	}
	pthread_mutex_unlock(&flock);
	obs_log("{\"ev\":\"inflight_cqe\",\"ctx\":\"%p\",\"cq\":\"%p\",\"qpn\":%" PRIu32 ",\"wr_id\":%" PRIu64
		",\"status\":%d,\"status_name\":\"%s\",\"byte_len\":%" PRIu32 ",\"dest_sha256\":%s%s%s}",
		(void *)ctx, (void *)cq, wc->qp_num, wc->wr_id, (int)wc->status,
		status_str ? status_str(wc->status) : "?", wc->byte_len, hashed ? "\"" : "", hashed ? hex : "null",
		hashed ? "\"" : "");
}

#define OBS_EXPORT __attribute__((visibility("default")))

OBS_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	int (*real)(struct ibv_qp *) = (int (*)(struct ibv_qp *))obs_real("ibv_destroy_qp");
	int mine, after_cqe, ret;
	uint32_t qpn = qp ? qp->qp_num : 0;

	if (!real)
		return ENOSYS;
	pthread_mutex_lock(&flock);
	mine = sel.posted && !sel.destroyed && qp == sel.qp;
	after_cqe = sel.cqe_seen;
	pthread_mutex_unlock(&flock);
	ret = real(qp);
	if (mine) {
		pthread_mutex_lock(&flock);
		sel.destroyed = !ret;
		pthread_mutex_unlock(&flock);
		obs_log("{\"ev\":\"inflight_destroy\",\"qpn\":%" PRIu32 ",\"ret\":%d,\"after_cqe\":%d}", qpn, ret,
			after_cqe);
	}
	return ret;
}

static struct obs_hook inflight_hooks[] = {
	{ "ibv_destroy_qp", (void *)ibv_destroy_qp, NULL },
	{ NULL, NULL, NULL },
};

static void inflight_init(void)
{
	const char *arm = getenv("ORBITE_INFLIGHT_FAULT_ARMED");

	if (!arm || strcmp(arm, "1") != 0) {
		refuse("ORBITE_INFLIGHT_FAULT_ARMED is not 1");
		return;
	}
	if (obs_env_long("ORBITE_INFLIGHT_FAULT_SKIP", 0, 0, 1L << 40, &skip) ||
	    obs_env_long("ORBITE_INFLIGHT_FAULT_BYTES", 0, 0, 1L << 40, &stall_bytes) ||
	    obs_env_long("ORBITE_INFLIGHT_FAULT_WAIT_MS", 20000, 1, 3600L * 1000, &wait_ms)) {
		refuse("ORBITE_INFLIGHT_FAULT_SKIP, _BYTES or _WAIT_MS is not a valid integer");
		return;
	}
	if (stall_bytes <= 0) {
		refuse("ORBITE_INFLIGHT_FAULT_BYTES must be above 0 (a copy that made progress)");
		return;
	}
	armed = 1;
}

const struct obs_tool obs_tool = {
	.name = "inflight_fault",
	.init = inflight_init,
	.context_opened = inflight_context_opened,
	.hooks = inflight_hooks,
	.post = inflight_post,
	.completed = inflight_completed,
};
