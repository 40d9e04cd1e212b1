/*
 * The rest of the real libibverbs.so.1's ABI (docs/provider.md, "ABI").
 *
 * rdma-core's driver libraries (libmlx5, libefa, ...) are linked into perftest,
 * pyverbs' provider modules and rdma-core's tests, and import libibverbs'
 * IBVERBS_PRIVATE_* symbols with bind-now: without them such a program fails at
 * load.  The provider loads no kernel driver, so these entry points are never
 * reached through a device; they fail as the real ones fail (each with its own
 * convention, from rdma-core's driver.h and verbs.h), never succeed unseen.
 *
 * Every stub is weak: a strong definition elsewhere in the provider wins.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "provider.h"

/* The stubs ignore their arguments; their parameter lists keep the real
 * prototypes readable. */
#pragma GCC diagnostic ignored "-Wunused-parameter"

#define WEAK PROV_EXPORT __attribute__((weak))

/* Opaque rdma-core driver types: only pointers to them pass through here. */
struct ibv_command_buffer;
struct verbs_xrcd;
struct verbs_mr;
struct verbs_cq;
struct verbs_srq;
struct verbs_qp;
struct verbs_flow_action;
struct verbs_counters;
struct verbs_dm;
struct verbs_context_ops;
struct verbs_device_ops;
struct ibv_flow_action_esp_attr;
struct ibv_query_device_ex_input;
struct ib_uverbs_ex_query_device_resp;
struct ib_uverbs_get_context_resp;
struct ib_uverbs_alloc_pd_resp;
struct ib_uverbs_open_xrcd_resp;
struct ib_uverbs_reg_mr_resp;
struct ib_uverbs_rereg_mr_resp;
struct ib_uverbs_alloc_mw_resp;
struct ib_uverbs_create_cq_resp;
struct ib_uverbs_ex_create_cq_resp;
struct ib_uverbs_resize_cq_resp;
struct ib_uverbs_create_srq_resp;
struct ib_uverbs_create_qp_resp;
struct ib_uverbs_ex_create_qp_resp;
struct ib_uverbs_ex_modify_qp_resp;
struct ib_uverbs_create_ah_resp;
struct ib_uverbs_ex_create_wq_resp;
struct ib_uverbs_ex_create_rwq_ind_table_resp;
struct ibv_get_context;
struct ibv_query_port;
struct ibv_alloc_pd;
struct ibv_open_xrcd;
struct ibv_reg_mr;
struct ibv_rereg_mr;
struct ibv_alloc_mw;
struct ibv_create_cq;
struct ibv_create_cq_ex;
struct ibv_resize_cq;
struct ibv_modify_cq;
struct ibv_create_srq;
struct ibv_create_xsrq;
struct ibv_modify_srq;
struct ibv_query_srq;
struct ibv_create_qp;
struct ibv_create_qp_ex;
struct ibv_open_qp;
struct ibv_query_qp;
struct ibv_modify_qp;
struct ibv_modify_qp_ex;
struct ibv_create_wq;
struct ibv_modify_wq;

/* A kernel command the provider has no kernel for: errno EOPNOTSUPP. */
static int no_kernel(void)
{
	errno = EOPNOTSUPP;
	return EOPNOTSUPP;
}

/* ibv_cmd_* and execute_ioctl return 0 or a positive errno. */
#define CMD_STUB(name, params) \
	WEAK int name params { return no_kernel(); }

