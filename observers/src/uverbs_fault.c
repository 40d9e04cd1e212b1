/* uverbs_fault: makes one real destroy (QP, MR, MW, CQ, completion channel
 * or PD) fail with EIO, and records any retry of it as a violation.
 *
 * seccomp alone cannot tell a destroy from any other verbs command (the
 * command is in the buffer the syscall points to), so each observed context's
 * uverbs descriptor gets a seccomp filter that hands its ioctl(RDMA_VERBS_IOCTL)
 * and write() calls to a helper thread (SECCOMP_RET_USER_NOTIF).  The helper
 * reads the command buffer, recognises destroys, fails exactly the selected
 * occurrence of the selected kind with EIO and lets everything else continue
 * untouched (SECCOMP_USER_NOTIF_FLAG_CONTINUE).  A completion channel is
 * destroyed by close() on its own descriptor, so for `channel` that close is
 * filtered instead; libibverbs ignores close()'s result, so the interposed
 * ibv_destroy_comp_channel reports the EIO to the caller.
 *
 *   ORBITE_UVERBS_FAULT_KIND        qp | mr | mw | cq | channel | pd (required)
 *   ORBITE_UVERBS_FAULT_OCCURRENCE  which destroy of that kind fails (1)
 *   ORBITE_UVERBS_FAULT_DEV         only contexts of this device (all)
 *   ORBITE_UVERBS_FAULT_WRITES      first | all: which descriptors' write()
 *                                   calls are inspected (legacy path; first)
 *   ORBITE_UVERBS_FAULT_WITHHOLD_SKIP  qp (always), cq and channel (when
 *                                   set): successful payload completions
 *                                   passed before the one that is withheld
 *                                   (0)
 *   ORBITE_UVERBS_FAULT_DEPENDENCY  1: cq, channel or pd only.  Nothing is
 *                                   injected: the selected destroy must fail
 *                                   by itself with the dependent object's
 *                                   EBUSY (a RESET QP on the CQ, a CQ on the
 *                                   channel, a type-2 MW on the PD).  The
 *                                   interposed destroy verb logs the result
 *                                   it returns (the uverbs command's answer,
 *                                   or libibverbs' own refcount check for a
 *                                   channel), and a retry of a failed object
 *                                   is rejected with EIO without reaching
 *                                   the library, logged with retry: true.
 *
 * A close of an observed context is logged ({"ev":"context_close"}), so a
 * device closed while one of its objects is retained shows in the log.
 *
 * It refuses to arm when RDMAV_ALLOW_DISASSOC_DESTROY is set: libibverbs then
 * turns a destroy EIO into success and the fault would be invisible.  Why it
 * is not armed goes to stderr and, once the log is open (the first context),
 * into the log as {"ev":"not_armed","reason":...}, which the verifier reads.
 * This is syscall fault injection, not a hardware fault.
 */
#define _GNU_SOURCE
#include "obs.h"

#include <errno.h>
#include <inttypes.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the seccomp filter compares the low 32 bits of arguments at offset 0"
#endif
#if defined(__x86_64__)
#define OBS_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define OBS_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "unsupported architecture for the seccomp filter"
#endif

#define OBS_EXPORT __attribute__((visibility("default")))
#define MAX_FDS 64
#define MAX_FAILED 64

enum kind { K_QP, K_MR, K_MW, K_CQ, K_CHANNEL, K_PD, K_COUNT, K_NONE = -1 };

/* Destroy commands as libibverbs sends them: the ioctl method (object,
 * method), the legacy write command (also carried by the INVOKE_WRITE ioctl
 * method), and where the object handle sits in the legacy core request. */
