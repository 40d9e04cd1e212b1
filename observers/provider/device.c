/* Loopback verbs provider: configuration, counters, devices read from a fake
 * sysfs tree (ORBITE_PROVIDER_ROOT), contexts, device/port/GID queries, the
 * string helpers and the entry points it does not model (EOPNOTSUPP). */
#define _GNU_SOURCE
#include "provider.h"

#include <dirent.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <infiniband/sa.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- counters -- */

static const char *const held_names[H_COUNT] = { "ctx", "pd", "mr", "mw", "cq", "channel", "qp", "srq" };
static long held[H_COUNT];
static const char *const stat_names[S_COUNT] = {
	"read_bytes_landed", "write_bytes_sent", "read_bytes_served",
	"write_bytes_landed", "wr_completed", "wr_failed", "stalls",
};
static uint64_t stats[S_COUNT];

void held_add(int kind, long delta)
{
	__atomic_add_fetch(&held[kind], delta, __ATOMIC_SEQ_CST);
}

void stat_add(struct pctx *c, int kind, uint64_t delta)
{
	__atomic_add_fetch(&stats[kind], delta, __ATOMIC_RELAXED);
	if (c)
		__atomic_add_fetch(&c->stats[kind], delta, __ATOMIC_RELAXED);
}

PROV_EXPORT long orbite_provider_held(const char *kind)
{
	int k;

	for (k = 0; kind && k < H_COUNT; k++)
		if (!strcmp(kind, held_names[k]))
			return __atomic_load_n(&held[k], __ATOMIC_SEQ_CST);
	return -1;
}

PROV_EXPORT long long orbite_provider_counter(const char *name)
{
	int k;

	for (k = 0; name && k < S_COUNT; k++)
		if (!strcmp(name, stat_names[k]))
			return (long long)__atomic_load_n(&stats[k], __ATOMIC_RELAXED);
	return -1;
}

PROV_EXPORT long long orbite_provider_ctx_counter(struct ibv_context *ctx, const char *name)
{
	struct pctx *c = pctx_of(ctx);
	int k;

	if (!c)
		return -1;
	for (k = 0; name && k < S_COUNT; k++)
		if (!strcmp(name, stat_names[k]))
			return (long long)__atomic_load_n(&c->stats[k], __ATOMIC_RELAXED);
	return -1;
}

void prov_warn(const char *fmt, ...)
{
	char buf[512];
	int off = snprintf(buf, sizeof(buf), "orbite provider: ");
	va_list ap;
	size_t n;

	va_start(ap, fmt);
	vsnprintf(buf + off, sizeof(buf) - (size_t)off - 1, fmt, ap);
	va_end(ap);
	n = strlen(buf);
	buf[n++] = '\n';
	/* One write: lines of concurrent threads do not interleave. */
	if (write(2, buf, n) < 0)
		return;
}

uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Condition variables of the provider use CLOCK_MONOTONIC (see cond_init). */
void abstime_in(struct timespec *ts, long ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

/* --------------------------------------------------------- configuration -- */

struct prov_config cfg;
static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;

static long env_long(const char *name, long dflt, long min, long max)
{
	const char *s = getenv(name);
	char *end;
	long v;

	if (!s || !*s)
		return dflt;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < min || v > max) {
		prov_warn("%s=%s is not an integer in [%ld, %ld]: using %ld", name, s, min, max, dflt);
		return dflt;
	}
	return v;
}

/* ORBITE_PROVIDER_PAYLOAD: "auto" (the single-copy path where the kernel
 * allows it) or "tcp"; 1 for tcp. */
static int payload_env_tcp(void)
{
	const char *s = getenv("ORBITE_PROVIDER_PAYLOAD");

	if (!s || !*s || !strcmp(s, "auto"))
		return 0;
	if (!strcmp(s, "tcp"))
		return 1;
	prov_warn("ORBITE_PROVIDER_PAYLOAD=%s is not auto or tcp: using auto", s);
	return 0;
}

static void config_read(void)
{
	const char *root = getenv("ORBITE_PROVIDER_ROOT");
	const char *stall = getenv("ORBITE_PROVIDER_STALL");
	const char *cmd = getenv("ORBITE_PROVIDER_CMD");
	size_t n;

	if (root && *root) {
		if (strlen(root) >= sizeof(cfg.root) - 64) {
			prov_warn("ORBITE_PROVIDER_ROOT=%s is longer than %zu bytes: using /", root,
				  sizeof(cfg.root) - 64);
		} else {
			snprintf(cfg.root, sizeof(cfg.root), "%s", root);
			n = strlen(cfg.root);
			while (n > 0 && cfg.root[n - 1] == '/')
				cfg.root[--n] = '\0';
		}
	}
	cfg.chunk = (size_t)env_long("ORBITE_PROVIDER_CHUNK", 1L << 20, 4096, 1L << 30);
	cfg.pace_us = env_long("ORBITE_PROVIDER_PACE_US", 0, 0, 10L * 1000 * 1000);
	cfg.stall_ms = env_long("ORBITE_PROVIDER_STALL_MS", 10000, 1, 3600L * 1000);
	cfg.accept_ms = env_long("ORBITE_PROVIDER_ACCEPT_MS", 30000, 1, 3600L * 1000);
	cfg.hello_ms = env_long("ORBITE_PROVIDER_HELLO_MS", 5000, 100, 60L * 1000);
	cfg.payload_tcp = payload_env_tcp();
	cfg.payload_log = env_long("ORBITE_PROVIDER_PAYLOAD_LOG", 0, 0, 1) == 1;
	cfg.stall_skip = -1;
	if (stall && *stall) {
		unsigned long long skip, bytes;
		char tail;

		if (sscanf(stall, "%llu:%llu%c", &skip, &bytes, &tail) == 2)
			cfg.stall_skip = (long)skip, cfg.stall_bytes = bytes;
		else
			prov_warn("ORBITE_PROVIDER_STALL=%s is not <skip>:<bytes>: no stall", stall);
	}
	cfg.cmd_style = 0;
	if (cmd && *cmd) {
		if (!strcmp(cmd, "write"))
			cfg.cmd_style = 1;
		else if (!strcmp(cmd, "invoke_write"))
			cfg.cmd_style = 2;
		else if (strcmp(cmd, "ioctl"))
			prov_warn("ORBITE_PROVIDER_CMD=%s is not ioctl, write or invoke_write: using ioctl", cmd);
	}
}