CMD_STUB(execute_ioctl, (struct ibv_context *context, struct ibv_command_buffer *cmd))
CMD_STUB(ibv_cmd_get_context, (struct verbs_context *context, struct ibv_get_context *cmd,
	 size_t cmd_size, struct ib_uverbs_get_context_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_query_context, (struct ibv_context *ctx, struct ibv_command_buffer *driver))
CMD_STUB(ibv_cmd_create_flow_action_esp, (struct ibv_context *ctx, struct ibv_flow_action_esp_attr *attr,
	 struct verbs_flow_action *flow_action, struct ibv_command_buffer *driver))
CMD_STUB(ibv_cmd_modify_flow_action_esp, (struct verbs_flow_action *flow_action,
	 struct ibv_flow_action_esp_attr *attr, struct ibv_command_buffer *driver))
CMD_STUB(ibv_cmd_destroy_flow_action, (struct verbs_flow_action *action))
CMD_STUB(ibv_cmd_query_device_any, (struct ibv_context *context,
	 const struct ibv_query_device_ex_input *input, struct ibv_device_attr_ex *attr,
	 size_t attr_size, struct ib_uverbs_ex_query_device_resp *resp, size_t *resp_size))
CMD_STUB(ibv_cmd_query_port, (struct ibv_context *context, uint8_t port_num,
	 struct ibv_port_attr *port_attr, struct ibv_query_port *cmd, size_t cmd_size))
CMD_STUB(ibv_cmd_alloc_pd, (struct ibv_context *context, struct ibv_pd *pd, struct ibv_alloc_pd *cmd,
	 size_t cmd_size, struct ib_uverbs_alloc_pd_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_dealloc_pd, (struct ibv_pd *pd))
CMD_STUB(ibv_cmd_open_xrcd, (struct ibv_context *context, struct verbs_xrcd *xrcd, int vxrcd_size,
	 struct ibv_xrcd_init_attr *attr, struct ibv_open_xrcd *cmd, size_t cmd_size,
	 struct ib_uverbs_open_xrcd_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_close_xrcd, (struct verbs_xrcd *xrcd))
CMD_STUB(ibv_cmd_reg_mr, (struct ibv_pd *pd, void *addr, size_t length, uint64_t hca_va, int access,
	 struct verbs_mr *vmr, struct ibv_reg_mr *cmd, size_t cmd_size,
	 struct ib_uverbs_reg_mr_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_rereg_mr, (struct verbs_mr *vmr, uint32_t flags, void *addr, size_t length,
	 uint64_t hca_va, int access, struct ibv_pd *pd, struct ibv_rereg_mr *cmd, size_t cmd_sz,
	 struct ib_uverbs_rereg_mr_resp *resp, size_t resp_sz))
CMD_STUB(ibv_cmd_dereg_mr, (struct verbs_mr *vmr))
CMD_STUB(ibv_cmd_query_mr, (struct ibv_pd *pd, struct verbs_mr *vmr, uint32_t mr_handle))
CMD_STUB(ibv_cmd_advise_mr, (struct ibv_pd *pd, enum ibv_advise_mr_advice advice, uint32_t flags,
	 struct ibv_sge *sg_list, uint32_t num_sge))
CMD_STUB(ibv_cmd_reg_dmabuf_mr, (struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova,
	 int fd, int access, struct verbs_mr *vmr))
CMD_STUB(ibv_cmd_alloc_mw, (struct ibv_pd *pd, enum ibv_mw_type type, struct ibv_mw *mw,
	 struct ibv_alloc_mw *cmd, size_t cmd_size, struct ib_uverbs_alloc_mw_resp *resp,
	 size_t resp_size))
CMD_STUB(ibv_cmd_dealloc_mw, (struct ibv_mw *mw))
CMD_STUB(ibv_cmd_create_cq, (struct ibv_context *context, int cqe, struct ibv_comp_channel *channel,
	 int comp_vector, struct ibv_cq *cq, struct ibv_create_cq *cmd, size_t cmd_size,
	 struct ib_uverbs_create_cq_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_create_cq_ex, (struct ibv_context *context, const struct ibv_cq_init_attr_ex *cq_attr,
	 struct verbs_cq *cq, struct ibv_create_cq_ex *cmd, size_t cmd_size,
	 struct ib_uverbs_ex_create_cq_resp *resp, size_t resp_size, uint32_t cmd_flags))
CMD_STUB(ibv_cmd_req_notify_cq, (struct ibv_cq *cq, int solicited_only))
CMD_STUB(ibv_cmd_resize_cq, (struct ibv_cq *cq, int cqe, struct ibv_resize_cq *cmd, size_t cmd_size,
	 struct ib_uverbs_resize_cq_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_destroy_cq, (struct ibv_cq *cq))
CMD_STUB(ibv_cmd_modify_cq, (struct ibv_cq *cq, struct ibv_modify_cq_attr *attr,
	 struct ibv_modify_cq *cmd, size_t cmd_size))
CMD_STUB(ibv_cmd_create_srq, (struct ibv_pd *pd, struct ibv_srq *srq, struct ibv_srq_init_attr *attr,
	 struct ibv_create_srq *cmd, size_t cmd_size, struct ib_uverbs_create_srq_resp *resp,
	 size_t resp_size))
CMD_STUB(ibv_cmd_create_srq_ex, (struct ibv_context *context, struct verbs_srq *srq,
	 struct ibv_srq_init_attr_ex *attr_ex, struct ibv_create_xsrq *cmd, size_t cmd_size,
	 struct ib_uverbs_create_srq_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_modify_srq, (struct ibv_srq *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask,
	 struct ibv_modify_srq *cmd, size_t cmd_size))
CMD_STUB(ibv_cmd_query_srq, (struct ibv_srq *srq, struct ibv_srq_attr *srq_attr,
	 struct ibv_query_srq *cmd, size_t cmd_size))
CMD_STUB(ibv_cmd_destroy_srq, (struct ibv_srq *srq))
CMD_STUB(ibv_cmd_create_qp, (struct ibv_pd *pd, struct ibv_qp *qp, struct ibv_qp_init_attr *attr,
	 struct ibv_create_qp *cmd, size_t cmd_size, struct ib_uverbs_create_qp_resp *resp,
	 size_t resp_size))
CMD_STUB(ibv_cmd_create_qp_ex, (struct ibv_context *context, struct verbs_qp *qp,
	 struct ibv_qp_init_attr_ex *attr_ex, struct ibv_create_qp *cmd, size_t cmd_size,
	 struct ib_uverbs_create_qp_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_create_qp_ex2, (struct ibv_context *context, struct verbs_qp *qp,
	 struct ibv_qp_init_attr_ex *qp_attr, struct ibv_create_qp_ex *cmd, size_t cmd_size,
	 struct ib_uverbs_ex_create_qp_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_open_qp, (struct ibv_context *context, struct verbs_qp *qp, int vqp_sz,
	 struct ibv_qp_open_attr *attr, struct ibv_open_qp *cmd, size_t cmd_size,
	 struct ib_uverbs_create_qp_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_query_qp, (struct ibv_qp *qp, struct ibv_qp_attr *qp_attr, int attr_mask,
	 struct ibv_qp_init_attr *qp_init_attr, struct ibv_query_qp *cmd, size_t cmd_size))
CMD_STUB(ibv_cmd_modify_qp, (struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
	 struct ibv_modify_qp *cmd, size_t cmd_size))
CMD_STUB(ibv_cmd_modify_qp_ex, (struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask,
	 struct ibv_modify_qp_ex *cmd, size_t cmd_size, struct ib_uverbs_ex_modify_qp_resp *resp,
	 size_t resp_size))
CMD_STUB(ibv_cmd_destroy_qp, (struct ibv_qp *qp))
CMD_STUB(ibv_cmd_post_send, (struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr))
CMD_STUB(ibv_cmd_post_recv, (struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr))
CMD_STUB(ibv_cmd_post_srq_recv, (struct ibv_srq *srq, struct ibv_recv_wr *wr,
	 struct ibv_recv_wr **bad_wr))
CMD_STUB(ibv_cmd_create_ah, (struct ibv_pd *pd, struct ibv_ah *ah, struct ibv_ah_attr *attr,
	 struct ib_uverbs_create_ah_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_destroy_ah, (struct ibv_ah *ah))
CMD_STUB(ibv_cmd_attach_mcast, (struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid))
CMD_STUB(ibv_cmd_detach_mcast, (struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid))
CMD_STUB(ibv_cmd_create_flow, (struct ibv_qp *qp, struct ibv_flow *flow_id,
	 struct ibv_flow_attr *flow_attr, void *ucmd, size_t ucmd_size))
CMD_STUB(ibv_cmd_destroy_flow, (struct ibv_flow *flow_id))
CMD_STUB(ibv_cmd_create_wq, (struct ibv_context *context, struct ibv_wq_init_attr *wq_init_attr,
	 struct ibv_wq *wq, struct ibv_create_wq *cmd, size_t cmd_size,
	 struct ib_uverbs_ex_create_wq_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_modify_wq, (struct ibv_wq *wq, struct ibv_wq_attr *attr, struct ibv_modify_wq *cmd,
	 size_t cmd_size))
CMD_STUB(ibv_cmd_destroy_wq, (struct ibv_wq *wq))
CMD_STUB(ibv_cmd_create_rwq_ind_table, (struct ibv_context *context,
	 struct ibv_rwq_ind_table_init_attr *init_attr, struct ibv_rwq_ind_table *rwq_ind_table,
	 struct ib_uverbs_ex_create_rwq_ind_table_resp *resp, size_t resp_size))
CMD_STUB(ibv_cmd_destroy_rwq_ind_table, (struct ibv_rwq_ind_table *rwq_ind_table))
CMD_STUB(ibv_cmd_create_counters, (struct ibv_context *context, struct ibv_counters_init_attr *init_attr,
	 struct verbs_counters *vcounters, struct ibv_command_buffer *link))
CMD_STUB(ibv_cmd_destroy_counters, (struct verbs_counters *vcounters))
CMD_STUB(ibv_cmd_read_counters, (struct verbs_counters *vcounters, uint64_t *counters_value,
	 uint32_t ncounters, uint32_t flags, struct ibv_command_buffer *link))
CMD_STUB(ibv_cmd_alloc_dm, (struct ibv_context *ctx, const struct ibv_alloc_dm_attr *dm_attr,
	 struct verbs_dm *dm, struct ibv_command_buffer *link))
CMD_STUB(ibv_cmd_free_dm, (struct verbs_dm *dm))
CMD_STUB(ibv_cmd_reg_dm_mr, (struct ibv_pd *pd, struct verbs_dm *dm, uint64_t offset, size_t length,
	 unsigned int access, struct verbs_mr *vmr, struct ibv_command_buffer *link))

/* ibv_cmd_poll_cq returns the number of completions, -1 with errno on error. */
WEAK int ibv_cmd_poll_cq(struct ibv_cq *cq, int ne, struct ibv_wc *wc)
{
	no_kernel();
	return -1;
}

/* Sizes a command buffer before execute_ioctl, which fails here anyway. */
WEAK unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, struct ibv_command_buffer *link)
{
	return num_attrs;
}

/* Driver logging: rdma-core prints only when VERBS_LOG_LEVEL asks; no driver runs here. */
WEAK void __verbs_log(struct verbs_context *ctx, uint32_t level, const char *fmt, ...)
{
}

/* A driver's context allocation: NULL with errno, as on a failed ioctl. */
WEAK void *_verbs_init_and_alloc_context(struct ibv_device *device, int cmd_fd, size_t alloc_size,
					 struct verbs_context *context_offset, uint32_t driver_id)
{
	errno = EOPNOTSUPP;
	return NULL;
}

WEAK struct ibv_context *verbs_open_device(struct ibv_device *device, void *private_data)
{
	errno = EOPNOTSUPP;
	return NULL;
}

/* Reached only from a driver's alloc_context, which never runs here. */
WEAK void verbs_set_ops(struct verbs_context *vctx, const struct verbs_context_ops *ops)
{
	prov_warn("verbs_set_ops: no kernel driver runs on the loopback provider; ops ignored");
}

WEAK void verbs_uninit_context(struct verbs_context *context)
{
}

/* A driver library's constructor registers it; the provider serves its own
 * loopback devices only, so the registration is ignored (as rdma-core ignores
 * a driver that matches no device). */
WEAK void verbs_register_driver_34(const struct verbs_device_ops *ops)
{
}

WEAK bool verbs_allow_disassociate_destroy;

/* The fields of a CQ every driver sets the same way. */
WEAK void verbs_init_cq(struct ibv_cq *cq, struct ibv_context *context,
			struct ibv_comp_channel *channel, void *cq_context)
{
	cq->context = context;
	cq->channel = channel;
	cq->cq_context = cq_context;
	cq->comp_events_completed = 0;
	cq->async_events_completed = 0;
	pthread_mutex_init(&cq->mutex, NULL);
	pthread_cond_init(&cq->cond, NULL);
}

/* driver.h's struct verbs_sysfs_dev up to ibdev_path (its head is fixed ABI). */
struct sysfs_dev_head {
	void *entry[2];
	void *provider_data;
	const void *match;
	unsigned int flags;
	char sysfs_name[IBV_SYSFS_NAME_MAX];
	dev_t sysfs_cdev;
	char ibdev_name[IBV_SYSFS_NAME_MAX];
	char ibdev_path[IBV_SYSFS_PATH_MAX];
};

int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size); /* device.c */

/* Reads <ibdev_path>/<fnfmt...>; ibdev_path is under ibv_get_sysfs_path(),
 * which is the provider root's sys/. */
PROV_EXPORT int ibv_read_ibdev_sysfs_file(char *buf, size_t size, void *sysfs_dev,
					  const char *fnfmt, ...)
{
	const struct sysfs_dev_head *dev = sysfs_dev;
	char *file;
	va_list va;
	int rc;

	if (!dev) {
		errno = EINVAL;
		return -1;
	}
	va_start(va, fnfmt);
	rc = vasprintf(&file, fnfmt, va);
	va_end(va);
	if (rc < 0)
		return -1;
	rc = ibv_read_sysfs_file(dev->ibdev_path, file, buf, size);
	free(file);
	return rc;
}

/* --------------------------------------------- IBVERBS_1.0 compat entries --
 * The 1.0 ABI (structures of libibverbs 1.0) is kept by rdma-core for
 * binaries of that era; the provider does not implement it: each entry fails
 * with ENOSYS in its function's convention. */
#define COMPAT(name) __asm__(".symver " #name "_1_0, " #name "@IBVERBS_1.0");
#define COMPAT_NULL(name, params) \
	COMPAT(name) WEAK void *name##_1_0 params { errno = ENOSYS; return NULL; }
#define COMPAT_ERRNO(name, params) \
	COMPAT(name) WEAK int name##_1_0 params { errno = ENOSYS; return ENOSYS; }
#define COMPAT_MINUS1(name, params) \
	COMPAT(name) WEAK int name##_1_0 params { errno = ENOSYS; return -1; }
#define COMPAT_VOID(name, params) \
	COMPAT(name) WEAK void name##_1_0 params { }

COMPAT_NULL(ibv_get_device_list, (int *num))
COMPAT_VOID(ibv_free_device_list, (void **list))
COMPAT_NULL(ibv_get_device_name, (void *device))
COMPAT(ibv_get_device_guid) WEAK __be64 ibv_get_device_guid_1_0(void *device)
{
	errno = ENOSYS;
	return 0;
}
COMPAT_NULL(ibv_open_device, (void *device))
COMPAT_MINUS1(ibv_close_device, (void *context))
COMPAT_MINUS1(ibv_get_async_event, (void *context, void *event))
COMPAT_VOID(ibv_ack_async_event, (void *event))
COMPAT_ERRNO(ibv_query_device, (void *context, struct ibv_device_attr *attr))
COMPAT_ERRNO(ibv_query_port, (void *context, uint8_t port, struct ibv_port_attr *attr))
COMPAT_MINUS1(ibv_query_gid, (void *context, uint8_t port, int index, union ibv_gid *gid))
COMPAT_MINUS1(ibv_query_pkey, (void *context, uint8_t port, int index, __be16 *pkey))
COMPAT_NULL(ibv_alloc_pd, (void *context))
COMPAT_ERRNO(ibv_dealloc_pd, (void *pd))
COMPAT_NULL(ibv_reg_mr, (void *pd, void *addr, size_t length, int access))
COMPAT_ERRNO(ibv_dereg_mr, (void *mr))
COMPAT_NULL(ibv_create_cq, (void *context, int cqe, void *cq_context, void *channel, int comp_vector))
COMPAT_ERRNO(ibv_resize_cq, (void *cq, int cqe))
COMPAT_ERRNO(ibv_destroy_cq, (void *cq))
COMPAT_MINUS1(ibv_get_cq_event, (void *channel, void **cq, void **cq_context))
COMPAT_VOID(ibv_ack_cq_events, (void *cq, unsigned int nevents))
COMPAT_NULL(ibv_create_srq, (void *pd, void *srq_init_attr))
COMPAT_ERRNO(ibv_modify_srq, (void *srq, struct ibv_srq_attr *srq_attr, int srq_attr_mask))
COMPAT_ERRNO(ibv_query_srq, (void *srq, struct ibv_srq_attr *srq_attr))
COMPAT_ERRNO(ibv_destroy_srq, (void *srq))
COMPAT_NULL(ibv_create_qp, (void *pd, void *qp_init_attr))
COMPAT_ERRNO(ibv_query_qp, (void *qp, struct ibv_qp_attr *attr, int attr_mask, void *init_attr))
COMPAT_ERRNO(ibv_modify_qp, (void *qp, struct ibv_qp_attr *attr, int attr_mask))
COMPAT_ERRNO(ibv_destroy_qp, (void *qp))
COMPAT_NULL(ibv_create_ah, (void *pd, struct ibv_ah_attr *attr))
COMPAT_ERRNO(ibv_destroy_ah, (void *ah))
COMPAT_ERRNO(ibv_attach_mcast, (void *qp, union ibv_gid *gid, uint16_t lid))
COMPAT_ERRNO(ibv_detach_mcast, (void *qp, union ibv_gid *gid, uint16_t lid))

/* The pre-1.1 driver registration: rdma-core warns and ignores the driver. */
__asm__(".symver ibv_register_driver_1_1, ibv_register_driver@IBVERBS_1.1");
WEAK void ibv_register_driver_1_1(const char *name, void *init_func)
{
	prov_warn("driver %s uses the obsolete ibv_register_driver API; ignored", name ? name : "?");
}