static const struct {
	const char *name;
	uint16_t object, method;
	uint32_t write_cmd;
	size_t handle_off;
} kinds[K_COUNT] = {
	[K_QP] = { "qp", UVERBS_OBJECT_QP, UVERBS_METHOD_QP_DESTROY,
		   IB_USER_VERBS_CMD_DESTROY_QP,
		   offsetof(struct ib_uverbs_destroy_qp, qp_handle) },
	[K_MR] = { "mr", UVERBS_OBJECT_MR, UVERBS_METHOD_MR_DESTROY,
		   IB_USER_VERBS_CMD_DEREG_MR,
		   offsetof(struct ib_uverbs_dereg_mr, mr_handle) },
	[K_MW] = { "mw", UVERBS_OBJECT_MW, UVERBS_METHOD_MW_DESTROY,
		   IB_USER_VERBS_CMD_DEALLOC_MW,
		   offsetof(struct ib_uverbs_dealloc_mw, mw_handle) },
	[K_CQ] = { "cq", UVERBS_OBJECT_CQ, UVERBS_METHOD_CQ_DESTROY,
		   IB_USER_VERBS_CMD_DESTROY_CQ,
		   offsetof(struct ib_uverbs_destroy_cq, cq_handle) },
	[K_CHANNEL] = { "channel", 0, 0, 0, 0 },
	[K_PD] = { "pd", UVERBS_OBJECT_PD, UVERBS_METHOD_PD_DESTROY,
		   IB_USER_VERBS_CMD_DEALLOC_PD,
		   offsetof(struct ib_uverbs_dealloc_pd, pd_handle) },
};

struct watched {
	int fd;
	int is_channel;
	int live;             /* still the descriptor we filtered it for */
	int injected_pending; /* channel: close failed inside destroy */
};

struct failed {
	int fd;
	int kind;
	uint32_t handle;
};

static pthread_mutex_t wlock = PTHREAD_MUTEX_INITIALIZER;
static int armed;
static int sel_kind = K_NONE;
static long sel_occurrence = 1, seen_of_kind;
static long withhold_skip, withheld_one;
static const char *sel_dev;
static struct watched watched[MAX_FDS];
static int nwatched;
static struct failed failed[MAX_FAILED];
static int nfailed;
static struct {
	const void *ch;
	int fd;
} failed_channels[MAX_FAILED];
static int nfailed_channels;
static int dependency; /* ORBITE_UVERBS_FAULT_DEPENDENCY=1 */
static int withhold_set; /* ORBITE_UVERBS_FAULT_WITHHOLD_SKIP was given */
static const void *dep_failed[MAX_FAILED]; /* dependency mode: objects whose destroy failed */
static int ndep_failed;
static int dep_commands; /* dependency mode: selected destroy commands the helper let through */
static int listener = -1;
static int all_writes;
static int filter_state; /* 0 not yet, 1 installed, -1 failed */
static int filter_done;  /* the install was attempted: the helper may go */
static pthread_cond_t listener_ready = PTHREAD_COND_INITIALIZER;
static char not_armed_reason[160]; /* why uf_init did not arm ("" when armed) */
static int not_armed_logged;

/* ------------------------------------------------------------- decoding -- */

static pid_t notif_tid; /* the task whose syscall is being decided */

static int read_mem(uint64_t addr, void *buf, size_t len)
{
	struct iovec local = { buf, len };
	struct iovec remote = { (void *)(uintptr_t)addr, len };

	/* Our own address space, but the pointer is the caller's: a bad one
	 * fails here with EFAULT instead of crashing the helper. */
	return process_vm_readv(notif_tid, &local, 1, &remote, 1, 0) == (ssize_t)len ? 0 : -1;
}

/* Filters survive fork and exec: a child's calls reach this helper too, and
 * its descriptor numbers mean other files.  Only our threads are decided. */
static int is_our_thread(pid_t tid)
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/self/task/%d", (int)tid);
	return access(path, F_OK) == 0;
}

static int kind_of_write_cmd(uint32_t cmd)
{
	int k;

	for (k = 0; k < K_COUNT; k++)
		if (k != K_CHANNEL && kinds[k].write_cmd == cmd)
			return k;
	return K_NONE;
}

/* ioctl(fd, RDMA_VERBS_IOCTL, hdr): a native destroy method, or a legacy
 * destroy command wrapped in UVERBS_METHOD_INVOKE_WRITE. */