void config_load(void)
{
	pthread_once(&cfg_once, config_read);
}

/* ---------------------------------------------------------------- sysfs -- */

/* snprintf that says whether everything fitted (0) or not (-1). */
static int fmt(char *buf, size_t len, const char *f, ...) __attribute__((format(printf, 3, 4)));
static int fmt(char *buf, size_t len, const char *f, ...)
{
	va_list ap;
	int n;

	va_start(ap, f);
	n = vsnprintf(buf, len, f, ap);
	va_end(ap);
	return n < 0 || (size_t)n >= len ? -1 : 0;
}

int sysfs_read(const char *sysdir, const char *rel, char *buf, size_t len)
{
	char path[PATH_MAX];
	ssize_t n;
	int fd;

	if (snprintf(path, sizeof(path), "%s/%s", sysdir, rel) >= (int)sizeof(path))
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n < 0)
		return -1;
	buf[n] = '\0';
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
		buf[--n] = '\0';
	return (int)n;
}

static int parse_gid(const char *text, union ibv_gid *gid)
{
	unsigned int g[8];
	char tail;
	int i;

	if (sscanf(text, "%4x:%4x:%4x:%4x:%4x:%4x:%4x:%4x%c", &g[0], &g[1], &g[2], &g[3],
		   &g[4], &g[5], &g[6], &g[7], &tail) != 8)
		return -1;
	for (i = 0; i < 8; i++) {
		gid->raw[2 * i] = (uint8_t)(g[i] >> 8);
		gid->raw[2 * i + 1] = (uint8_t)g[i];
	}
	return 0;
}

int dev_gid(struct pdev *d, int port, int index, union ibv_gid *gid)
{
	char rel[64], buf[128];

	if (port < 1 || port > d->nports || index < 0)
		return -1;
	snprintf(rel, sizeof(rel), "ports/%d/gids/%d", port, index);
	if (sysfs_read(d->sysdir, rel, buf, sizeof(buf)) < 0)
		return -1;
	return parse_gid(buf, gid);
}

int dev_gid_tbl_len(struct pdev *d, int port)
{
	char path[PATH_MAX];
	struct dirent *e;
	DIR *dir;
	int n = 0;

	snprintf(path, sizeof(path), "%s/ports/%d/gids", d->sysdir, port);
	dir = opendir(path);
	if (!dir)
		return 0;
	while ((e = readdir(dir)))
		if (e->d_name[0] >= '0' && e->d_name[0] <= '9')
			n++;
	closedir(dir);
	return n;
}

int gid_ipv4(const union ibv_gid *gid, uint32_t *addr)
{
	static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	if (memcmp(gid->raw, prefix, sizeof(prefix)))
		return 0;
	memcpy(addr, gid->raw + 12, 4);
	return *addr != 0;
}

int dev_ipv4_addrs(struct pdev *d, uint32_t *out, int max)
{
	int port, i, j, n = 0;

	for (port = 1; port <= d->nports; port++) {
		int len = dev_gid_tbl_len(d, port);

		for (i = 0; i < len; i++) {
			union ibv_gid gid;
			uint32_t a;

			if (dev_gid(d, port, i, &gid) || !gid_ipv4(&gid, &a))
				continue;
			for (j = 0; j < n; j++)
				if (out[j] == a)
					break;
			if (j == n && n < max)
				out[n++] = a;
		}
	}
	return n;
}

/* Leading number of a sysfs "4: ACTIVE" text; -1 when there is none. */
static int sysfs_num(struct pdev *d, const char *rel)
{
	char buf[64];

	if (sysfs_read(d->sysdir, rel, buf, sizeof(buf)) <= 0 || buf[0] < '0' || buf[0] > '9')
		return -1;
	return atoi(buf);
}

/* -------------------------------------------------------------- devices -- */

#define MAX_DEVICES 64

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pdev *devices[MAX_DEVICES];
static int ndevices;

static int count_ports(const char *sysdir)
{
	char path[PATH_MAX];
	struct dirent *e;
	DIR *dir;
	int max = 0;

	snprintf(path, sizeof(path), "%s/ports", sysdir);
	dir = opendir(path);
	if (!dir)
		return 0;
	while ((e = readdir(dir))) {
		int p = atoi(e->d_name);

		if (p > max && p <= MAX_PORTS)
			max = p;
	}
	closedir(dir);
	return max;
}

