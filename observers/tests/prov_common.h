/* Shared helpers of the loopback provider's test driver and bench: a
 * rendezvous over a Unix socket (the engine's own channel: QPN, GID, rkey and
 * address travel there, payload never does), opening a device, bringing RC
 * QPs to RTS from the peer's (GID, QPN), polling with a deadline, and the
 * seeded content formula.  Header-only: each program includes it once. */
#ifndef PROV_COMMON_H
#define PROV_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "orbite_provider.h"
#include "qp_connect.h"

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: check failed: %s (errno %d)\n",  \
				__FILE__, __LINE__, #cond, errno);               \
			exit(3);                                                 \
		}                                                                \
	} while (0)

static inline uint64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static inline double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One JSON object per line on stdout (the pytest side parses them). */
static inline void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void out(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

/* ---------------------------------------------------------- content -- */

/* Seeded content: byte at offset i of a buffer seeded with s. */
static inline uint8_t pattern(uint32_t seed, uint64_t i)
{
	uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)seed << 32 | seed);

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ull;
	return (uint8_t)(x >> 56);
}

static inline void fill(uint8_t *buf, uint64_t off, uint64_t len, uint32_t seed)
{
	for (uint64_t i = 0; i < len; i++)
		buf[off + i] = pattern(seed, i);
}

/* Number of bytes of buf[off..off+len) that differ from the seeded content. */
static inline uint64_t mismatches(const uint8_t *buf, uint64_t off, uint64_t len, uint32_t seed)
{
	uint64_t bad = 0;

	for (uint64_t i = 0; i < len; i++)
		bad += buf[off + i] != pattern(seed, i);
	return bad;
}

static inline uint64_t not_byte(const uint8_t *buf, uint64_t off, uint64_t len, uint8_t v)
{
	uint64_t bad = 0;

	for (uint64_t i = 0; i < len; i++)
		bad += buf[off + i] != v;
	return bad;
}

/* -------------------------------------------------------- rendezvous -- */

static inline int rv_open(int server, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), c;

	CHECK(fd >= 0 && strlen(path) < sizeof(sa.sun_path));
	strcpy(sa.sun_path, path);
	if (server) {
		unlink(path);
		CHECK(bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 1) == 0);
		c = accept(fd, NULL, NULL);
		CHECK(c >= 0);
		close(fd);
		unlink(path);
		return c;
	}
	for (int i = 0; i < 1000; i++) {
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return fd;
		usleep(10000);
	}
	CHECK(!"rendezvous: server never listened");
	return -1;
}

static inline void rv_send(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		CHECK(n > 0);
		p += n;
		len -= (size_t)n;
	}
}

/* 0, or -1 when the peer closed the rendezvous. */
static inline int rv_recv(int fd, void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = recv(fd, p, len, 0);

		if (n == 0)
			return -1;
		CHECK(n > 0);
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/* ---------------------------------------------------------- endpoint -- */

struct ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	union ibv_gid gid;
	int gid_index;
	uint8_t port;
};

static inline void ep_open(struct ep *e, const char *name, int gid_index, int with_channel, int cqe)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	int i;

	CHECK(list != NULL);
	memset(e, 0, sizeof(*e));
	for (i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			e->ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	CHECK(e->ctx != NULL);
	e->port = 1;
	e->gid_index = gid_index;
	CHECK(ibv_query_gid(e->ctx, e->port, gid_index, &e->gid) == 0);
	e->pd = ibv_alloc_pd(e->ctx);
	CHECK(e->pd != NULL);
	if (with_channel) {
		e->ch = ibv_create_comp_channel(e->ctx);
		CHECK(e->ch != NULL);
	}
	e->cq = ibv_create_cq(e->ctx, cqe, NULL, e->ch, 0);
	CHECK(e->cq != NULL);
}

static inline void ep_close(struct ep *e)
{
	CHECK(ibv_destroy_cq(e->cq) == 0);
	if (e->ch)
		CHECK(ibv_destroy_comp_channel(e->ch) == 0);
	CHECK(ibv_dealloc_pd(e->pd) == 0);
	CHECK(ibv_close_device(e->ctx) == 0);
}

static inline struct ibv_qp *qp_new(struct ep *e, uint32_t max_send_wr, uint32_t max_recv_wr)
{
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.send_cq = e->cq;
	a.recv_cq = e->cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = max_recv_wr;
	a.cap.max_send_sge = 4;
	a.cap.max_recv_sge = 4;
	a.cap.max_inline_data = 64;
	qp = ibv_create_qp(e->pd, &a);
	CHECK(qp != NULL);
	return qp;
}

/* RNR retries the next qp_connect asks for (7 = for ever). */
static int qp_rnr_retry = 7;

/* RESET -> INIT -> RTR -> RTS towards (gid, qpn), as an engine does after
 * the rendezvous; 0 or the errno of the failing step. */
static inline int qp_connect(struct ep *e, struct ibv_qp *qp, const union ibv_gid *gid,
			     uint32_t qpn, int access)
{
	return qp_connect_via(ibv_modify_qp, qp, e->port, (uint8_t)e->gid_index, gid, qpn, access,
			      (uint8_t)qp_rnr_retry);
}

static inline int qp_state(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;

	CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0);
	return (int)a.qp_state;
}

/* Poll until one completion or the deadline: 1 with *wc, 0 on timeout. */
static inline int poll1(struct ibv_cq *cq, struct ibv_wc *wc, int ms)
{
	uint64_t end = mono_ms() + (uint64_t)ms;

	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);

		CHECK(n >= 0);
		if (n == 1)
			return 1;
		if (mono_ms() > end)
			return 0;
		usleep(50);
	}
}

/* A WR of one SGE; the caller fills in its opcode's own fields. */
static inline void wr_one(struct ibv_send_wr *wr, struct ibv_sge *sge, uint64_t wr_id, enum ibv_wr_opcode op,
			  unsigned int flags)
{
	memset(wr, 0, sizeof(*wr));
	wr->wr_id = wr_id;
	wr->sg_list = sge;
	wr->num_sge = 1;
	wr->opcode = op;
	wr->send_flags = flags;
}

static inline int post_rdma(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, void *laddr,
			    uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, unsigned int flags)
{
	struct ibv_sge sge = { (uintptr_t)laddr, len, lkey };
	struct ibv_send_wr wr, *bad = NULL;

	wr_one(&wr, &sge, wr_id, op, flags);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &wr, &bad);
}

#endif