static int decode_ioctl(uint64_t arg, uint32_t *handle)
{
	struct ib_uverbs_ioctl_hdr hdr;
	struct ib_uverbs_attr attrs[32];
	int i, k;

	if (read_mem(arg, &hdr, sizeof(hdr)) || hdr.num_attrs > 32)
		return K_NONE;
	if (hdr.num_attrs &&
	    read_mem(arg + sizeof(hdr), attrs, sizeof(attrs[0]) * hdr.num_attrs))
		return K_NONE;

	if (hdr.object_id == UVERBS_OBJECT_DEVICE &&
	    hdr.method_id == UVERBS_METHOD_INVOKE_WRITE) {
		const struct ib_uverbs_attr *core = NULL;
		uint8_t req[32];

		k = K_NONE;
		for (i = 0; i < hdr.num_attrs; i++) {
			if (attrs[i].attr_id == UVERBS_ATTR_WRITE_CMD)
				k = kind_of_write_cmd((uint32_t)attrs[i].data);
			if (attrs[i].attr_id == UVERBS_ATTR_CORE_IN)
				core = &attrs[i];
		}
		if (k == K_NONE)
			return K_NONE;
		*handle = UINT32_MAX;
		if (core && core->len >= kinds[k].handle_off + 4 && core->len <= sizeof(req)) {
			/* Up to 8 bytes travel inline in the attribute. */
			if (core->len <= sizeof(core->data))
				memcpy(req, &core->data, core->len);
			else if (read_mem(core->data, req, core->len))
				return k;
			memcpy(handle, req + kinds[k].handle_off, sizeof(*handle));
		}
		return k;
	}
	for (k = 0; k < K_COUNT; k++) {
		if (k == K_CHANNEL || hdr.object_id != kinds[k].object ||
		    hdr.method_id != kinds[k].method)
			continue;
		*handle = UINT32_MAX;
		/* UVERBS_ATTR_DESTROY_<KIND>_HANDLE is attribute 0 for all. */
		for (i = 0; i < hdr.num_attrs; i++)
			if (attrs[i].attr_id == 0)
				*handle = (uint32_t)attrs[i].data;
		return k;
	}
	return K_NONE;
}

/* write(fd, {ib_uverbs_cmd_hdr, core request}) */
static int decode_write(uint64_t arg, uint64_t count, uint32_t *handle)
{
	struct ib_uverbs_cmd_hdr hdr;
	int k;

	if (count < sizeof(hdr) || read_mem(arg, &hdr, sizeof(hdr)))
		return K_NONE;
	if (hdr.command & IB_USER_VERBS_CMD_FLAG_EXTENDED)
		return K_NONE;
	k = kind_of_write_cmd(hdr.command);
	if (k == K_NONE)
		return K_NONE;
	*handle = UINT32_MAX;
	if (count >= sizeof(hdr) + kinds[k].handle_off + 4)
		read_mem(arg + sizeof(hdr) + kinds[k].handle_off, handle, sizeof(*handle));
	return k;
}

/* --------------------------------------------------------------- helper -- */

static struct watched *find_watched(int fd, int is_channel)
{
	int i;

	for (i = 0; i < nwatched; i++)
		if (watched[i].fd == fd && watched[i].is_channel == is_channel)
			return &watched[i];
	return NULL;
}

static int is_failed(int fd, int kind, uint32_t handle)
{
	int i;

	for (i = 0; i < nfailed; i++)
		if (failed[i].fd == fd && failed[i].kind == kind &&
		    failed[i].handle == handle)
			return 1;
	return 0;
}

static void log_destroy(int kind, int fd, uint32_t handle, int err, int injected,
			int retry)
{
	char h[32];

	if (kind == K_CHANNEL)
		snprintf(h, sizeof(h), "%d", fd);
	else
		snprintf(h, sizeof(h), "%d:%" PRIu32, fd, handle);
	obs_log("{\"ev\":\"destroy\",\"kind\":\"%s\",\"handle\":\"%s\","
		"\"errno\":%d,\"injected\":%s,\"retry\":%s}",
		kinds[kind].name, h, err, injected ? "true" : "false",
		retry ? "true" : "false");
}