/* The uverbs class entry whose ibdev names this device ("uverbsN"). */
static void find_uverbs(const char *name, char *out, size_t len)
{
	char path[PATH_MAX], buf[IBV_SYSFS_NAME_MAX + 2];
	struct dirent *e;
	DIR *dir;

	out[0] = '\0';
	snprintf(path, sizeof(path), "%s/sys/class/infiniband_verbs", cfg.root);
	dir = opendir(path);
	if (!dir)
		return;
	while ((e = readdir(dir))) {
		char sub[PATH_MAX];

		if (e->d_name[0] == '.')
			continue;
		if (fmt(sub, sizeof(sub), "%s/%s", path, e->d_name))
			continue;
		if (sysfs_read(sub, "ibdev", buf, sizeof(buf)) > 0 && !strcmp(buf, name) &&
		    !fmt(out, len, "%s", e->d_name))
			break;
		out[0] = '\0';
	}
	closedir(dir);
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Fill a new device's fixed fields; -1 when its paths do not fit. */
static int init_device(struct pdev *d, const char *path, const char *name, int i)
{
	char buf[64];

	if (fmt(d->dev.name, sizeof(d->dev.name), "%s", name) ||
	    fmt(d->sysdir, sizeof(d->sysdir), "%s/%s", path, name)) {
		prov_warn("%s/%s: path too long, device ignored", path, name);
		return -1;
	}
	find_uverbs(name, d->dev.dev_name, sizeof(d->dev.dev_name));
	if (!d->dev.dev_name[0])
		fmt(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", i);
	/* Informative only (the provider reads sysdir): cut if too long. */
	fmt(d->dev.dev_path, sizeof(d->dev.dev_path), "%s/sys/class/infiniband_verbs/%s", cfg.root,
	    d->dev.dev_name);
	fmt(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "%s", d->sysdir);
	d->dev.node_type = IBV_NODE_CA;
	if (sysfs_read(d->sysdir, "node_type", buf, sizeof(buf)) > 0 && atoi(buf) > 0)
		d->dev.node_type = (enum ibv_node_type)atoi(buf);
	d->dev.transport_type = d->dev.node_type == IBV_NODE_RNIC ? IBV_TRANSPORT_IWARP : IBV_TRANSPORT_IB;
	return 0;
}

/* Rescan <root>/sys/class/infiniband (dev_lock held).  Device objects are
 * never freed nor rewritten (an open context keeps pointing at its device):
 * a vanished one is only hidden. */
static void scan_devices(void)
{
	char path[PATH_MAX];
	char *names[MAX_DEVICES];
	struct dirent *e;
	int n = 0, i, j;
	DIR *dir;

	snprintf(path, sizeof(path), "%s/sys/class/infiniband", cfg.root);
	for (i = 0; i < ndevices; i++)
		devices[i]->present = 0;
	dir = opendir(path);
	if (!dir)
		return;
	while ((e = readdir(dir)) && n < MAX_DEVICES) {
		if (e->d_name[0] == '.' || strlen(e->d_name) >= IBV_SYSFS_NAME_MAX)
			continue;
		names[n] = strdup(e->d_name);
		if (names[n])
			n++;
	}
	closedir(dir);
	qsort(names, (size_t)n, sizeof(names[0]), cmp_names);
	for (i = 0; i < n; i++) {
		struct pdev *d = NULL;

		for (j = 0; j < ndevices; j++)
			if (!strcmp(devices[j]->dev.name, names[i]))
				d = devices[j];
		if (!d && ndevices < MAX_DEVICES) {
			d = calloc(1, sizeof(*d));
			if (d && init_device(d, path, names[i], i)) {
				free(d);
				d = NULL;
			}
			if (d)
				devices[ndevices++] = d;
		}
		free(names[i]);
		if (!d)
			continue;
		d->nports = count_ports(d->sysdir);
		d->index = i;
		d->present = 1;
	}
}

PROV_EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	struct ibv_device **list;
	int i, n = 0;

	config_load();
	pthread_mutex_lock(&dev_lock);
	scan_devices();
	list = calloc((size_t)ndevices + 1, sizeof(*list));
	if (list) {
		for (i = 0; i < ndevices; i++)
			if (devices[i]->present)
				list[n++] = &devices[i]->dev;
	}
	pthread_mutex_unlock(&dev_lock);
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	/* Sorted by name, whatever the order of discovery. */
	for (i = 1; i < n; i++) {
		struct ibv_device *x = list[i];
		int k = i - 1;

		while (k >= 0 && strcmp(list[k]->name, x->name) > 0) {
			list[k + 1] = list[k];
			k--;
		}
		list[k + 1] = x;
	}
	if (num)
		*num = n;
	return list;
}

PROV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

PROV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

static struct pdev *our_device(struct ibv_device *device)
{
	int i;

	pthread_mutex_lock(&dev_lock);
	for (i = 0; i < ndevices; i++)
		if (&devices[i]->dev == device) {
			pthread_mutex_unlock(&dev_lock);
			return devices[i];
		}
	pthread_mutex_unlock(&dev_lock);
	return NULL;
}

static uint64_t read_guid(struct pdev *d, const char *file)
{
	unsigned int g[4];
	char buf[64];

	if (sysfs_read(d->sysdir, file, buf, sizeof(buf)) <= 0 ||
	    sscanf(buf, "%4x:%4x:%4x:%4x", &g[0], &g[1], &g[2], &g[3]) != 4)
		return 0;
	return ((uint64_t)g[0] << 48) | ((uint64_t)g[1] << 32) | ((uint64_t)g[2] << 16) | g[3];
}

PROV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	struct pdev *d = our_device(device);

	return d ? htobe64(read_guid(d, "node_guid")) : 0;
}

PROV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	struct pdev *d = our_device(device);

	return d ? d->index : -1;
}

/* ------------------------------------------------------------- contexts -- */

static struct pctx *to_ctx(struct ibv_context *ctx)
{
	return pctx_of(ctx);
}

uint32_t ctx_new_handle(struct pctx *c)
{
	uint32_t h;

	pthread_mutex_lock(&c->lock);
	h = c->next_handle++;
	pthread_mutex_unlock(&c->lock);
	return h;
}

void ctx_async_event(struct pctx *c, uint64_t element, enum ibv_event_type type)
{
	struct ib_uverbs_async_event_desc ev = { .element = element, .event_type = (uint32_t)type };

	if (c->async_wfd >= 0)
		send(c->async_wfd, &ev, sizeof(ev), MSG_DONTWAIT | MSG_NOSIGNAL);
}

