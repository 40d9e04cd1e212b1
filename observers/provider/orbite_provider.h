/* Public extras of the OrbiTE loopback verbs provider, beyond the libibverbs
 * API: live counters for leak checks, byte counters (the provider's own
 * witness of what it moved), a test hook for in-flight interruption, and
 * exported forms of the verbs that <infiniband/verbs.h> makes inline calls
 * through context->ops (for ctypes users: each goes through the ops, so an
 * observer that wrapped them still sees every call). */
#ifndef ORBITE_PROVIDER_PUBLIC_H
#define ORBITE_PROVIDER_PUBLIC_H

#include <infiniband/verbs.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Connections a QP's responder holds in handshake at once (each until its
 * whole hello came, within ORBITE_PROVIDER_HELLO_MS of accept); one more is
 * closed at once, and the requester behind it retries. */
#define ORBITE_PROVIDER_MAX_HANDSHAKES 8

/* Objects currently held by this process: "ctx", "pd", "mr", "mw", "cq",
 * "channel", "qp", "srq"; -1 for an unknown kind.  A destroy that failed (EIO from
 * the uverbs descriptor, EBUSY) leaves the object counted. */
long orbite_provider_held(const char *kind);

/* Byte and WR counters of this process: "read_bytes_landed",
 * "write_bytes_sent", "read_bytes_served", "write_bytes_landed",
 * "wr_completed", "wr_failed", "stalls" (WRs that reached their stall
 * point); -1 for an unknown name. */
long long orbite_provider_counter(const char *name);

/* The same counters for one context (so one device, one rail of an engine):
 * what this process's provider moved through the QPs of ctx, as requester
 * (read_bytes_landed, write_bytes_sent) and as responder (read_bytes_served,
 * write_bytes_landed).  Live until ibv_close_device(ctx); -1 for an unknown
 * name or no context. */
long long orbite_provider_ctx_counter(struct ibv_context *ctx, const char *name);

/* Test hook: the next payload WR (READ, WRITE, WRITE_WITH_IMM, SEND) posted
 * on qp moves `bytes` bytes, then waits until the QP leaves RTS (at most
 * max_ms, then it goes on).  Returns 0, or EINVAL for a foreign QP. */
int orbite_provider_qp_stall(struct ibv_qp *qp, uint64_t bytes, long max_ms);

/* Test hook: the send-queue slots qp holds (WRs posted whose completion was
 * not polled yet; -1 for no QP).  Lets a test check that completions an
 * observer withheld were consumed, not left queued for a later poll. */
long orbite_provider_qp_outstanding(struct ibv_qp *qp);

/* The key domain of ctx: what = "kind" gives 1 for a live MR behind key, 2
 * for a live MW, 0 for none (released or stale); "windows" the MWs bound to
 * that MR (or 1/0: that MW bound); "length" the MR's length or the MW's bound
 * window.  -1 for no context, an unknown `what` or no live object.  An MR or
 * MW whose dereg/dealloc failed still answers (a real provider query after
 * the engine dropped its handles). */
long orbite_provider_key_query(struct ibv_context *ctx, uint32_t key, const char *what);

/* How qp's READ and WRITE payload moves to and from its peer: 1 single copy
 * (process_vm_readv/writev, the peer's process proven at the hello), 0 TCP,
 * -1 no QP or not connected yet (the first WR connects); why (len bytes, may
 * be NULL) gets the reason of the choice. */
int orbite_provider_qp_payload(struct ibv_qp *qp, char *why, size_t len);

/* The inline verbs of <infiniband/verbs.h>, exported (ctypes cannot inline). */
int orbite_ibv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
int orbite_ibv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
int orbite_ibv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
int orbite_ibv_req_notify_cq(struct ibv_cq *cq, int solicited_only);
struct ibv_mw *orbite_ibv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int orbite_ibv_dealloc_mw(struct ibv_mw *mw);
int orbite_ibv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind);
int orbite_ibv_query_port(struct ibv_context *context, uint8_t port_num, struct ibv_port_attr *port_attr);
uint32_t orbite_ibv_inc_rkey(uint32_t rkey);

#ifdef __cplusplus
}
#endif

#endif
