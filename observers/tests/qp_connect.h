/* RESET -> INIT -> RTR -> RTS towards (gid, qpn), shared by the test drivers.
 * The verb comes as a parameter: obs_driver's dlopen build reaches libibverbs
 * only through dlsym and must not name ibv_modify_qp. */
#ifndef ORBITE_QP_CONNECT_H
#define ORBITE_QP_CONNECT_H

#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>

typedef int (*qp_modify_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);

/* 0 or the errno of the failing step. */
static inline int qp_connect_via(qp_modify_fn modify, struct ibv_qp *qp, uint8_t port, uint8_t gid_index,
				 const union ibv_gid *gid, uint32_t qpn, int access, uint8_t rnr_retry)
{
	struct ibv_qp_attr a;
	int rc;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = port;
	a.qp_access_flags = (unsigned int)access;
	rc = modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *gid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = port;
	rc = modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc)
		return rc;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = rnr_retry;
	a.sq_psn = 0;
	a.max_rd_atomic = 16;
	return modify(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

#endif