PROV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct pdev *d;
	struct pctx *c;
	pthread_condattr_t ca;
	int sv[2];

	config_load();
	d = our_device(device);
	if (!d) {
		errno = ENODEV;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	/* The "uverbs" descriptor: destroy commands are real ioctl()/write()
	 * calls on it (see uverbs_destroy); /dev/null answers the ioctl with
	 * ENOTTY, which means the command reached the kernel untouched. */
	c->vctx.context.cmd_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (c->vctx.context.cmd_fd < 0 || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
		int err = errno;

		if (c->vctx.context.cmd_fd >= 0)
			close(c->vctx.context.cmd_fd);
		free(c);
		errno = err;
		return NULL;
	}
	c->vctx.context.async_fd = sv[0];
	c->async_wfd = sv[1];
	c->vctx.context.device = device;
	c->vctx.context.num_comp_vectors = 8;
	c->dev = d;
	pthread_mutex_init(&c->vctx.context.mutex, NULL);
	pthread_mutex_init(&c->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cond, &ca);
	pthread_condattr_destroy(&ca);
	c->next_handle = 1;
	c->nkeys = 1; /* key index 0 is never handed out */
	c->vctx.context.ops.post_send = dp_post_send;
	c->vctx.context.ops.post_recv = dp_post_recv;
	c->vctx.context.ops.poll_cq = dp_poll_cq;
	c->vctx.context.ops.req_notify_cq = dp_req_notify_cq;
	c->vctx.context.ops.alloc_mw = obj_alloc_mw;
	c->vctx.context.ops.dealloc_mw = obj_dealloc_mw;
	c->vctx.context.ops.bind_mw = dp_bind_mw;
	/* As rdma-core's verbs_init_context: the extended verbs live in the
	 * verbs_context just before the ibv_context, found through sz. */
	c->vctx.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	c->vctx.sz = sizeof(c->vctx);
	c->vctx.query_device_ex = dev_query_device_ex;
	c->vctx.create_cq_ex = obj_create_cq_ex;
	c->vctx.create_qp_ex = obj_create_qp_ex;
	c->vctx.create_srq_ex = obj_create_srq_ex;
	c->vctx.context.ops.post_srq_recv = dp_post_srq_recv;
	held_add(H_CTX, 1);
	return &c->vctx.context;
}

PROV_EXPORT int ibv_close_device(struct ibv_context *ctx)
{
	struct pctx *c = to_ctx(ctx);

	/* As closing the uverbs descriptor does: the kernel releases every
	 * object of the context, whatever the program still points at. */
	objects_close_context(c);
	close(ctx->cmd_fd);
	close(ctx->async_fd);
	close(c->async_wfd);
	free(c->keys);
	free(c->qps);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&ctx->mutex);
	free(c);
	held_add(H_CTX, -1);
	return 0;
}

PROV_EXPORT int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	struct ib_uverbs_async_event_desc ev;

	if (read(ctx->async_fd, &ev, sizeof(ev)) != (ssize_t)sizeof(ev))
		return -1;
	event->event_type = (enum ibv_event_type)ev.event_type;
	switch (event->event_type) {
	case IBV_EVENT_CQ_ERR:
		event->element.cq = (struct ibv_cq *)(uintptr_t)ev.element;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		event->element.qp = (struct ibv_qp *)(uintptr_t)ev.element;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		event->element.srq = (struct ibv_srq *)(uintptr_t)ev.element;
		break;
	default:
		event->element.port_num = (int)ev.element;
		break;
	}
	return 0;
}

PROV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	if (event->event_type == IBV_EVENT_CQ_ERR && event->element.cq) {
		struct ibv_cq *cq = event->element.cq;

		pthread_mutex_lock(&cq->mutex);
		cq->async_events_completed++;
		pthread_cond_signal(&cq->cond);
		pthread_mutex_unlock(&cq->mutex);
	}
	if ((event->event_type == IBV_EVENT_SRQ_LIMIT_REACHED || event->event_type == IBV_EVENT_SRQ_ERR) &&
	    event->element.srq) {
		struct ibv_srq *srq = event->element.srq;

		pthread_mutex_lock(&srq->mutex);
		srq->events_completed++;
		pthread_cond_signal(&srq->cond);
		pthread_mutex_unlock(&srq->mutex);
	}
}

/* -------------------------------------------------------------- queries -- */

PROV_EXPORT int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	struct pdev *d = to_ctx(ctx)->dev;
	char buf[64];
	uint64_t guid = read_guid(d, "node_guid");
	uint64_t sys = read_guid(d, "sys_image_guid");

	memset(attr, 0, sizeof(*attr));
	if (sysfs_read(d->sysdir, "fw_ver", buf, sizeof(buf)) > 0)
		snprintf(attr->fw_ver, sizeof(attr->fw_ver), "%s", buf);
	attr->node_guid = htobe64(guid);
	attr->sys_image_guid = htobe64(sys ? sys : guid);
	attr->max_mr_size = UINT64_MAX;
	attr->page_size_cap = 0xfffffffffffff000ull;
	attr->vendor_id = 0x02c9; /* what mlx5 reports: the Mellanox OUI */
	if (sysfs_read(d->sysdir, "device/vendor", buf, sizeof(buf)) > 0 && strcmp(buf, "0x15b3"))
		attr->vendor_id = (uint32_t)strtoul(buf, NULL, 16);
	if (sysfs_read(d->sysdir, "device/device", buf, sizeof(buf)) > 0)
		attr->vendor_part_id = (uint32_t)strtoul(buf, NULL, 16);
	attr->max_qp = 1 << 16;
	attr->max_qp_wr = 32768;
	attr->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT |
				 IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_MEM_WINDOW |
				 IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_MEM_MGT_EXTENSIONS;
	attr->max_sge = 30;
	attr->max_sge_rd = 30;
	attr->max_cq = 1 << 16;
	attr->max_cqe = 4194303;
	attr->max_mr = 1 << 20;
	attr->max_pd = 1 << 20;
	attr->max_qp_rd_atom = 16;
	attr->max_qp_init_rd_atom = 16;
	attr->max_res_rd_atom = 1 << 20;
	attr->atomic_cap = IBV_ATOMIC_HCA;
	attr->max_mw = 1 << 20;
	attr->max_srq = 1 << 16;
	attr->max_srq_wr = MAX_WR - 1; /* as mlx5: 32767 */
	attr->max_srq_sge = MAX_SGE;
	attr->max_pkeys = 1;
	attr->local_ca_ack_delay = 16;
	attr->phys_port_cnt = (uint8_t)d->nports;
	return 0;
}