/* Decide one notified syscall: returns the errno to inject, 0 to continue. */
static int decide(const struct seccomp_data *d)
{
	int fd = (int)(uint32_t)d->args[0];
	uint32_t handle = UINT32_MAX;
	struct watched *w;
	int kind, inject = 0, retry;

	if ((long)d->nr == __NR_close) {
		w = find_watched(fd, 1);
		if (!w || !w->live)
			return 0;
		kind = K_CHANNEL;
	} else {
		w = find_watched(fd, 0);
		if (!w || !w->live)
			return 0;
		if ((long)d->nr == __NR_ioctl)
			kind = decode_ioctl(d->args[2], &handle);
		else
			kind = decode_write(d->args[1], d->args[2], &handle);
		if (kind == K_NONE)
			return 0;
	}
	retry = is_failed(fd, kind, handle);
	if (dependency && kind == sel_kind && !retry) {
		/* The command goes on to the kernel: its own answer (EBUSY
		 * from a dependent object) is what the destroy verb returns,
		 * and the hook logs it there. */
		dep_commands++;
		return 0;
	}
	if (retry) {
		inject = EIO; /* the object stays as the failure left it */
	} else if (kind == sel_kind && ++seen_of_kind == sel_occurrence) {
		inject = EIO;
		if (nfailed < MAX_FAILED)
			failed[nfailed++] = (struct failed){ fd, kind, handle };
	}
	if (kind == K_CHANNEL) {
		if (inject)
			w->injected_pending = 1;
		else
			w->live = 0; /* closed for real: the number is free again */
	}
	log_destroy(kind, fd, handle, inject, inject != 0, retry);
	return inject;
}

static void handle_one(int lfd)
{
	struct seccomp_notif req;
	struct seccomp_notif_resp resp;
	int err;

	memset(&req, 0, sizeof(req));
	if (ioctl(lfd, SECCOMP_IOCTL_NOTIF_RECV, &req) < 0) {
		if (errno != EINTR && errno != ENOENT)
			usleep(1000); /* never spin on a broken listener */
		return;
	}
	err = 0;
	if (is_our_thread((pid_t)req.pid)) {
		pthread_mutex_lock(&wlock);
		notif_tid = (pid_t)req.pid;
		err = decide(&req.data);
		pthread_mutex_unlock(&wlock);
	}
	memset(&resp, 0, sizeof(resp));
	resp.id = req.id;
	if (err) {
		resp.error = -err;
	} else {
		resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
	}
	ioctl(lfd, SECCOMP_IOCTL_NOTIF_SEND, &resp);
}

static void *helper_main(void *arg)
{
	sigset_t all;
	int lfd;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	pthread_mutex_lock(&wlock);
	while (!filter_done)
		pthread_cond_wait(&listener_ready, &wlock);
	lfd = listener;
	pthread_mutex_unlock(&wlock);
	if (lfd < 0)
		return NULL;
	for (;;)
		handle_one(lfd);
	return NULL;
}

/* --------------------------------------------------------------- filter -- */

#define LD_ABS(field) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, field))
#define JEQ(v, t, f) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (v), (t), (f))
#define RET(v) BPF_STMT(BPF_RET | BPF_K, (v))

/* A process can hold only one seccomp listener, so one filter serves every
 * context: ioctl(RDMA_VERBS_IOCTL) on any descriptor (only uverbs
 * descriptors take it); write() on the first context's descriptor, or with
 * ORBITE_UVERBS_FAULT_WRITES=all on any descriptor but the log's (the legacy
 * write path: current rdma-core sends legacy commands through the
 * INVOKE_WRITE ioctl instead); and, for the channel selector, close() on any
 * descriptor.  The helper continues everything it does not watch.  The
 * helper itself only ever writes to the log, which the filter lets through. */
