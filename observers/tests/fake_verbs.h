/* Control API of the fake verbs device (tests only).  The fake is a stand-in
 * libibverbs.so.1: software post_send/poll_cq with configurable completions
 * and errors, live counters of every object held, and destroy calls that issue
 * the real uverbs command (ioctl or write, real layout) on a real descriptor
 * (/dev/null) so a seccomp filter on that descriptor sees what it would see
 * with a real RNIC.  FAKE_VERBS_CMD=ioctl|write|invoke_write picks the command
 * style; FAKE_VERBS_DEVICES="a,b" names the devices (mlx5_0,mlx5_1). */
#ifndef FAKE_VERBS_H
#define FAKE_VERBS_H

#include <infiniband/verbs.h>

/* Number of objects of `kind` currently held: "ctx", "pd", "mr", "mw", "cq",
 * "channel", "qp"; -1 for an unknown kind. */
long fake_verbs_held(const char *kind);
/* The next post_send on qp rejects its WR number `index` (0-based within that
 * call) with `err`, setting bad_wr to it; one shot. */
void fake_verbs_qp_fail_post(struct ibv_qp *qp, int index, int err);
/* After `ok` more successful completions on qp, the next WR completes with
 * `status` and every later one with IBV_WC_WR_FLUSH_ERR. */
void fake_verbs_qp_error_after(struct ibv_qp *qp, int ok, enum ibv_wc_status status);
/* Number of WRs the fake's send queue of qp holds (posted, CQE not polled). */
int fake_verbs_qp_outstanding(struct ibv_qp *qp);

#endif