/* What mlx5 reports beyond ibv_device_attr, for what is modelled (no ODP,
 * TSO, RSS, WQs, packet pacing, tag matching, device memory or completion
 * timestamps: those stay 0). */
int dev_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
			struct ibv_device_attr_ex *attr, size_t attr_size)
{
	struct ibv_device_attr_ex full;
	int ret;

	if (input && input->comp_mask)
		return EINVAL;
	if (attr_size < sizeof(full.orig_attr))
		return EINVAL;
	memset(&full, 0, sizeof(full));
	ret = ibv_query_device(ctx, &full.orig_attr);
	if (ret)
		return ret;
	full.device_cap_flags_ex = full.orig_attr.device_cap_flags;
	full.phys_port_cnt_ex = full.orig_attr.phys_port_cnt;
	/* A caller built against an older verbs.h passes a shorter struct. */
	memcpy(attr, &full, attr_size < sizeof(full) ? attr_size : sizeof(full));
	return 0;
}

static enum ibv_mtu mtu_of(int bytes)
{
	/* RoCE: the largest IB MTU that fits the netdev MTU. */
	if (bytes >= 4096 + 100)
		return IBV_MTU_4096;
	if (bytes >= 2048 + 100)
		return IBV_MTU_2048;
	if (bytes >= 1024 + 100)
		return IBV_MTU_1024;
	if (bytes >= 512 + 100)
		return IBV_MTU_512;
	return IBV_MTU_256;
}

/* ibv_port_attr up to `flags`; the inline ibv_query_port zeroes the rest. */
static int query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *a)
{
	struct pdev *d = to_ctx(ctx)->dev;
	char rel[64], buf[128], ndev[64];
	int v;

	if (port < 1 || port > d->nports) {
		errno = EINVAL;
		return EINVAL;
	}
	snprintf(rel, sizeof(rel), "ports/%d/state", port);
	v = sysfs_num(d, rel);
	a->state = v < 0 ? IBV_PORT_NOP : (enum ibv_port_state)v;
	snprintf(rel, sizeof(rel), "ports/%d/phys_state", port);
	v = sysfs_num(d, rel);
	a->phys_state = (uint8_t)(v < 0 ? 0 : v);
	snprintf(rel, sizeof(rel), "ports/%d/link_layer", port);
	a->link_layer = IBV_LINK_LAYER_ETHERNET;
	if (sysfs_read(d->sysdir, rel, buf, sizeof(buf)) > 0 && !strcmp(buf, "InfiniBand"))
		a->link_layer = IBV_LINK_LAYER_INFINIBAND;
	snprintf(rel, sizeof(rel), "ports/%d/lid", port);
	a->lid = 0;
	if (sysfs_read(d->sysdir, rel, buf, sizeof(buf)) > 0)
		a->lid = (uint16_t)strtoul(buf, NULL, 0);
	a->gid_tbl_len = dev_gid_tbl_len(d, port);
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = IBV_MTU_1024;
	snprintf(rel, sizeof(rel), "ports/%d/gid_attrs/ndevs/0", port);
	if (sysfs_read(d->sysdir, rel, ndev, sizeof(ndev)) > 0 && !strchr(ndev, '/')) {
		char netdir[PATH_MAX];

		snprintf(netdir, sizeof(netdir), "%s/sys/class/net/%s", cfg.root, ndev);
		if (sysfs_read(netdir, "mtu", buf, sizeof(buf)) > 0)
			a->active_mtu = mtu_of(atoi(buf));
	}
	if (a->link_layer == IBV_LINK_LAYER_INFINIBAND)
		a->active_mtu = IBV_MTU_4096;
	a->port_cap_flags = a->link_layer == IBV_LINK_LAYER_ETHERNET ?
			    (IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS) : IBV_PORT_CM_SUP;
	a->max_msg_sz = 1u << 31;
	a->pkey_tbl_len = 1;
	a->max_vl_num = 4;
	a->active_width = 2; /* 4X */
	a->active_speed = 32; /* EDR */
	snprintf(rel, sizeof(rel), "ports/%d/rate", port);
	if (sysfs_read(d->sysdir, rel, buf, sizeof(buf)) > 0) {
		if (strstr(buf, "1X"))
			a->active_width = 1;
		if (strstr(buf, "HDR"))
			a->active_speed = 64;
	}
	a->flags = 0;
	return 0;
}

/* The symbol behind the inline ibv_query_port of <infiniband/verbs.h> (a
 * plain ibv_context has no extended query_port op), which zeroed the whole
 * struct first. */
PROV_EXPORT int(ibv_query_port)(struct ibv_context *ctx, uint8_t port,
				struct _compat_ibv_port_attr *attr)
{
	return query_port(ctx, port, (struct ibv_port_attr *)attr);
}

PROV_EXPORT int orbite_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	memset(attr, 0, sizeof(*attr));
	return query_port(ctx, port, attr);
}