static int install_filter(int first_cmd_fd, int with_close)
{
	int log_fd = obs_log_fd();
	struct sock_filter prog_insns[] = {
		LD_ABS(arch),
		JEQ(OBS_AUDIT_ARCH, 1, 0),
		RET(SECCOMP_RET_ALLOW),
		LD_ABS(nr),
		JEQ(__NR_ioctl, 4, 0),
		JEQ(__NR_write, 7, 0),
		JEQ(__NR_close, 0, 1),
		RET(with_close ? SECCOMP_RET_USER_NOTIF : SECCOMP_RET_ALLOW),
		RET(SECCOMP_RET_ALLOW),
		/* ioctl */
		LD_ABS(args[1]),
		JEQ((uint32_t)RDMA_VERBS_IOCTL, 0, 1),
		RET(SECCOMP_RET_USER_NOTIF),
		RET(SECCOMP_RET_ALLOW),
		/* write */
		LD_ABS(args[0]),
		JEQ((uint32_t)log_fd, 3, 0),
		JEQ((uint32_t)first_cmd_fd, 0, 1),
		RET(SECCOMP_RET_USER_NOTIF),
		RET(all_writes ? SECCOMP_RET_USER_NOTIF : SECCOMP_RET_ALLOW),
		RET(SECCOMP_RET_ALLOW), /* the log: the helper writes there */
	};
	struct sock_fprog prog = {
		.len = sizeof(prog_insns) / sizeof(prog_insns[0]),
		.filter = prog_insns,
	};
	int lfd;

	/* Needed to install a filter without CAP_SYS_ADMIN. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) {
		obs_warn("PR_SET_NO_NEW_PRIVS: %s", strerror(errno));
		return -1;
	}
	lfd = (int)syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER,
			   SECCOMP_FILTER_FLAG_NEW_LISTENER | SECCOMP_FILTER_FLAG_TSYNC |
				   SECCOMP_FILTER_FLAG_TSYNC_ESRCH,
			   &prog);
	if (lfd < 0) {
		obs_warn("cannot install the seccomp user-notification filter: %s",
			 strerror(errno));
		return -1;
	}
	listener = lfd;
	return 0;
}

/* Called with wlock held: start the helper, then install the filter, once.
 * The helper exists before the filter does, so no filtered call can ever
 * wait for a helper that failed to start. */
static int ensure_filter(int first_cmd_fd)
{
	pthread_attr_t attr;
	pthread_t t;
	int rc;

	if (filter_state)
		return filter_state > 0 ? 0 : -1;
	filter_state = -1;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	rc = pthread_create(&t, &attr, helper_main, NULL);
	pthread_attr_destroy(&attr);
	if (rc) {
		obs_warn("cannot start the helper thread: %s", strerror(rc));
		return -1;
	}
	rc = install_filter(first_cmd_fd, sel_kind == K_CHANNEL && !dependency);
	filter_state = rc ? -1 : 1;
	filter_done = 1;
	pthread_cond_broadcast(&listener_ready); /* the helper exits on failure */
	return rc;
}

/* Called with wlock held; no message here: with ORBITE_UVERBS_FAULT_WRITES=all
 * a write to stderr would wait for the helper, which waits for wlock. */
static int watch_fd(int fd, int is_channel)
{
	struct watched *w = find_watched(fd, is_channel);

	if (w) {
		w->live = 1;
		w->injected_pending = 0;
		return 0;
	}
	if (nwatched == MAX_FDS)
		return -1;
	watched[nwatched++] = (struct watched){ fd, is_channel, 1, 0 };
	return 0;
}

/* ------------------------------------------------------------ tool hooks -- */

static int ctx_selected(struct ibv_context *ctx)
{
	char dev[IBV_SYSFS_NAME_MAX];

	if (!armed || !obs_context_dev(ctx, dev, sizeof(dev)))
		return 0;
	return !sel_dev || !strcmp(dev, sel_dev);
}

/* Called by each context open (the log is open by then): the reason the
 * observer did not arm, logged once.  The reason holds no quote or
 * backslash (it is built from fixed text and checked names). */
static void log_not_armed(void)
{
	pthread_mutex_lock(&wlock);
	if (!armed && not_armed_reason[0] && !not_armed_logged) {
		not_armed_logged = 1;
		obs_log("{\"ev\":\"not_armed\",\"reason\":\"%s\"}", not_armed_reason);
	}
	pthread_mutex_unlock(&wlock);
}

static void refuse(const char *reason)
{
	size_t i;

	snprintf(not_armed_reason, sizeof(not_armed_reason), "%s", reason);
	for (i = 0; not_armed_reason[i]; i++)
		if (not_armed_reason[i] == '"' || not_armed_reason[i] == '\\' ||
		    (unsigned char)not_armed_reason[i] < 0x20)
			not_armed_reason[i] = '?';
}

static void uf_context_opened(struct ibv_context *ctx, const char *dev)
{
	int ok;

	log_not_armed();
	if (!armed || (sel_dev && strcmp(dev, sel_dev)))
		return;
	pthread_mutex_lock(&wlock);
	ok = ensure_filter(ctx->cmd_fd) == 0 && watch_fd(ctx->cmd_fd, 0) == 0;
	pthread_mutex_unlock(&wlock);
	if (!ok)
		obs_warn("not armed: %s (fd %d) is not filtered", dev, ctx->cmd_fd);
}

static void uf_context_closing(struct ibv_context *ctx)
{
	char dev[IBV_SYSFS_NAME_MAX];
	struct watched *w;

	if (!armed)
		return;
	if (ctx_selected(ctx) && obs_context_dev(ctx, dev, sizeof(dev)))
		obs_log("{\"ev\":\"context_close\",\"dev\":\"%s\"}", dev);
	pthread_mutex_lock(&wlock);
	w = find_watched(ctx->cmd_fd, 0);
	if (w)
		w->live = 0;
	pthread_mutex_unlock(&wlock);
}

/* The qp selector, and the cq and channel selectors when a skip is given,
 * first withhold one successful payload completion (on the selected device
 * when ORBITE_UVERBS_FAULT_DEV is set). */
static int uf_withhold(const char *dev)
{
	int withholds = sel_kind == K_QP ||
			((sel_kind == K_CQ || sel_kind == K_CHANNEL) && withhold_set);

	if (!armed || !withholds || withheld_one || (sel_dev && strcmp(dev, sel_dev)))
		return 0;
	if (withhold_skip > 0) {
		withhold_skip--;
		return 0;
	}
	withheld_one = 1;
	return 1;
}

OBS_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	struct ibv_comp_channel *(*real)(struct ibv_context *) =
		(struct ibv_comp_channel * (*)(struct ibv_context *))
			obs_real("ibv_create_comp_channel");
	struct ibv_comp_channel *ch;
	int i;

	if (!real) {
		errno = ENOSYS;
		return NULL;
	}
	ch = real(ctx);
	if (!ch || sel_kind != K_CHANNEL || !ctx_selected(ctx))
		return ch;
	pthread_mutex_lock(&wlock);
	/* A new channel at the address of a failed one is a new object. */
	for (i = 0; i < nfailed_channels; i++)
		if (failed_channels[i].ch == ch)
			failed_channels[i] = failed_channels[--nfailed_channels];
	i = watch_fd(ch->fd, 1);
	pthread_mutex_unlock(&wlock);
	if (i)
		obs_warn("too many watched descriptors: channel fd %d is not filtered", ch->fd);
	return ch;
}

