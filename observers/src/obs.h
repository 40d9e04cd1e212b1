/* Shared core of the OrbiTE native observers (LD_PRELOAD libraries).
 *
 * The core interposes ibv_open_device/ibv_close_device and the memory
 * registration calls (and dlsym, so engines that dlopen libibverbs with
 * RTLD_LOCAL are caught too), wraps the inline data-path ops in context->ops
 * (post_send, poll_cq) and the extended ones (the wr_* family of each
 * ibv_qp_ex, start/next/end_poll of each ibv_cq_ex), keeps the WR ledger that joins each accepted payload
 * WR to its completion, hashes the local bytes of each successful payload WR
 * (tools with .digests), and writes the observer log (contract 3: a JSON
 * header line, then fixed-size binary records or JSON lines, see
 * docs/receipts.md section 2).  Each tool (accounting, cq_fault,
 * uverbs_fault, inflight_fault) links the core with one obs_tool description.
 */
#ifndef ORBITE_OBS_H
#define ORBITE_OBS_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

/* One interposed libibverbs entry point: name, our wrapper, and the real
 * function once known (from RTLD_NEXT or captured in our dlsym). */
struct obs_hook {
	const char *name;
	void *wrapper;
	void *real;
};

/* One payload WR of a post, whichever call posts it (ibv_post_send, or the
 * wr_* builders of an ibv_qp_ex up to wr_complete). */
struct obs_wr {
	uint64_t wr_id;
	enum ibv_wr_opcode opcode;
	int num_sge;
	const struct ibv_sge *sg_list;
	int inline_data; /* the bytes were copied at the call (no MR names them) */
};

/* The provider's post as the core calls it: returns its result. */
typedef int (*obs_go_fn)(void *arg);

struct obs_tool {
	const char *name; /* "accounting" | "cq_fault" | "uverbs_fault" | "inflight_fault" */
	void (*init)(void);
	/* Called under the ledger lock for each successful completion of an
	 * accepted payload WR on device `dev`; return 1 to remove it from
	 * poll_cq's result. */
	int (*withhold)(const char *dev);
	void (*context_opened)(struct ibv_context *ctx, const char *dev);
	void (*context_closing)(struct ibv_context *ctx);
	struct obs_hook *hooks; /* extra interposed functions, NULL-terminated */
	/* When set, the core calls this instead of the provider's post
	 * (outside the ledger lock, after the WRs are recorded): `wrs` are the
	 * post's payload WRs in order; it must call go(arg) once and return its
	 * result. */
	int (*post)(struct ibv_qp *qp, const struct obs_wr *wrs, size_t n, obs_go_fn go, void *arg);
	/* Called under the ledger lock for every completion poll_cq or the
	 * extended poll returns (before the core logs it). */
	void (*completed)(struct ibv_context *ctx, struct ibv_cq *cq, const struct ibv_wc *wc);
	/* Hash the local range of every successful payload WR and its guard
	 * windows (docs/observers.md, "Digests"). */
	int digests;
};

extern const struct obs_tool obs_tool;

/* Write one JSON object (without newline) to the log: a line in the JSON
 * format, text records in the binary format. */
void obs_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The log's descriptor, -1 when there is no log. */
int obs_log_fd(void);
/* Resolve the real libibverbs function `name` (never our own wrapper). */
void *obs_real(const char *name);
/* Integer from the environment; out of range or malformed -> message, -1. */
int obs_env_long(const char *name, long dflt, long min, long max, long *out);
/* Message on stderr, prefixed with the tool name. */
void obs_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "RDMA_READ" or "RDMA_WRITE" for a payload WR's opcode (WRITE_WITH_IMM is a
 * WRITE), NULL for any other work. */
const char *obs_payload_opcode(enum ibv_wr_opcode op);
/* The bytes a scatter list names. */
uint64_t obs_sge_bytes(const struct ibv_sge *sg_list, int num_sge);
/* Copy the device name of an observed context into buf; 0 when unknown. */
int obs_context_dev(struct ibv_context *ctx, char *buf, size_t len);

#endif