PROV_EXPORT int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	return dev_gid(to_ctx(ctx)->dev, port, index, gid) ? -1 : 0;
}

static int gid_type_of(struct pdev *d, int port, int index, int *type, int *ifindex)
{
	char rel[96], buf[64], ndev[64];

	snprintf(rel, sizeof(rel), "ports/%d/gid_attrs/types/%d", port, index);
	if (sysfs_read(d->sysdir, rel, buf, sizeof(buf)) <= 0)
		return ENODATA; /* an unused slot (EINVAL on a real host) */
	if (!strcmp(buf, "RoCE v2"))
		*type = IBV_GID_TYPE_ROCE_V2;
	else
		*type = IBV_GID_TYPE_ROCE_V1;
	*ifindex = 0;
	snprintf(rel, sizeof(rel), "ports/%d/gid_attrs/ndevs/%d", port, index);
	if (sysfs_read(d->sysdir, rel, ndev, sizeof(ndev)) > 0 && !strchr(ndev, '/')) {
		char netdir[PATH_MAX];

		snprintf(netdir, sizeof(netdir), "%s/sys/class/net/%s", cfg.root, ndev);
		if (sysfs_read(netdir, "ifindex", buf, sizeof(buf)) > 0)
			*ifindex = atoi(buf);
	} else {
		/* No netdev: an InfiniBand port. */
		*type = IBV_GID_TYPE_IB;
	}
	return 0;
}

PROV_EXPORT int _ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
				  struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	struct pdev *d = to_ctx(ctx)->dev;
	struct ibv_gid_entry e;
	int type, ifindex, rc;

	if (flags || entry_size < sizeof(e) || port < 1 || port > (uint32_t)d->nports ||
	    index >= (uint32_t)dev_gid_tbl_len(d, (int)port))
		return EINVAL;
	memset(&e, 0, sizeof(e));
	if (dev_gid(d, (int)port, (int)index, &e.gid))
		return EINVAL;
	rc = gid_type_of(d, (int)port, (int)index, &type, &ifindex);
	if (rc)
		return rc;
	e.gid_index = index;
	e.port_num = port;
	e.gid_type = (uint32_t)type;
	e.ndev_ifindex = (uint32_t)ifindex;
	memcpy(entry, &e, sizeof(e));
	return 0;
}

PROV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *ctx, struct ibv_gid_entry *entries,
					 size_t max_entries, uint32_t flags, size_t entry_size)
{
	struct pdev *d = to_ctx(ctx)->dev;
	size_t n = 0;
	int port, i;

	if (flags || entry_size < sizeof(*entries))
		return -EINVAL;
	for (port = 1; port <= d->nports; port++) {
		int len = dev_gid_tbl_len(d, port);

		for (i = 0; i < len; i++) {
			struct ibv_gid_entry e;

			if (_ibv_query_gid_ex(ctx, (uint32_t)port, (uint32_t)i, &e, 0, sizeof(e)))
				continue;
			if (n == max_entries)
				return -EINVAL; /* rdma-core: the buffer is too short */
			memcpy((uint8_t *)entries + n * entry_size, &e, sizeof(e));
			n++;
		}
	}
	return (ssize_t)n;
}

/* Private libibverbs entry point (pyverbs uses it): 0 = IB/RoCE v1, 1 = RoCE v2. */
PROV_EXPORT int ibv_query_gid_type(struct ibv_context *ctx, uint8_t port, unsigned int index, int *type)
{
	int t, ifindex;

	if (gid_type_of(to_ctx(ctx)->dev, port, (int)index, &t, &ifindex)) {
		errno = EINVAL;
		return -1;
	}
	*type = t == IBV_GID_TYPE_ROCE_V2 ? 1 : 0;
	return 0;
}

PROV_EXPORT int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
	if (port < 1 || port > to_ctx(ctx)->dev->nports || index != 0)
		return -1;
	*pkey = htobe16(0xffff);
	return 0;
}

PROV_EXPORT int ibv_get_pkey_index(struct ibv_context *ctx, uint8_t port, __be16 pkey)
{
	__be16 p;

	if (ibv_query_pkey(ctx, port, 0, &p) == 0 && p == pkey)
		return 0;
	return -1;
}

/* -------------------------------------------------------------- strings -- */

PROV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const s[] = {
		"success", "local length error", "local QP operation error",
		"local EE context operation error", "local protection error",
		"Work Request Flushed Error", "memory management operation error",
		"bad response error", "local access error", "remote invalid request error",
		"remote access error", "remote operation error", "transport retry counter exceeded",
		"RNR retry counter exceeded", "local RDD violation error",
		"remote invalid RD request", "aborted error", "invalid EE context number",
		"invalid EE context state", "fatal error", "response timeout error",
		"general error", "TM error", "TM software rendezvous",
	};

	if ((unsigned)status < sizeof(s) / sizeof(s[0]))
		return s[status];
	return "unknown";
}

PROV_EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
	static const char *const s[] = { "unknown", "InfiniBand channel adapter", "InfiniBand switch",
					 "InfiniBand router", "iWARP NIC", "usNIC", "usNIC UDP",
					 "unspecified" };

	if (t >= IBV_NODE_CA && (unsigned)t < sizeof(s) / sizeof(s[0]))
		return s[t];
	return "unknown";
}

PROV_EXPORT const char *ibv_port_state_str(enum ibv_port_state s)
{
	static const char *const n[] = { "PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED",
					 "PORT_ACTIVE", "PORT_ACTIVE_DEFER" };

	if ((unsigned)s < sizeof(n) / sizeof(n[0]))
		return n[s];
	return "unknown";
}