static int dep_failed_before(const void *obj)
{
	int i;

	for (i = 0; i < ndep_failed; i++)
		if (dep_failed[i] == obj)
			return 1;
	return 0;
}

/* Dependency mode: destroy ``obj`` of the selected kind through ``real`` and
 * log what it returned (EBUSY from its dependent object, or 0).  A retry of
 * an object whose destroy failed never reaches the library: it is rejected
 * with EIO and logged with retry: true. */
static int dep_destroy(int kind, void *obj, int fd, uint32_t handle, void *real)
{
	char h[32];
	int ret, commands;

	pthread_mutex_lock(&wlock);
	if (dep_failed_before(obj)) {
		log_destroy(kind, fd, handle, EIO, 0, 1);
		pthread_mutex_unlock(&wlock);
		return EIO;
	}
	commands = dep_commands;
	pthread_mutex_unlock(&wlock);

	if (kind == K_CQ)
		ret = ((int (*)(struct ibv_cq *))real)(obj);
	else if (kind == K_PD)
		ret = ((int (*)(struct ibv_pd *))real)(obj);
	else
		ret = ((int (*)(struct ibv_comp_channel *))real)(obj);

	if (kind == K_CHANNEL)
		snprintf(h, sizeof(h), "%d", fd);
	else
		snprintf(h, sizeof(h), "%d:%" PRIu32, fd, handle);
	pthread_mutex_lock(&wlock);
	if (ret && ndep_failed < MAX_FAILED)
		dep_failed[ndep_failed++] = obj;
	/* A CQ or PD destroy is a uverbs command the helper saw; a channel's
	 * refcount is checked by libibverbs before any syscall. */
	obs_log("{\"ev\":\"destroy\",\"kind\":\"%s\",\"handle\":\"%s\","
		"\"errno\":%d,\"injected\":false,\"retry\":false,\"dependency\":true,"
		"\"command\":%s}", kinds[kind].name, h, ret,
		dep_commands > commands ? "true" : "false");
	pthread_mutex_unlock(&wlock);
	return ret;
}