PROV_EXPORT const char *ibv_event_type_str(enum ibv_event_type e)
{
	static const char *const n[] = {
		"CQ error", "local work queue catastrophic error", "invalid request local work queue error",
		"local access violation work queue error", "communication established", "send queue drained",
		"path migrated", "path migration request error", "local catastrophic error", "port active",
		"port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
		"SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
		"WQ fatal",
	};

	if ((unsigned)e < sizeof(n) / sizeof(n[0]))
		return n[e];
	return "unknown";
}

static const struct {
	int rate, mult, mbps;
} rates[] = {
	{ IBV_RATE_2_5_GBPS, 1, 2500 }, { IBV_RATE_5_GBPS, 2, 5000 },
	{ IBV_RATE_10_GBPS, 4, 10000 }, { IBV_RATE_20_GBPS, 8, 20000 },
	{ IBV_RATE_30_GBPS, 12, 30000 }, { IBV_RATE_40_GBPS, 16, 40000 },
	{ IBV_RATE_60_GBPS, 24, 60000 }, { IBV_RATE_80_GBPS, 32, 80000 },
	{ IBV_RATE_120_GBPS, 48, 120000 }, { IBV_RATE_14_GBPS, 0, 14062 },
	{ IBV_RATE_56_GBPS, 0, 56250 }, { IBV_RATE_112_GBPS, 0, 112500 },
	{ IBV_RATE_168_GBPS, 0, 168750 }, { IBV_RATE_25_GBPS, 0, 25781 },
	{ IBV_RATE_100_GBPS, 0, 103125 }, { IBV_RATE_200_GBPS, 0, 206250 },
	{ IBV_RATE_300_GBPS, 0, 309375 }, { IBV_RATE_400_GBPS, 0, 412500 },
};
#define NRATES ((int)(sizeof(rates) / sizeof(rates[0])))

PROV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
	int i;

	for (i = 0; i < NRATES; i++)
		if (rates[i].rate == (int)rate && rates[i].mult)
			return rates[i].mult;
	return -1;
}

PROV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
	int i;

	for (i = 0; i < NRATES; i++)
		if (rates[i].mult == mult && mult)
			return (enum ibv_rate)rates[i].rate;
	return IBV_RATE_MAX;
}

PROV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
	int i;

	for (i = 0; i < NRATES; i++)
		if (rates[i].rate == (int)rate)
			return rates[i].mbps;
	return -1;
}

PROV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
	int i;

	for (i = 0; i < NRATES; i++)
		if (rates[i].mbps == mbps)
			return (enum ibv_rate)rates[i].rate;
	return IBV_RATE_MAX;
}

/* ----------------------------------------------------- fork and not modelled -- */

PROV_EXPORT int ibv_fork_init(void)
{
	return 0; /* nothing is pinned by a kernel: fork needs no preparation */
}

PROV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
	return IBV_FORK_UNNEEDED;
}

/* The rest of the libibverbs ABI that programs (pyverbs) link against but
 * the provider does not model: present, so such programs load, and failing
 * with EOPNOTSUPP when called. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#define UNSUPPORTED_PTR(ret, name, ...)                 \
	PROV_EXPORT ret *name(__VA_ARGS__)              \
	{                                               \
		errno = EOPNOTSUPP;                     \
		return NULL;                            \
	}
#define UNSUPPORTED_INT(name, ...)                      \
	PROV_EXPORT int name(__VA_ARGS__)               \
	{                                               \
		errno = EOPNOTSUPP;                     \
		return EOPNOTSUPP;                      \
	}

UNSUPPORTED_PTR(struct ibv_ah, ibv_create_ah, struct ibv_pd *pd, struct ibv_ah_attr *attr)
UNSUPPORTED_PTR(struct ibv_ah, ibv_create_ah_from_wc, struct ibv_pd *pd, struct ibv_wc *wc,
		struct ibv_grh *grh, uint8_t port)
UNSUPPORTED_INT(ibv_destroy_ah, struct ibv_ah *ah)
UNSUPPORTED_INT(ibv_init_ah_from_wc, struct ibv_context *ctx, uint8_t port, struct ibv_wc *wc,
		struct ibv_grh *grh, struct ibv_ah_attr *ah)
UNSUPPORTED_INT(ibv_attach_mcast, struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
UNSUPPORTED_INT(ibv_detach_mcast, struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
UNSUPPORTED_INT(ibv_resize_cq, struct ibv_cq *cq, int cqe)
UNSUPPORTED_INT(ibv_rereg_mr, struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
		size_t length, int access)
UNSUPPORTED_PTR(struct ibv_context, ibv_import_device, int cmd_fd)
UNSUPPORTED_PTR(struct ibv_pd, ibv_import_pd, struct ibv_context *ctx, uint32_t handle)
UNSUPPORTED_PTR(struct ibv_mr, ibv_import_mr, struct ibv_pd *pd, uint32_t handle)
UNSUPPORTED_PTR(struct ibv_dm, ibv_import_dm, struct ibv_context *ctx, uint32_t handle)
UNSUPPORTED_PTR(struct ibv_mr, ibv_reg_dmabuf_mr, struct ibv_pd *pd, uint64_t offset, size_t length,
		uint64_t iova, int fd, int access)
UNSUPPORTED_INT(ibv_query_ece, struct ibv_qp *qp, struct ibv_ece *ece)
UNSUPPORTED_INT(ibv_set_ece, struct ibv_qp *qp, struct ibv_ece *ece)
UNSUPPORTED_INT(ibv_resolve_eth_l2_from_gid, struct ibv_context *ctx, struct ibv_ah_attr *attr,
		uint8_t eth_mac[6], uint16_t *vid)
#pragma GCC diagnostic pop

PROV_EXPORT void ibv_unimport_pd(struct ibv_pd *pd)
{
	(void)pd;
}

PROV_EXPORT void ibv_unimport_mr(struct ibv_mr *mr)
{
	(void)mr;
}

PROV_EXPORT void ibv_unimport_dm(struct ibv_dm *dm)
{
	(void)dm;
}

PROV_EXPORT int ibv_query_qp_data_in_order(struct ibv_qp *qp, enum ibv_wr_opcode op, uint32_t flags)
{
	(void)qp;
	(void)op;
	(void)flags;
	return 0; /* no promise beyond the completion */
}

PROV_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

PROV_EXPORT int ibv_dofork_range(void *base, size_t size)
{
	(void)base;
	(void)size;
	return 0;
}

/* ---------------------------------------------- helpers librdmacm links -- */

/* sysfs as the provider sees it: <ORBITE_PROVIDER_ROOT>/sys (driver.h's
 * const char *(void); librdmacm builds its paths from it). */
static char sysfs_path[sizeof(cfg.root) + sizeof("/sys")];
static pthread_once_t sysfs_path_once = PTHREAD_ONCE_INIT;

static void sysfs_path_init(void)
{
	config_load();
	snprintf(sysfs_path, sizeof(sysfs_path), "%s/sys", cfg.root);
}

PROV_EXPORT const char *ibv_get_sysfs_path(void)
{
	pthread_once(&sysfs_path_once, sysfs_path_init);
	return sysfs_path;
}

PROV_EXPORT int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size)
{
	char path[PATH_MAX];
	ssize_t n;
	int fd;

	if (!size || fmt(path, sizeof(path), "%s/%s", dir, file))
		return -1;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, size);
	close(fd);
	if (n < 0)
		return -1;
	if ((size_t)n == size)
		n--;
	buf[n] = '\0';
	if (n > 0 && buf[n - 1] == '\n')
		buf[--n] = '\0';
	return (int)n;
}

PROV_EXPORT void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst,
					    struct ib_uverbs_ah_attr *src)
{
	memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid));
	dst->grh.flow_label = src->grh.flow_label;
	dst->grh.sgid_index = src->grh.sgid_index;
	dst->grh.hop_limit = src->grh.hop_limit;
	dst->grh.traffic_class = src->grh.traffic_class;
	dst->dlid = src->dlid;
	dst->sl = src->sl;
	dst->src_path_bits = src->src_path_bits;
	dst->static_rate = src->static_rate;
	dst->is_global = src->is_global;
	dst->port_num = src->port_num;
}

PROV_EXPORT void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src)
{
	dst->cur_qp_state = (enum ibv_qp_state)src->cur_qp_state;
	dst->path_mtu = (enum ibv_mtu)src->path_mtu;
	dst->path_mig_state = (enum ibv_mig_state)src->path_mig_state;
	dst->qkey = src->qkey;
	dst->rq_psn = src->rq_psn;
	dst->sq_psn = src->sq_psn;
	dst->dest_qp_num = src->dest_qp_num;
	dst->qp_access_flags = src->qp_access_flags;
	dst->cap.max_send_wr = src->max_send_wr;
	dst->cap.max_recv_wr = src->max_recv_wr;
	dst->cap.max_send_sge = src->max_send_sge;
	dst->cap.max_recv_sge = src->max_recv_sge;
	dst->cap.max_inline_data = src->max_inline_data;
	ibv_copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
	ibv_copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);
	dst->pkey_index = src->pkey_index;
	dst->alt_pkey_index = src->alt_pkey_index;
	dst->en_sqd_async_notify = src->en_sqd_async_notify;
	dst->sq_draining = src->sq_draining;
	dst->max_rd_atomic = src->max_rd_atomic;
	dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
	dst->min_rnr_timer = src->min_rnr_timer;
	dst->port_num = src->port_num;
	dst->timeout = src->timeout;
	dst->retry_cnt = src->retry_cnt;
	dst->rnr_retry = src->rnr_retry;
	dst->alt_port_num = src->alt_port_num;
	dst->alt_timeout = src->alt_timeout;
}

PROV_EXPORT void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst,
					     struct ib_user_path_rec *src)
{
	memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid));
	memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid));
	dst->dlid = src->dlid;
	dst->slid = src->slid;
	dst->raw_traffic = (int)src->raw_traffic;
	dst->flow_label = src->flow_label;
	dst->hop_limit = src->hop_limit;
	dst->traffic_class = src->traffic_class;
	dst->reversible = (int)src->reversible;
	dst->numb_path = src->numb_path;
	dst->pkey = src->pkey;
	dst->sl = src->sl;
	dst->mtu_selector = src->mtu_selector;
	dst->mtu = (uint8_t)src->mtu;
	dst->rate_selector = src->rate_selector;
	dst->rate = src->rate;
	dst->packet_life_time_selector = src->packet_life_time_selector;
	dst->packet_life_time = src->packet_life_time;
	dst->preference = src->preference;
}

PROV_EXPORT void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst,
					   struct ibv_sa_path_rec *src)
{
	memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
	memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
	dst->dlid = src->dlid;
	dst->slid = src->slid;
	dst->raw_traffic = (uint32_t)src->raw_traffic;
	dst->flow_label = src->flow_label;
	dst->hop_limit = src->hop_limit;
	dst->traffic_class = src->traffic_class;
	dst->reversible = (uint32_t)src->reversible;
	dst->numb_path = src->numb_path;
	dst->pkey = src->pkey;
	dst->sl = src->sl;
	dst->mtu_selector = src->mtu_selector;
	dst->mtu = src->mtu;
	dst->rate_selector = src->rate_selector;
	dst->rate = src->rate;
	dst->packet_life_time_selector = src->packet_life_time_selector;
	dst->packet_life_time = src->packet_life_time;
	dst->preference = src->preference;
}