static int ctx_cmd_fd(struct ibv_context *ctx)
{
	return ctx ? ctx->cmd_fd : -1;
}

OBS_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	int (*real)(struct ibv_cq *) = (int (*)(struct ibv_cq *))obs_real("ibv_destroy_cq");

	if (!real)
		return ENOSYS;
	if (!armed || !dependency || sel_kind != K_CQ || !ctx_selected(cq->context))
		return real(cq);
	return dep_destroy(K_CQ, cq, ctx_cmd_fd(cq->context), cq->handle, (void *)real);
}

OBS_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	int (*real)(struct ibv_pd *) = (int (*)(struct ibv_pd *))obs_real("ibv_dealloc_pd");

	if (!real)
		return ENOSYS;
	if (!armed || !dependency || sel_kind != K_PD || !ctx_selected(pd->context))
		return real(pd);
	return dep_destroy(K_PD, pd, ctx_cmd_fd(pd->context), pd->handle, (void *)real);
}

OBS_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	int (*real)(struct ibv_comp_channel *) =
		(int (*)(struct ibv_comp_channel *))obs_real("ibv_destroy_comp_channel");
	struct watched *w;
	int i, fd, ret;

	if (!real)
		return ENOSYS;
	if (!armed || sel_kind != K_CHANNEL)
		return real(ch);
	if (dependency)
		return ch->context && ctx_selected(ch->context) ?
			       dep_destroy(K_CHANNEL, ch, ch->fd, 0, (void *)real) : real(ch);
	pthread_mutex_lock(&wlock);
	for (i = 0; i < nfailed_channels; i++)
		if (failed_channels[i].ch == ch) {
			/* libibverbs already freed it: never forward a retry. */
			log_destroy(K_CHANNEL, failed_channels[i].fd, 0, EIO, 1, 1);
			pthread_mutex_unlock(&wlock);
			return EIO;
		}
	fd = ch->fd;
	w = find_watched(fd, 1);
	if (w)
		w->injected_pending = 0;
	pthread_mutex_unlock(&wlock);

	ret = real(ch);

	pthread_mutex_lock(&wlock);
	w = find_watched(fd, 1);
	if (w && w->injected_pending) {
		/* close() failed, so the kernel object (the descriptor) is
		 * retained; libibverbs returned 0 regardless. */
		w->injected_pending = 0;
		if (nfailed_channels < MAX_FAILED) {
			failed_channels[nfailed_channels].ch = ch;
			failed_channels[nfailed_channels++].fd = fd;
		}
		ret = EIO;
	}
	pthread_mutex_unlock(&wlock);
	return ret;
}

static struct obs_hook uf_hooks[] = {
	{ "ibv_create_comp_channel", (void *)ibv_create_comp_channel, NULL },
	{ "ibv_destroy_comp_channel", (void *)ibv_destroy_comp_channel, NULL },
	{ "ibv_destroy_cq", (void *)ibv_destroy_cq, NULL },
	{ "ibv_dealloc_pd", (void *)ibv_dealloc_pd, NULL },
	{ NULL, NULL, NULL },
};

static void uf_init(void)
{
	const char *kind = getenv("ORBITE_UVERBS_FAULT_KIND");
	const char *dev = getenv("ORBITE_UVERBS_FAULT_DEV");
	const char *writes;
	int k;

	if (getenv("RDMAV_ALLOW_DISASSOC_DESTROY")) {
		obs_warn("refusing to arm: RDMAV_ALLOW_DISASSOC_DESTROY is set, and "
			 "libibverbs would turn the injected destroy EIO into success");
		refuse("RDMAV_ALLOW_DISASSOC_DESTROY is set");
		return;
	}
	for (k = 0; kind && k < K_COUNT; k++)
		if (!strcmp(kind, kinds[k].name))
			sel_kind = k;
	if (sel_kind == K_NONE) {
		obs_warn("not armed: ORBITE_UVERBS_FAULT_KIND=%s is not one of "
			 "qp, mr, mw, cq, channel, pd", kind ? kind : "(unset)");
		refuse(kind ? "ORBITE_UVERBS_FAULT_KIND is not one of qp, mr, mw, cq, channel, pd"
			    : "ORBITE_UVERBS_FAULT_KIND is not set");
		return;
	}
	if (obs_env_long("ORBITE_UVERBS_FAULT_OCCURRENCE", 1, 1, 1L << 30, &sel_occurrence) ||
	    obs_env_long("ORBITE_UVERBS_FAULT_WITHHOLD_SKIP", 0, 0, 1L << 40, &withhold_skip)) {
		obs_warn("not armed: bad configuration");
		refuse("ORBITE_UVERBS_FAULT_OCCURRENCE or ORBITE_UVERBS_FAULT_WITHHOLD_SKIP is not a valid integer");
		return;
	}
	writes = getenv("ORBITE_UVERBS_FAULT_WRITES");
	if (writes && *writes && strcmp(writes, "all") && strcmp(writes, "first")) {
		obs_warn("not armed: ORBITE_UVERBS_FAULT_WRITES=%s is not all or first", writes);
		refuse("ORBITE_UVERBS_FAULT_WRITES is not all or first");
		return;
	}
	all_writes = writes && !strcmp(writes, "all");
	withhold_set = getenv("ORBITE_UVERBS_FAULT_WITHHOLD_SKIP") != NULL;
	writes = getenv("ORBITE_UVERBS_FAULT_DEPENDENCY");
	if (writes && *writes && strcmp(writes, "0")) {
		if (strcmp(writes, "1") || (sel_kind != K_CQ && sel_kind != K_CHANNEL && sel_kind != K_PD)) {
			obs_warn("not armed: ORBITE_UVERBS_FAULT_DEPENDENCY=%s needs 1 and a cq, channel or pd kind",
				 writes);
			refuse("ORBITE_UVERBS_FAULT_DEPENDENCY needs 1 and a cq, channel or pd kind");
			return;
		}
		dependency = 1;
	}
	sel_dev = (dev && *dev) ? dev : NULL;
	armed = 1;
}

const struct obs_tool obs_tool = {
	.name = "uverbs_fault",
	.init = uf_init,
	.withhold = uf_withhold,
	.context_opened = uf_context_opened,
	.context_closing = uf_context_closing,
	.hooks = uf_hooks,
};
