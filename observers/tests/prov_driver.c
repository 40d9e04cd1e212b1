/* Test driver of the loopback verbs provider: two processes, each with its own
 * fake host (ORBITE_PROVIDER_ROOT), linked against the provider's
 * libibverbs.so.1.  The server owns memory and answers commands on the
 * rendezvous (create and connect a QP, fill/check its buffer, post receives,
 * bind windows, report counters); the client runs one scenario and checks
 * every byte itself.  Results are JSON lines on stdout, last {"op":"done"}.
 *
 *   prov_driver server <rendezvous> <device>
 *   prov_driver client <rendezvous> <device> <scenario> [arg]
 *
 * Scenarios: rw, errors, sqfull, events, ebusy, destroy <kind>, partial,
 * partial_env, partial_pace, observe, mw, ext_cq, ext_post, atomics, srq, teardown,
 * handshake <silent|trickle|destroy|overflow|rogue_responder> <the server's hello deadline, ms>, and
 * bench <READ|WRITE> <message bytes> <total bytes> <WRs in flight> <spin|sleep|events> <span>
 * (how the program waits for completions: busy polling, polling with a
 * 50 us sleep when the CQ is empty, or the completion channel; messages
 * cycle through <span> bytes of both buffers). */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>

#include "prov_common.h"

#define GID_INDEX 3 /* RoCE v2, IPv4-mapped (fake_sysfs sim hosts) */
#define MAIN_LEN (40u << 20)
#define SIDE_LEN (1u << 20)
#define LBUF_LEN (40u << 20)
#define SENT_S 0xA5 /* server sentinel */
#define SENT_C 0x5A /* client sentinel */
#define RW (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

enum cmd {
	C_HELLO = 1, C_NEWQP, C_FILL, C_SENT, C_CHECK, C_CHECKPART, C_QPSTATE, C_POSTRECV,
	C_POLL, C_MW, C_INV, C_COUNTERS, C_HELD, C_DESTROYQP, C_PAYLOAD, C_BYE,
	C_DELAYSENDS, C_RECVTEARDOWN,
};

struct msg {
	uint32_t cmd, idx;
	uint64_t a, b, c;
	uint8_t gid[16];
};

struct reply {
	int64_t v[8];
	uint8_t gid[16];
};

/* The teardown scenario widens one race on purpose: while delay_sends_ms is
 * set, every send() of this process on a TCP socket (the provider's
 * responder answering, never the rendezvous' Unix socket) waits that long
 * first.  An ACK sent only after the receive completed then finds its QP
 * destroyed and is lost; one sent before the receive completes gets through.
 * The executable's send() comes before libc's (and a sanitizer's) for the
 * provider library, which calls it through its PLT. */
static int delay_sends_ms;

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	static ssize_t (*next)(int, const void *, size_t, int);
	int ms = __atomic_load_n(&delay_sends_ms, __ATOMIC_ACQUIRE);
	struct sockaddr_storage sa;
	socklen_t sl = sizeof(sa);

	if (!next)
		next = (ssize_t (*)(int, const void *, size_t, int))dlsym(RTLD_NEXT, "send");
	if (ms > 0 && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 &&
	    (sa.ss_family == AF_INET || sa.ss_family == AF_INET6))
		usleep((useconds_t)ms * 1000u);
	return next(fd, buf, len, flags);
}

static const char *const held_kinds[] = { "ctx", "pd", "mr", "mw", "cq", "channel", "qp" };

/* =============================================================== server == */

#define MAXQ 64

static struct {
	struct ep e;
	uint8_t *main, *ro, *none;
	struct ibv_mr *mr_main, *mr_ro, *mr_none;
	struct ibv_qp *qp[MAXQ];
	int nqp;
	struct ibv_mw *mw[MAXQ];
	uint32_t mwkey[MAXQ]; /* the key each window was bound with (type 2: ours to track) */
	int nmw;
} S;

static void *big(size_t len, int v)
{
	void *p = aligned_alloc(4096, len);

	CHECK(p != NULL);
	memset(p, v, len);
	return p;
}

/* Wait for one completion on the server CQ. */
static int server_poll(struct ibv_wc *wc, int ms)
{
	return poll1(S.e.cq, wc, ms);
}

static int do_bind(struct msg *m, struct reply *r)
{
	struct ibv_qp *qp = S.qp[m->idx];
	struct ibv_mw *mw = ibv_alloc_mw(S.e.pd, m->a == 2 ? IBV_MW_TYPE_2 : IBV_MW_TYPE_1);
	struct ibv_wc wc;
	uint64_t off = m->b, len = m->c;
	int rc;

	CHECK(mw != NULL);
	if (m->a == 2) {
		struct ibv_send_wr wr, *bad;

		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 0xb1;
		wr.opcode = IBV_WR_BIND_MW;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.bind_mw.mw = mw;
		wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
		wr.bind_mw.bind_info.mr = S.mr_main;
		wr.bind_mw.bind_info.addr = (uintptr_t)S.main + off;
		wr.bind_mw.bind_info.length = len;
		wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
		rc = ibv_post_send(qp, &wr, &bad);
		r->v[0] = wr.bind_mw.rkey;
	} else {
		struct ibv_mw_bind b;

		memset(&b, 0, sizeof(b));
		b.wr_id = 0xb1;
		b.send_flags = IBV_SEND_SIGNALED;
		b.bind_info.mr = S.mr_main;
		b.bind_info.addr = (uintptr_t)S.main + off;
		b.bind_info.length = len;
		b.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
		rc = ibv_bind_mw(qp, mw, &b);
		r->v[0] = mw->rkey;
	}
	CHECK(rc == 0);
	CHECK(server_poll(&wc, 5000) && wc.wr_id == 0xb1);
	r->v[1] = wc.status;
	r->v[2] = S.nmw;
	S.mwkey[S.nmw] = (uint32_t)r->v[0];
	S.mw[S.nmw++] = mw;
	return 0;
}

static void server(const char *path, const char *dev)
{
	int fd = rv_open(1, path);
	struct msg m;

	ep_open(&S.e, dev, GID_INDEX, 0, 4096);
	S.main = big(MAIN_LEN, SENT_S);
	S.ro = big(SIDE_LEN, SENT_S);
	S.none = big(SIDE_LEN, SENT_S);
	S.mr_main = ibv_reg_mr(S.e.pd, S.main, MAIN_LEN, RW | IBV_ACCESS_MW_BIND);
	S.mr_ro = ibv_reg_mr(S.e.pd, S.ro, SIDE_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	S.mr_none = ibv_reg_mr(S.e.pd, S.none, SIDE_LEN, IBV_ACCESS_LOCAL_WRITE);
	CHECK(S.mr_main && S.mr_ro && S.mr_none);
	while (rv_recv(fd, &m, sizeof(m)) == 0) {
		struct reply r;
		union ibv_gid g;
		struct ibv_wc wc;
		int i;

		memset(&r, 0, sizeof(r));
		switch (m.cmd) {
		case C_HELLO:
			memcpy(r.gid, S.e.gid.raw, 16);
			r.v[0] = S.mr_main->rkey;
			r.v[1] = (int64_t)(uintptr_t)S.main;
			r.v[2] = MAIN_LEN;
			r.v[3] = S.mr_ro->rkey;
			r.v[4] = (int64_t)(uintptr_t)S.ro;
			r.v[5] = S.mr_none->rkey;
			r.v[6] = (int64_t)(uintptr_t)S.none;
			break;
		case C_NEWQP:
			CHECK(S.nqp < MAXQ);
			memcpy(g.raw, m.gid, 16);
			S.qp[S.nqp] = qp_new(&S.e, 64, m.c ? (uint32_t)m.c : 16);
			r.v[0] = S.qp[S.nqp]->qp_num;
			r.v[1] = S.nqp;
			r.v[2] = qp_connect(&S.e, S.qp[S.nqp], &g, (uint32_t)m.a, (int)m.b);
			S.nqp++;
			break;
		case C_FILL:
			fill(S.main, m.a, m.b, (uint32_t)m.c);
			break;
		case C_SENT:
			memset(S.main, SENT_S, MAIN_LEN);
			break;
		case C_CHECK:
			r.v[0] = (int64_t)mismatches(S.main, m.a, m.b, (uint32_t)m.c);
			r.v[1] = (int64_t)(not_byte(S.main, 0, m.a, SENT_S) +
					   not_byte(S.main, m.a + m.b, MAIN_LEN - m.a - m.b, SENT_S));
			break;
		case C_CHECKPART: {
			uint64_t k = 0;

			while (k < m.b && S.main[m.a + k] == pattern((uint32_t)m.c, k))
				k++;
			r.v[0] = (int64_t)k;
			r.v[1] = (int64_t)not_byte(S.main, m.a + k, m.b - k, SENT_S);
			r.v[2] = (int64_t)(not_byte(S.main, 0, m.a, SENT_S) +
					   not_byte(S.main, m.a + m.b, MAIN_LEN - m.a - m.b, SENT_S));
			break;
		}
		case C_QPSTATE:
			r.v[0] = qp_state(S.qp[m.idx]);
			break;
		case C_POSTRECV:
			for (i = 0; i < (int)m.c; i++) {
				struct ibv_sge sge = { (uintptr_t)S.main + m.a + (uint64_t)i * m.b,
						       (uint32_t)m.b, S.mr_main->lkey };
				struct ibv_recv_wr wr, *bad;

				memset(&wr, 0, sizeof(wr));
				wr.wr_id = 0x7e00 + (uint64_t)i;
				wr.sg_list = &sge;
				wr.num_sge = m.b ? 1 : 0;
				r.v[0] = ibv_post_recv(S.qp[m.idx], &wr, &bad);
				if (r.v[0])
					break;
			}
			break;
		case C_POLL:
			r.v[0] = server_poll(&wc, (int)m.b);
			if (r.v[0]) {
				r.v[1] = wc.status;
				r.v[2] = wc.opcode;
				r.v[3] = wc.byte_len;
				/* the invalidated rkey shares imm_data's place, in host order */
				r.v[4] = (wc.wc_flags & IBV_WC_WITH_INV) ? (int64_t)wc.invalidated_rkey :
									  (int64_t)ntohl(wc.imm_data);
				r.v[5] = wc.wc_flags;
				r.v[6] = (int64_t)wc.wr_id;
				r.v[7] = wc.src_qp;
			}
			break;
		case C_MW:
			do_bind(&m, &r);
			break;
		case C_INV: {
			struct ibv_send_wr wr, *bad;

			memset(&wr, 0, sizeof(wr));
			wr.wr_id = 0x1f;
			wr.opcode = IBV_WR_LOCAL_INV;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.invalidate_rkey = S.mwkey[m.a];
			CHECK(ibv_post_send(S.qp[m.idx], &wr, &bad) == 0);
			CHECK(server_poll(&wc, 5000) && wc.wr_id == 0x1f);
			r.v[0] = wc.status;
			break;
		}
		case C_COUNTERS: {
			struct ep other;

			r.v[0] = orbite_provider_counter("read_bytes_served");
			r.v[1] = orbite_provider_counter("write_bytes_landed");
			r.v[2] = orbite_provider_counter("read_bytes_landed");
			r.v[3] = orbite_provider_counter("write_bytes_sent");
			/* per context: this endpoint's moved everything, a context of the
			 * other device (opened now) nothing */
			r.v[4] = orbite_provider_ctx_counter(S.e.ctx, "read_bytes_served");
			r.v[5] = orbite_provider_ctx_counter(S.e.ctx, "write_bytes_landed");
			ep_open(&other, strcmp(dev, "mlx5_0") ? "mlx5_0" : "mlx5_1", GID_INDEX, 0, 16);
			r.v[6] = orbite_provider_ctx_counter(other.ctx, "read_bytes_served") +
				 orbite_provider_ctx_counter(other.ctx, "write_bytes_landed");
			ep_close(&other);
			r.v[7] = orbite_provider_ctx_counter(S.e.ctx, "no_such_counter");
			break;
		}
		case C_HELD:
			for (i = 0; i < 7; i++)
				r.v[i] = orbite_provider_held(held_kinds[i]);
			break;
		case C_PAYLOAD: {
			char why[128];

			r.v[0] = orbite_provider_qp_payload(S.qp[m.idx], why, sizeof(why));
			r.v[1] = strstr(why, "does not hold this hello's nonce") != NULL;
			break;
		}
		case C_DESTROYQP:
			r.v[0] = ibv_destroy_qp(S.qp[m.idx]);
			S.qp[m.idx] = NULL;
			break;
		case C_DELAYSENDS:
			__atomic_store_n(&delay_sends_ms, (int)m.a, __ATOMIC_RELEASE);
			break;
		case C_RECVTEARDOWN:
			/* An engine that tears its QP down the moment its last receive
			 * completes (ibv_srq_pingpong's server does). */
			memset(&wc, 0, sizeof(wc));
			r.v[0] = server_poll(&wc, (int)m.a);
			r.v[1] = wc.status;
			r.v[2] = wc.opcode;
			r.v[3] = ibv_destroy_qp(S.qp[m.idx]);
			S.qp[m.idx] = NULL;
			__atomic_store_n(&delay_sends_ms, 0, __ATOMIC_RELEASE);
			break;
		case C_BYE:
			for (i = 0; i < S.nmw; i++)
				CHECK(ibv_dealloc_mw(S.mw[i]) == 0);
			for (i = 0; i < S.nqp; i++)
				if (S.qp[i])
					CHECK(ibv_destroy_qp(S.qp[i]) == 0);
			CHECK(ibv_dereg_mr(S.mr_main) == 0);
			CHECK(ibv_dereg_mr(S.mr_ro) == 0);
			CHECK(ibv_dereg_mr(S.mr_none) == 0);
			ep_close(&S.e);
			for (i = 0; i < 7; i++)
				r.v[0] += orbite_provider_held(held_kinds[i]);
			rv_send(fd, &r, sizeof(r));
			free(S.main);
			free(S.ro);
			free(S.none);
			close(fd);
			out("{\"op\":\"done\"}");
			return;
		default:
			CHECK(!"unknown command");
		}
		rv_send(fd, &r, sizeof(r));
	}
	CHECK(!"rendezvous closed before BYE");
}

/* =============================================================== client == */

static struct {
	int fd;
	struct ep e;
	uint8_t *buf;
	struct ibv_mr *mr;
	union ibv_gid sgid;
	uint32_t rkey, ro_rkey, none_rkey;
	uint64_t raddr, rlen, ro_addr, none_addr;
} C;

static struct reply call(uint32_t cmd, uint32_t idx, uint64_t a, uint64_t b, uint64_t c)
{
	struct msg m;
	struct reply r;

	memset(&m, 0, sizeof(m));
	m.cmd = cmd;
	m.idx = idx;
	m.a = a;
	m.b = b;
	m.c = c;
	memcpy(m.gid, C.e.gid.raw, 16);
	rv_send(C.fd, &m, sizeof(m));
	CHECK(rv_recv(C.fd, &r, sizeof(r)) == 0);
	return r;
}

struct pair {
	struct ibv_qp *qp;
	uint32_t sidx;
	uint32_t sqpn; /* the server QP's number */
};

/* A client QP connected to a fresh server QP with `server_access`. */
static struct pair pair_new(uint32_t max_send_wr, int server_access)
{
	struct pair p;
	struct reply r;

	p.qp = qp_new(&C.e, max_send_wr, 16);
	r = call(C_NEWQP, 0, p.qp->qp_num, (uint64_t)server_access, 0);
	CHECK(r.v[2] == 0);
	p.sidx = (uint32_t)r.v[1];
	p.sqpn = (uint32_t)r.v[0];
	CHECK(qp_connect(&C.e, p.qp, &C.sgid, p.sqpn, RW) == 0);
	return p;
}

static void pair_free(struct pair *p)
{
	CHECK(ibv_destroy_qp(p->qp) == 0);
	CHECK(call(C_DESTROYQP, p->sidx, 0, 0, 0).v[0] == 0);
}

static void client_open(const char *path, const char *dev, int with_channel)
{
	struct reply r;

	C.fd = rv_open(0, path);
	ep_open(&C.e, dev, GID_INDEX, with_channel, 4096);
	C.buf = big(LBUF_LEN, SENT_C);
	C.mr = ibv_reg_mr(C.e.pd, C.buf, LBUF_LEN, RW | IBV_ACCESS_MW_BIND);
	CHECK(C.mr != NULL);
	r = call(C_HELLO, 0, 0, 0, 0);
	memcpy(C.sgid.raw, r.gid, 16);
	C.rkey = (uint32_t)r.v[0];
	C.raddr = (uint64_t)r.v[1];
	C.rlen = (uint64_t)r.v[2];
	C.ro_rkey = (uint32_t)r.v[3];
	C.ro_addr = (uint64_t)r.v[4];
	C.none_rkey = (uint32_t)r.v[5];
	C.none_addr = (uint64_t)r.v[6];
}

static void client_close(void)
{
	struct reply r = call(C_BYE, 0, 0, 0, 0);
	int i;

	CHECK(r.v[0] == 0); /* the server holds nothing any more */
	CHECK(ibv_dereg_mr(C.mr) == 0);
	ep_close(&C.e);
	free(C.buf);
	for (i = 0; i < 7; i++)
		CHECK(orbite_provider_held(held_kinds[i]) == 0);
	close(C.fd);
}

/* Post one RDMA WR and wait for its completion; returns the status. */
static int rdma1(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, uint64_t loff, uint32_t len,
		 uint64_t raddr, uint32_t rkey, struct ibv_wc *wc)
{
	struct ibv_wc local;

	if (!wc)
		wc = &local;
	CHECK(post_rdma(qp, op, wr_id, C.buf + loff, len, C.mr->lkey, raddr, rkey, IBV_SEND_SIGNALED) == 0);
	CHECK(poll1(C.e.cq, wc, 20000));
	CHECK(wc->wr_id == wr_id);
	return wc->status;
}

/* ------------------------------------------------------------------ rw -- */

static void check_local(uint64_t off, uint64_t len, uint32_t seed)
{
	CHECK(mismatches(C.buf, off, len, seed) == 0);
	CHECK(not_byte(C.buf, 0, off, SENT_C) == 0);
	CHECK(not_byte(C.buf, off + len, LBUF_LEN - off - len, SENT_C) == 0);
}

static void check_remote(uint64_t off, uint64_t len, uint32_t seed)
{
	struct reply r = call(C_CHECK, 0, off, len, seed);

	CHECK(r.v[0] == 0 && r.v[1] == 0);
}

/* The payload path the provider chose for qp's connection, and why. */
static void report_payload(struct ibv_qp *qp)
{
	char why[128];
	int direct = orbite_provider_qp_payload(qp, why, sizeof(why));

	out("{\"op\":\"payload\",\"direct\":%d,\"why\":\"%s\"}", direct, why);
}

static void sc_rw(void)
{
	static const uint32_t sizes[] = { 1, 4096, (1u << 20) + 3, 8u << 20, 32u << 20 };
	struct pair p = pair_new(64, RW);
	uint64_t read_total = 0, write_total = 0;
	struct ibv_wc wc;
	struct reply r;
	unsigned i;

	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		uint32_t len = sizes[i], seed = 100 + i;
		uint64_t roff = 4096 * i + 7, loff = 8192 * i + 3;

		/* READ: the server's seeded bytes land in our buffer, nothing else moves. */
		call(C_SENT, 0, 0, 0, 0);
		call(C_FILL, 0, roff, len, seed);
		memset(C.buf, SENT_C, LBUF_LEN);
		CHECK(rdma1(p.qp, IBV_WR_RDMA_READ, 10 + i, loff, len, C.raddr + roff, C.rkey, &wc) == 0);
		CHECK(wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == len && wc.qp_num == p.qp->qp_num);
		check_local(loff, len, seed);
		read_total += len;
		out("{\"op\":\"read\",\"size\":%u,\"ok\":true}", len);

		/* WRITE: ours land in the server's buffer, nothing else moves. */
		call(C_SENT, 0, 0, 0, 0);
		fill(C.buf, loff, len, seed + 50);
		CHECK(rdma1(p.qp, IBV_WR_RDMA_WRITE, 20 + i, loff, len, C.raddr + roff, C.rkey, &wc) == 0);
		CHECK(wc.opcode == IBV_WC_RDMA_WRITE);
		check_remote(roff, len, seed + 50);
		write_total += len;
		out("{\"op\":\"write\",\"size\":%u,\"ok\":true}", len);
	}

	/* Three SGEs each way: a contiguous remote range, scattered locally. */
	{
		uint32_t lens[3] = { 5000, 70000, 123 };
		uint64_t loffs[3] = { 1 << 20, 3 << 20, 5 << 20 };
		struct ibv_sge sge[3];
		struct ibv_send_wr wr, *bad;
		uint64_t k, total = 0;

		memset(C.buf, SENT_C, LBUF_LEN);
		call(C_SENT, 0, 0, 0, 0);
		call(C_FILL, 0, 100, 75123, 7);
		for (k = 0; k < 3; k++) {
			sge[k].addr = (uintptr_t)C.buf + loffs[k];
			sge[k].length = lens[k];
			sge[k].lkey = C.mr->lkey;
		}
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 77;
		wr.sg_list = sge;
		wr.num_sge = 3;
		wr.opcode = IBV_WR_RDMA_READ;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.rdma.remote_addr = C.raddr + 100;
		wr.wr.rdma.rkey = C.rkey;
		CHECK(ibv_post_send(p.qp, &wr, &bad) == 0);
		CHECK(poll1(C.e.cq, &wc, 10000) && wc.status == IBV_WC_SUCCESS && wc.byte_len == 75123);
		for (k = 0; k < 3; k++) {
			for (uint64_t j = 0; j < lens[k]; j++)
				CHECK(C.buf[loffs[k] + j] == pattern(7, total + j));
			total += lens[k];
		}
		read_total += total;
		/* and back: gathered from the three pieces into one range */
		call(C_SENT, 0, 0, 0, 0);
		wr.wr_id = 78;
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.wr.rdma.remote_addr = C.raddr + 9000;
		CHECK(ibv_post_send(p.qp, &wr, &bad) == 0);
		CHECK(poll1(C.e.cq, &wc, 10000) && wc.status == IBV_WC_SUCCESS);
		check_remote(9000, 75123, 7);
		write_total += total;
		out("{\"op\":\"sge\",\"ok\":true}");
	}

	/* Pipelined: 16 READs of 1 MiB in flight, completed in order. */
	{
		uint64_t k;

		call(C_FILL, 0, 0, 16u << 20, 9);
		memset(C.buf, SENT_C, LBUF_LEN);
		for (k = 0; k < 16; k++)
			CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 1000 + k, C.buf + (k << 20), 1u << 20,
					C.mr->lkey, C.raddr + (k << 20), C.rkey, IBV_SEND_SIGNALED) == 0);
		for (k = 0; k < 16; k++) {
			CHECK(poll1(C.e.cq, &wc, 20000));
			CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1000 + k);
		}
		check_local(0, 16u << 20, 9);
		read_total += 16u << 20;
		out("{\"op\":\"pipelined\",\"wrs\":16,\"ok\":true}");
	}

	/* Unsignaled WRITEs complete silently; their bytes land all the same. */
	{
		call(C_SENT, 0, 0, 0, 0);
		fill(C.buf, 0, 3 * 4096, 11);
		CHECK(post_rdma(p.qp, IBV_WR_RDMA_WRITE, 501, C.buf, 4096, C.mr->lkey, C.raddr, C.rkey, 0) == 0);
		CHECK(post_rdma(p.qp, IBV_WR_RDMA_WRITE, 502, C.buf + 4096, 4096, C.mr->lkey, C.raddr + 4096,
				C.rkey, 0) == 0);
		CHECK(post_rdma(p.qp, IBV_WR_RDMA_WRITE, 503, C.buf + 8192, 4096, C.mr->lkey, C.raddr + 8192,
				C.rkey, IBV_SEND_SIGNALED) == 0);
		CHECK(poll1(C.e.cq, &wc, 10000) && wc.wr_id == 503 && wc.status == IBV_WC_SUCCESS);
		CHECK(!poll1(C.e.cq, &wc, 200));
		check_remote(0, 3 * 4096, 11);
		write_total += 3 * 4096;
		out("{\"op\":\"unsignaled\",\"cqes\":1,\"ok\":true}");
	}

	/* Inline WRITE: the data is taken at post time. */
	{
		uint8_t small[60];

		call(C_SENT, 0, 0, 0, 0);
		fill(small, 0, sizeof(small), 12);
		CHECK(post_rdma(p.qp, IBV_WR_RDMA_WRITE, 601, small, sizeof(small), 0, C.raddr + 64, C.rkey,
				IBV_SEND_SIGNALED | IBV_SEND_INLINE) == 0);
		memset(small, 0, sizeof(small));
		CHECK(poll1(C.e.cq, &wc, 10000) && wc.status == IBV_WC_SUCCESS);
		check_remote(64, 60, 12);
		write_total += 60;
		out("{\"op\":\"inline\",\"ok\":true}");
	}

	/* WRITE_WITH_IMM consumes a receive of the server's QP; SEND too. */
	{
		struct ibv_sge sge;
		struct ibv_send_wr wr, *bad;

		call(C_SENT, 0, 0, 0, 0);
		CHECK(call(C_POSTRECV, p.sidx, 0, 0, 1).v[0] == 0);
		fill(C.buf, 0, 10000, 13);
		sge.addr = (uintptr_t)C.buf;
		sge.length = 10000;
		sge.lkey = C.mr->lkey;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 701;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(0x12345678);
		wr.wr.rdma.remote_addr = C.raddr + 4096;
		wr.wr.rdma.rkey = C.rkey;
		CHECK(ibv_post_send(p.qp, &wr, &bad) == 0);
		CHECK(poll1(C.e.cq, &wc, 10000) && wc.status == IBV_WC_SUCCESS);
		r = call(C_POLL, 0, 1, 5000, 0);
		CHECK(r.v[0] == 1 && r.v[1] == IBV_WC_SUCCESS && r.v[2] == IBV_WC_RECV_RDMA_WITH_IMM);
		CHECK(r.v[3] == 10000 && r.v[4] == 0x12345678 && (r.v[5] & IBV_WC_WITH_IMM));
		CHECK(r.v[7] == p.qp->qp_num);
		check_remote(4096, 10000, 13);
		out("{\"op\":\"write_imm\",\"imm\":%lld,\"ok\":true}", (long long)r.v[4]);

		call(C_SENT, 0, 0, 0, 0);
		CHECK(call(C_POSTRECV, p.sidx, 65536, 8192, 1).v[0] == 0);
		fill(C.buf, 0, 5000, 14);
		sge.length = 5000;
		wr.wr_id = 702;
		wr.opcode = IBV_WR_SEND;
		CHECK(ibv_post_send(p.qp, &wr, &bad) == 0);
		CHECK(poll1(C.e.cq, &wc, 10000) && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND);
		r = call(C_POLL, 0, 1, 5000, 0);
		CHECK(r.v[0] == 1 && r.v[1] == IBV_WC_SUCCESS && r.v[2] == IBV_WC_RECV && r.v[3] == 5000);
		check_remote(65536, 5000, 14);
		out("{\"op\":\"send\",\"ok\":true}");
		write_total += 10000 + 5000;
	}

	r = call(C_COUNTERS, 0, 0, 0, 0);
	out("{\"op\":\"counters\",\"client_read_landed\":%lld,\"client_write_sent\":%lld,"
	    "\"server_read_served\":%lld,\"server_write_landed\":%lld,\"expect_read\":%llu,"
	    "\"expect_write\":%llu,\"client_ctx_read_landed\":%lld,\"client_ctx_write_sent\":%lld,"
	    "\"server_ctx_read_served\":%lld,\"server_ctx_write_landed\":%lld,"
	    "\"server_other_ctx\":%lld,\"unknown_name\":%lld}",
	    orbite_provider_counter("read_bytes_landed"), orbite_provider_counter("write_bytes_sent"),
	    (long long)r.v[0], (long long)r.v[1], (unsigned long long)read_total,
	    (unsigned long long)write_total, orbite_provider_ctx_counter(C.e.ctx, "read_bytes_landed"),
	    orbite_provider_ctx_counter(C.e.ctx, "write_bytes_sent"), (long long)r.v[4],
	    (long long)r.v[5], (long long)r.v[6], (long long)r.v[7]);
	report_payload(p.qp);
	pair_free(&p);
}

/* -------------------------------------------------------------- errors -- */

static void report(const char *name, int status, int next, struct pair *p)
{
	int cs = qp_state(p->qp);
	int ss = (int)call(C_QPSTATE, p->sidx, 0, 0, 0).v[0];

	out("{\"op\":\"error_case\",\"case\":\"%s\",\"status\":%d,\"next\":%d,\"client_state\":%d,"
	    "\"server_state\":%d}",
	    name, status, next, cs, ss);
}

/* Post a failing WR and a good one behind it: the first completes with the
 * error, the second is flushed. */
static void bad_then_good(const char *name, enum ibv_wr_opcode op, uint64_t loff, uint32_t len,
			  uint32_t lkey, uint64_t raddr, uint32_t rkey, int server_access)
{
	struct pair p = pair_new(16, server_access);
	struct ibv_wc a, b;

	CHECK(post_rdma(p.qp, op, 1, C.buf + loff, len, lkey, raddr, rkey, IBV_SEND_SIGNALED) == 0);
	CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 2, C.buf, 64, C.mr->lkey, C.raddr, C.rkey,
			IBV_SEND_SIGNALED) == 0);
	CHECK(poll1(C.e.cq, &a, 10000) && a.wr_id == 1);
	CHECK(poll1(C.e.cq, &b, 10000) && b.wr_id == 2);
	/* Give the server's QP the moment it needs to record its own error. */
	usleep(50000);
	report(name, a.status, b.status, &p);
	pair_free(&p);
}

static void sc_errors(void)
{
	struct ibv_mr *nolw;
	struct ibv_wc wc;
	struct pair p;
	struct reply r;
	uint8_t *side = big(8192, SENT_C);

	bad_then_good("bad_rkey", IBV_WR_RDMA_READ, 0, 4096, C.mr->lkey, C.raddr, C.rkey ^ 0x1, RW);
	bad_then_good("out_of_bounds", IBV_WR_RDMA_READ, 0, 20, C.mr->lkey, C.raddr + C.rlen - 10,
		      C.rkey, RW);
	bad_then_good("mr_no_remote_read", IBV_WR_RDMA_READ, 0, 64, C.mr->lkey, C.none_addr, C.none_rkey,
		      RW);
	bad_then_good("mr_no_remote_write", IBV_WR_RDMA_WRITE, 0, 64, C.mr->lkey, C.ro_addr, C.ro_rkey,
		      RW);
	bad_then_good("qp_no_remote_write", IBV_WR_RDMA_WRITE, 0, 64, C.mr->lkey, C.raddr, C.rkey,
		      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	bad_then_good("bad_lkey", IBV_WR_RDMA_READ, 0, 64, C.mr->lkey ^ 0x1, C.raddr, C.rkey, RW);
	nolw = ibv_reg_mr(C.e.pd, side, 8192, 0);
	CHECK(nolw != NULL);
	{
		/* READ lands locally: the destination needs LOCAL_WRITE. */
		struct pair q = pair_new(16, RW);

		CHECK(post_rdma(q.qp, IBV_WR_RDMA_READ, 1, side, 64, nolw->lkey, C.raddr, C.rkey,
				IBV_SEND_SIGNALED) == 0);
		CHECK(poll1(C.e.cq, &wc, 10000));
		report("local_no_write", wc.status, -1, &q);
		CHECK(not_byte(side, 0, 8192, SENT_C) == 0);
		pair_free(&q);
	}
	CHECK(ibv_dereg_mr(nolw) == 0);
	free(side);

	/* A SEND longer than the receive WR: both sides see it. */
	{
		struct pair q = pair_new(16, RW);
		struct ibv_sge sge = { (uintptr_t)C.buf, 5000, C.mr->lkey };
		struct ibv_send_wr wr, *bad;

		CHECK(call(C_POSTRECV, q.sidx, 0, 100, 1).v[0] == 0);
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 31;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		CHECK(ibv_post_send(q.qp, &wr, &bad) == 0);
		CHECK(poll1(C.e.cq, &wc, 10000) && wc.wr_id == 31);
		r = call(C_POLL, 0, 1, 5000, 0);
		CHECK(r.v[0] == 1);
		out("{\"op\":\"send_too_long\",\"status\":%d,\"receiver_status\":%lld}", wc.status,
		    (long long)r.v[1]);
		pair_free(&q);

		/* No receive WR and one RNR retry: the requester gives up. */
		qp_rnr_retry = 1;
		q = pair_new(16, RW);
		qp_rnr_retry = 7;
		wr.wr_id = 32;
		CHECK(ibv_post_send(q.qp, &wr, &bad) == 0);
		CHECK(poll1(C.e.cq, &wc, 20000) && wc.wr_id == 32);
		out("{\"op\":\"rnr\",\"status\":%d,\"client_state\":%d}", wc.status, qp_state(q.qp));
		pair_free(&q);
	}

	/* Registration rules: REMOTE_WRITE needs LOCAL_WRITE; unmapped memory. */
	errno = 0;
	CHECK(ibv_reg_mr(C.e.pd, C.buf, 4096, IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL);
	CHECK(ibv_reg_mr(C.e.pd, (void *)(uintptr_t)0x1000, 4096, 0) == NULL && errno == EFAULT);
	out("{\"op\":\"reg_rules\",\"ok\":true}");

	/* Posting before RTS fails at once; after ERR a WR is flushed at once. */
	p.qp = qp_new(&C.e, 16, 16);
	CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 1, C.buf, 64, C.mr->lkey, C.raddr, C.rkey,
			IBV_SEND_SIGNALED) == EINVAL);
	{
		struct ibv_qp_attr a;

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_ERR;
		CHECK(ibv_modify_qp(p.qp, &a, IBV_QP_STATE) == 0);
		CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 9, C.buf, 64, C.mr->lkey, C.raddr, C.rkey,
				IBV_SEND_SIGNALED) == 0);
		CHECK(poll1(C.e.cq, &wc, 5000) && wc.wr_id == 9 && wc.status == IBV_WC_WR_FLUSH_ERR);
		/* RESET -> INIT without the required attributes is refused. */
		a.qp_state = IBV_QPS_RESET;
		CHECK(ibv_modify_qp(p.qp, &a, IBV_QP_STATE) == 0);
		a.qp_state = IBV_QPS_INIT;
		CHECK(ibv_modify_qp(p.qp, &a, IBV_QP_STATE) == EINVAL);
		/* ... and an RC QP cannot jump from RESET to RTS. */
		a.qp_state = IBV_QPS_RTS;
		CHECK(ibv_modify_qp(p.qp, &a, IBV_QP_STATE) == EINVAL);
	}
	out("{\"op\":\"post_states\",\"ok\":true}");

	/* A QP reused after RESET reconnects to a fresh peer and works. */
	r = call(C_NEWQP, 0, p.qp->qp_num, RW, 0);
	CHECK(r.v[2] == 0);
	p.sidx = (uint32_t)r.v[1];
	p.sqpn = (uint32_t)r.v[0];
	CHECK(qp_connect(&C.e, p.qp, &C.sgid, p.sqpn, RW) == 0);
	call(C_FILL, 0, 0, 4096, 21);
	memset(C.buf, SENT_C, 8192);
	CHECK(rdma1(p.qp, IBV_WR_RDMA_READ, 3, 0, 4096, C.raddr, C.rkey, NULL) == 0);
	CHECK(mismatches(C.buf, 0, 4096, 21) == 0);
	out("{\"op\":\"reset_reuse\",\"ok\":true}");

	/* A peer that is gone: the transport gives up (RETRY_EXC_ERR). */
	{
		uint32_t gone;
		struct ibv_qp *qp = qp_new(&C.e, 16, 16);
		uint64_t t0;

		r = call(C_NEWQP, 0, qp->qp_num, RW, 0);
		gone = (uint32_t)r.v[0];
		CHECK(call(C_DESTROYQP, (uint32_t)r.v[1], 0, 0, 0).v[0] == 0);
		CHECK(qp_connect(&C.e, qp, &C.sgid, gone, RW) == 0);
		t0 = mono_ms();
		CHECK(post_rdma(qp, IBV_WR_RDMA_READ, 4, C.buf, 64, C.mr->lkey, C.raddr, C.rkey,
				IBV_SEND_SIGNALED) == 0);
		CHECK(poll1(C.e.cq, &wc, 40000) && wc.wr_id == 4);
		out("{\"op\":\"error_case\",\"case\":\"peer_gone\",\"status\":%d,\"next\":-1,"
		    "\"client_state\":%d,\"server_state\":-1,\"ms\":%llu}",
		    wc.status, qp_state(qp), (unsigned long long)(mono_ms() - t0));
		CHECK(ibv_destroy_qp(qp) == 0);
	}
	pair_free(&p);
}

/* -------------------------------------------------------------- sqfull -- */

static void sc_sqfull(void)
{
	struct pair p = pair_new(4, RW);
	struct ibv_send_wr wrs[6], *bad = NULL;
	struct ibv_sge sges[6];
	struct ibv_wc wc;
	int i, rc, polled = 0;

	for (i = 0; i < 6; i++) {
		sges[i].addr = (uintptr_t)C.buf + (uint64_t)i * 4096;
		sges[i].length = 4096;
		sges[i].lkey = C.mr->lkey;
		memset(&wrs[i], 0, sizeof(wrs[i]));
		wrs[i].wr_id = 100 + (uint64_t)i;
		wrs[i].sg_list = &sges[i];
		wrs[i].num_sge = 1;
		wrs[i].opcode = IBV_WR_RDMA_READ;
		wrs[i].send_flags = IBV_SEND_SIGNALED;
		wrs[i].wr.rdma.remote_addr = C.raddr;
		wrs[i].wr.rdma.rkey = C.rkey;
		wrs[i].next = i < 5 ? &wrs[i + 1] : NULL;
	}
	/* A list of six into a queue of four: the fifth is bad_wr. */
	rc = ibv_post_send(p.qp, &wrs[0], &bad);
	out("{\"op\":\"sq_list\",\"rc\":%d,\"bad_index\":%d}", rc, bad ? (int)(bad - wrs) : -1);
	CHECK(rc == ENOMEM && bad == &wrs[4]);
	/* Completed but not polled: the slots are still taken. */
	usleep(300000);
	wrs[4].next = NULL;
	rc = ibv_post_send(p.qp, &wrs[4], &bad);
	out("{\"op\":\"sq_unpolled\",\"rc\":%d}", rc);
	CHECK(rc == ENOMEM);
	CHECK(poll1(C.e.cq, &wc, 5000) && wc.wr_id == 100);
	polled++;
	rc = ibv_post_send(p.qp, &wrs[4], &bad);
	out("{\"op\":\"sq_after_poll\",\"rc\":%d}", rc);
	CHECK(rc == 0);
	while (polled < 5) {
		CHECK(poll1(C.e.cq, &wc, 5000) && wc.status == IBV_WC_SUCCESS);
		polled++;
	}
	/* Unsignaled WRs keep their slots until a later CQE is polled. */
	for (i = 0; i < 4; i++) {
		wrs[i].next = NULL;
		wrs[i].send_flags = i == 3 ? IBV_SEND_SIGNALED : 0;
		CHECK(ibv_post_send(p.qp, &wrs[i], &bad) == 0);
	}
	usleep(200000);
	CHECK(ibv_post_send(p.qp, &wrs[4], &bad) == ENOMEM);
	CHECK(poll1(C.e.cq, &wc, 5000) && wc.wr_id == 103);
	for (i = 0; i < 4; i++) {
		wrs[i].send_flags = IBV_SEND_SIGNALED;
		CHECK(ibv_post_send(p.qp, &wrs[i], &bad) == 0);
	}
	for (i = 0; i < 4; i++)
		CHECK(poll1(C.e.cq, &wc, 5000) && wc.status == IBV_WC_SUCCESS);
	out("{\"op\":\"sq_unsignaled\",\"ok\":true}");
	pair_free(&p);
}

/* -------------------------------------------------------------- events -- */

static int readable(int fd, int ms)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };

	return poll(&pfd, 1, ms) == 1;
}

static void sc_events(void)
{
	struct pair p = pair_new(16, RW);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	struct ibv_wc wc;
	int got;

	call(C_FILL, 0, 0, 1 << 20, 31);
	/* Armed: one event, on a descriptor that becomes readable. */
	CHECK(ibv_req_notify_cq(C.e.cq, 0) == 0);
	CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 1, C.buf, 1 << 20, C.mr->lkey, C.raddr, C.rkey,
			IBV_SEND_SIGNALED) == 0);
	got = readable(C.e.ch->fd, 10000);
	CHECK(got);
	CHECK(ibv_get_cq_event(C.e.ch, &ev_cq, &ev_ctx) == 0 && ev_cq == C.e.cq);
	ibv_ack_cq_events(ev_cq, 1);
	CHECK(ibv_poll_cq(C.e.cq, 1, &wc) == 1 && wc.wr_id == 1 && wc.status == IBV_WC_SUCCESS);
	CHECK(mismatches(C.buf, 0, 1 << 20, 31) == 0);
	out("{\"op\":\"event\",\"armed\":true,\"readable\":true}");
	/* Not re-armed: the completion comes, the event does not. */
	CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 2, C.buf, 4096, C.mr->lkey, C.raddr, C.rkey,
			IBV_SEND_SIGNALED) == 0);
	CHECK(poll1(C.e.cq, &wc, 10000) && wc.wr_id == 2);
	got = readable(C.e.ch->fd, 200);
	out("{\"op\":\"event\",\"armed\":false,\"readable\":%s}", got ? "true" : "false");
	CHECK(!got);
	/* Solicited only: a successful send completion does not fire... */
	CHECK(ibv_req_notify_cq(C.e.cq, 1) == 0);
	CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 3, C.buf, 4096, C.mr->lkey, C.raddr, C.rkey,
			IBV_SEND_SIGNALED) == 0);
	CHECK(poll1(C.e.cq, &wc, 10000) && wc.wr_id == 3);
	CHECK(!readable(C.e.ch->fd, 200));
	/* ... an error completion does. */
	CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 4, C.buf, 4096, C.mr->lkey, C.raddr, C.rkey ^ 1,
			IBV_SEND_SIGNALED) == 0);
	CHECK(readable(C.e.ch->fd, 10000));
	CHECK(ibv_get_cq_event(C.e.ch, &ev_cq, &ev_ctx) == 0 && ev_cq == C.e.cq);
	ibv_ack_cq_events(ev_cq, 1);
	CHECK(ibv_poll_cq(C.e.cq, 1, &wc) == 1 && wc.wr_id == 4 && wc.status == IBV_WC_REM_ACCESS_ERR);
	out("{\"op\":\"event\",\"solicited_only\":true,\"error_fires\":true}");
	pair_free(&p);
}

/* --------------------------------------------------------------- ebusy -- */

static void sc_ebusy(void)
{
	struct pair p = pair_new(16, RW);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(C.e.ctx);
	struct ibv_cq *cq2;
	struct ibv_pd *pd2 = ibv_alloc_pd(C.e.ctx);
	struct ibv_mr *mr2;
	struct ibv_mw *mw1, *mw2;
	struct ibv_mw_bind b;
	struct ibv_wc wc;
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp2;
	int rc;

	CHECK(ch && pd2);
	cq2 = ibv_create_cq(C.e.ctx, 16, NULL, ch, 0);
	CHECK(cq2 != NULL);
	/* A CQ with a QP (even in RESET) */
	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = cq2;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	qp2 = ibv_create_qp(pd2, &a);
	CHECK(qp2 != NULL);
	rc = ibv_destroy_cq(cq2);
	out("{\"op\":\"ebusy\",\"what\":\"cq_with_qp\",\"rc\":%d}", rc);
	CHECK(rc == EBUSY && orbite_provider_held("cq") == 2);
	/* A PD with a QP */
	rc = ibv_dealloc_pd(pd2);
	out("{\"op\":\"ebusy\",\"what\":\"pd_with_qp\",\"rc\":%d}", rc);
	CHECK(rc == EBUSY);
	CHECK(ibv_destroy_qp(qp2) == 0);
	/* A channel with a CQ */
	rc = ibv_destroy_comp_channel(ch);
	out("{\"op\":\"ebusy\",\"what\":\"channel_with_cq\",\"rc\":%d}", rc);
	CHECK(rc == EBUSY && orbite_provider_held("channel") == 1);
	CHECK(ibv_destroy_cq(cq2) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	/* A PD with an MR */
	mr2 = ibv_reg_mr(pd2, C.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr2 != NULL);
	rc = ibv_dealloc_pd(pd2);
	out("{\"op\":\"ebusy\",\"what\":\"pd_with_mr\",\"rc\":%d}", rc);
	CHECK(rc == EBUSY);
	CHECK(ibv_dereg_mr(mr2) == 0);
	/* A PD with a type-2 MW (allocated, never bound) */
	mw2 = ibv_alloc_mw(pd2, IBV_MW_TYPE_2);
	CHECK(mw2 != NULL);
	rc = ibv_dealloc_pd(pd2);
	out("{\"op\":\"ebusy\",\"what\":\"pd_with_mw2\",\"rc\":%d}", rc);
	CHECK(rc == EBUSY);
	CHECK(ibv_dealloc_mw(mw2) == 0);
	CHECK(ibv_dealloc_pd(pd2) == 0);
	/* An MR with a bound window */
	mr2 = ibv_reg_mr(C.e.pd, C.buf, 1 << 20, RW | IBV_ACCESS_MW_BIND);
	mw1 = ibv_alloc_mw(C.e.pd, IBV_MW_TYPE_1);
	CHECK(mr2 && mw1);
	memset(&b, 0, sizeof(b));
	b.wr_id = 55;
	b.send_flags = IBV_SEND_SIGNALED;
	b.bind_info.mr = mr2;
	b.bind_info.addr = (uintptr_t)C.buf;
	b.bind_info.length = 4096;
	b.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
	CHECK(ibv_bind_mw(p.qp, mw1, &b) == 0);
	CHECK(poll1(C.e.cq, &wc, 5000) && wc.wr_id == 55 && wc.status == IBV_WC_SUCCESS &&
	      wc.opcode == IBV_WC_BIND_MW);
	rc = ibv_dereg_mr(mr2);
	out("{\"op\":\"ebusy\",\"what\":\"mr_with_bound_mw\",\"rc\":%d}", rc);
	CHECK(rc == EBUSY);
	CHECK(ibv_dealloc_mw(mw1) == 0);
	CHECK(ibv_dereg_mr(mr2) == 0);
	pair_free(&p);
}

/* ---------------------------------------------------------- dependency -- */

/* Run under the uverbs_fault observer in dependency mode for `kind` (cq,
 * channel, pd): a dependent object (a RESET QP on the CQ, a CQ on the
 * channel, a type-2 MW on the PD) makes the destroy fail EBUSY by itself; the
 * observer rejects the retry (EIO) before it reaches the provider, so the
 * object stays held. */
static void sc_dependency(const char *kind)
{
	struct ibv_comp_channel *ch = NULL;
	struct ibv_pd *pd = ibv_alloc_pd(C.e.ctx);
	struct ibv_qp_init_attr a;
	struct ibv_cq *cq;
	long before;
	int rc = -1, retry = -1;

	CHECK(pd != NULL);
	if (!strcmp(kind, "channel"))
		CHECK((ch = ibv_create_comp_channel(C.e.ctx)) != NULL);
	cq = ibv_create_cq(C.e.ctx, 16, NULL, ch, 0);
	CHECK(cq != NULL);
	if (!strcmp(kind, "cq")) {
		memset(&a, 0, sizeof(a));
		a.send_cq = a.recv_cq = cq;
		a.qp_type = IBV_QPT_RC;
		a.cap.max_send_wr = a.cap.max_recv_wr = 4;
		a.cap.max_send_sge = a.cap.max_recv_sge = 1;
		CHECK(ibv_create_qp(pd, &a) != NULL);
	}
	if (!strcmp(kind, "pd"))
		CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_2) != NULL);
	before = orbite_provider_held(kind);
	if (!strcmp(kind, "cq")) {
		rc = ibv_destroy_cq(cq);
		retry = ibv_destroy_cq(cq);
	} else if (!strcmp(kind, "channel")) {
		rc = ibv_destroy_comp_channel(ch);
		retry = ibv_destroy_comp_channel(ch);
	} else if (!strcmp(kind, "pd")) {
		rc = ibv_dealloc_pd(pd);
		retry = ibv_dealloc_pd(pd);
	}
	out("{\"op\":\"dependency\",\"kind\":\"%s\",\"rc\":%d,\"retry_rc\":%d,\"held_before\":%ld,"
	    "\"held_after\":%ld}", kind, rc, retry, before, orbite_provider_held(kind));
	/* As sc_destroy: the failed object stays held until the process exits. */
	CHECK(call(C_BYE, 0, 0, 0, 0).v[0] == 0);
	out("{\"op\":\"done\"}");
	exit(0);
}

/* ------------------------------------------------------------- destroy -- */

/* Run under the uverbs_fault observer armed for `kind`: the selected destroy
 * fails with EIO, the object stays and works, a retry fails again. */
static void sc_destroy(const char *kind)
{
	struct pair p = pair_new(16, RW);
	long before = orbite_provider_held(kind);
	struct ibv_wc wc;
	int rc = -1, retry = -1, usable = 0;

	call(C_FILL, 0, 0, 1 << 20, 41);
	if (!strcmp(kind, "qp")) {
		/* The qp selector first withholds one successful completion:
		 * the engine then holds send-queue debt when it destroys. */
		int seen = 0, i;

		for (i = 0; i < 2; i++)
			CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 10 + (uint64_t)i, C.buf, 4096, C.mr->lkey,
					C.raddr, C.rkey, IBV_SEND_SIGNALED) == 0);
		while (poll1(C.e.cq, &wc, 1000))
			seen++;
		out("{\"op\":\"withheld\",\"posted\":2,\"seen\":%d}", seen);
		before = orbite_provider_held(kind);
		rc = ibv_destroy_qp(p.qp);
		memset(C.buf, SENT_C, 4096);
		usable = rc && rdma1(p.qp, IBV_WR_RDMA_READ, 12, 0, 4096, C.raddr, C.rkey, NULL) == 0 &&
			 mismatches(C.buf, 0, 4096, 41) == 0;
		retry = ibv_destroy_qp(p.qp);
	} else if (!strcmp(kind, "mr")) {
		uint8_t *b2 = big(1 << 20, SENT_C);
		struct ibv_mr *mr2 = ibv_reg_mr(C.e.pd, b2, 1 << 20, RW);

		before = orbite_provider_held(kind);
		rc = ibv_dereg_mr(mr2);
		/* still registered: a READ lands in it */
		CHECK(post_rdma(p.qp, IBV_WR_RDMA_READ, 21, b2, 4096, mr2->lkey, C.raddr, C.rkey,
				IBV_SEND_SIGNALED) == 0);
		usable = poll1(C.e.cq, &wc, 10000) && wc.status == IBV_WC_SUCCESS &&
			 mismatches(b2, 0, 4096, 41) == 0;
		retry = ibv_dereg_mr(mr2);
	} else if (!strcmp(kind, "mw")) {
		struct ibv_mw *mw = ibv_alloc_mw(C.e.pd, IBV_MW_TYPE_2);

		before = orbite_provider_held(kind);
		rc = ibv_dealloc_mw(mw);
		usable = mw->rkey != 0;
		retry = ibv_dealloc_mw(mw);
	} else if (!strcmp(kind, "cq")) {
		struct ibv_cq *cq2 = ibv_create_cq(C.e.ctx, 16, NULL, NULL, 0);

		before = orbite_provider_held(kind);
		rc = ibv_destroy_cq(cq2);
		usable = ibv_poll_cq(cq2, 1, &wc) == 0;
		retry = ibv_destroy_cq(cq2);
	} else if (!strcmp(kind, "pd")) {
		struct ibv_pd *pd2 = ibv_alloc_pd(C.e.ctx);
		struct ibv_mr *m;

		before = orbite_provider_held(kind);
		rc = ibv_dealloc_pd(pd2);
		m = ibv_reg_mr(pd2, C.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
		usable = m && ibv_dereg_mr(m) == 0;
		retry = ibv_dealloc_pd(pd2);
	} else if (!strcmp(kind, "channel")) {
		struct ibv_comp_channel *ch = ibv_create_comp_channel(C.e.ctx);
		int fd = ch->fd;

		before = orbite_provider_held(kind);
		rc = ibv_destroy_comp_channel(ch);
		usable = fcntl(fd, F_GETFD) >= 0; /* the descriptor (kernel object) stays */
		retry = ibv_destroy_comp_channel(ch);
	} else {
		CHECK(!"unknown kind");
	}
	out("{\"op\":\"destroy\",\"kind\":\"%s\",\"rc\":%d,\"retry_rc\":%d,\"held_before\":%ld,"
	    "\"held_after\":%ld,\"usable\":%s}",
	    kind, rc, retry, before, orbite_provider_held(kind), usable ? "true" : "false");
	/* The failed object stays held until the process exits: no clean close
	 * here, only the server's. */
	CHECK(call(C_BYE, 0, 0, 0, 0).v[0] == 0);
	out("{\"op\":\"done\"}");
	exit(0);
}

/* ------------------------------------------------------------- partial -- */

/* Wait until one more WR of this process reached its stall point. */
static void wait_stalled(long long before)
{
	uint64_t end = mono_ms() + 20000;

	while (orbite_provider_counter("stalls") <= before) {
		CHECK(mono_ms() < end);
		usleep(1000);
	}
}

static void to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
}

/* Prefix of buf[0..len) holding the seeded content, and how many bytes
 * after it are not the sentinel. */
static void local_part(uint64_t len, uint32_t seed, uint64_t *prefix, uint64_t *dirty)
{
	uint64_t k = 0;

	while (k < len && C.buf[k] == pattern(seed, k))
		k++;
	*prefix = k;
	*dirty = not_byte(C.buf, k, LBUF_LEN - k, SENT_C);
}

/* The landed prefix of a READ into C.buf whose first len bytes were filled by
 * fill_unlike: each unlanded byte is the complement of the pattern, so a
 * byte of the next chunk never matches by chance (a constant sentinel does,
 * wherever the pattern takes its value).  dirty: the bytes past the prefix
 * that are neither the complement (before len) nor the sentinel (after). */
static uint8_t unlike(uint32_t seed, uint64_t k)
{
	return (uint8_t)(pattern(seed, k) ^ 0xFFu);
}

static void fill_unlike(uint64_t len, uint32_t seed)
{
	for (uint64_t k = 0; k < len; k++)
		C.buf[k] = unlike(seed, k);
	memset(C.buf + len, SENT_C, LBUF_LEN - len);
}

static void unlike_part(uint64_t len, uint32_t seed, uint64_t *prefix, uint64_t *dirty)
{
	uint64_t k = 0, changed = 0;

	while (k < len && C.buf[k] == pattern(seed, k))
		k++;
	*prefix = k;
	for (; k < len; k++)
		changed += C.buf[k] != unlike(seed, k);
	*dirty = changed + not_byte(C.buf, len, LBUF_LEN - len, SENT_C);
}

/* The server's read_bytes_served (which 0) or write_bytes_landed (1). */
static long long server_counter(int which)
{
	return (long long)call(C_COUNTERS, 0, 0, 0, 0).v[which];
}

/* server_at_stall: the server's count of the WR's bytes once the requester
 * reached the stall point, before the QP is moved; server_at_cqe: at its
 * flush completion. */
static void partial_read(struct pair *p, uint64_t len, uint64_t stall, int mode)
{
	long long stalls = orbite_provider_counter("stalls"), before = server_counter(0), at_stall;
	uint64_t prefix, dirty;
	struct ibv_wc wc;

	call(C_FILL, 0, 0, len, 51);
	fill_unlike(len, 51);
	if (mode == 0)
		CHECK(orbite_provider_qp_stall(p->qp, stall, 20000) == 0);
	CHECK(post_rdma(p->qp, IBV_WR_RDMA_READ, 61, C.buf, (uint32_t)len, C.mr->lkey, C.raddr, C.rkey,
			IBV_SEND_SIGNALED) == 0);
	if (mode == 2)
		usleep(60000); /* paced: the WR is part way */
	else
		wait_stalled(stalls);
	at_stall = server_counter(0) - before;
	to_err(p->qp);
	CHECK(poll1(C.e.cq, &wc, 10000) && wc.wr_id == 61);
	unlike_part(len, 51, &prefix, &dirty);
	out("{\"op\":\"partial\",\"opcode\":\"RDMA_READ\",\"mode\":%d,\"len\":%llu,\"stall\":%llu,"
	    "\"status\":%d,\"landed\":%llu,\"dirty\":%llu,\"server_at_stall\":%lld,\"server_at_cqe\":%lld}",
	    mode, (unsigned long long)len, (unsigned long long)stall, wc.status,
	    (unsigned long long)prefix, (unsigned long long)dirty, at_stall, server_counter(0) - before);
}

/* mode 0: stopped at the stall point; 2: paced, moved to ERR part way. */
static void partial_write(struct pair *p, uint64_t len, uint64_t stall, int mode)
{
	long long stalls = orbite_provider_counter("stalls"), before = server_counter(1), at_stall, at_cqe;
	struct ibv_wc wc;
	struct reply r;

	call(C_SENT, 0, 0, 0, 0);
	fill(C.buf, 0, len, 52);
	if (mode == 0)
		CHECK(orbite_provider_qp_stall(p->qp, stall, 20000) == 0);
	CHECK(post_rdma(p->qp, IBV_WR_RDMA_WRITE, 62, C.buf, (uint32_t)len, C.mr->lkey, C.raddr, C.rkey,
			IBV_SEND_SIGNALED) == 0);
	if (mode == 2)
		usleep(60000);
	else
		wait_stalled(stalls);
	at_stall = server_counter(1) - before;
	to_err(p->qp);
	CHECK(poll1(C.e.cq, &wc, 10000) && wc.wr_id == 62);
	at_cqe = server_counter(1) - before;
	r = call(C_CHECKPART, 0, 0, len, 52);
	out("{\"op\":\"partial\",\"opcode\":\"RDMA_WRITE\",\"mode\":%d,\"len\":%llu,\"stall\":%llu,"
	    "\"status\":%d,\"landed\":%lld,\"dirty\":%lld,\"server_at_stall\":%lld,\"server_at_cqe\":%lld}",
	    mode, (unsigned long long)len, (unsigned long long)stall, wc.status, (long long)r.v[0],
	    (long long)(r.v[1] + r.v[2]), at_stall, at_cqe);
}

static void sc_partial(int mode)
{
	struct pair p = pair_new(16, RW);

	if (mode == 0) {
		partial_read(&p, 4u << 20, (1u << 20) + 12345, 0);
		pair_free(&p);
		p = pair_new(16, RW);
		partial_write(&p, 16u << 20, (5u << 20) + 7, 0);
	} else if (mode == 1) {
		/* ORBITE_PROVIDER_STALL=0:<bytes>: the first payload WR stalls */
		partial_read(&p, 4u << 20, (uint64_t)strtoull(getenv("PARTIAL_STALL"), NULL, 10), 1);
	} else {
		partial_read(&p, 4u << 20, 0, 2);
		pair_free(&p);
		p = pair_new(16, RW);
		partial_write(&p, 16u << 20, 0, 2);
	}
	pair_free(&p);
}

/* ------------------------------------------------------------ inflight -- */

/* Under inflight_fault (ORBITE_INFLIGHT_FAULT_SKIP=3, _BYTES=<stall>): four
 * 4 MiB READs or WRITEs on one QP, one at a time, each with fresh content;
 * the observer interrupts the fourth part way inside its post.  Report each
 * status, how much of the fourth landed and how many other bytes changed,
 * then destroy the QP (the observer logs that destroy). */
static void sc_inflight(int write)
{
	struct pair p = pair_new(16, RW);
	uint64_t len = 4u << 20, landed = 0, dirty = 0;
	struct ibv_wc wc;
	int i, st[4];

	for (i = 0; i < 4; i++) {
		if (write) {
			call(C_SENT, 0, 0, 0, 0);
			fill(C.buf, 0, len, 80 + (uint32_t)i);
		} else {
			call(C_FILL, 0, 0, len, 80 + (uint32_t)i);
			memset(C.buf, SENT_C, LBUF_LEN);
		}
		st[i] = rdma1(p.qp, write ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ, 90 + (uint64_t)i, 0,
			      (uint32_t)len, C.raddr, C.rkey, &wc);
	}
	if (write) {
		struct reply r = call(C_CHECKPART, 0, 0, len, 83);

		landed = (uint64_t)r.v[0];
		dirty = (uint64_t)(r.v[1] + r.v[2]);
	} else {
		local_part(len, 83, &landed, &dirty);
	}
	out("{\"op\":\"inflight\",\"opcode\":\"%s\",\"qpn\":%u,\"status\":[%d,%d,%d,%d],"
	    "\"len\":%llu,\"landed\":%llu,\"dirty\":%llu}",
	    write ? "RDMA_WRITE" : "RDMA_READ", p.qp->qp_num, st[0], st[1], st[2], st[3],
	    (unsigned long long)len, (unsigned long long)landed, (unsigned long long)dirty);
	pair_free(&p);
}

/* ------------------------------------------------------------- observe -- */

/* Under accounting or cq_fault: READs and WRITEs on two QPs; report what was
 * posted and what polled, then prove every READ landed (a withheld completion
 * was a real completion). */
static void sc_observe(void)
{
	struct pair p[2];
	struct ibv_wc wc;
	int i, q, seen = 0, posted = 0;

	p[0] = pair_new(16, RW);
	p[1] = pair_new(16, RW);
	call(C_FILL, 0, 0, 8u << 20, 71);
	memset(C.buf, SENT_C, LBUF_LEN);
	for (q = 0; q < 2; q++)
		for (i = 0; i < 6; i++) {
			uint64_t id = (uint64_t)q << 32 | (uint64_t)i;
			uint64_t off = ((uint64_t)q * 6 + (uint64_t)i) * 65536;
			enum ibv_wr_opcode op = i % 2 ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
			uint32_t len = 4096 * (uint32_t)(i + 1);

			if (op == IBV_WR_RDMA_WRITE)
				fill(C.buf, (8u << 20) + off, len, 72);
			CHECK(post_rdma(p[q].qp, op, id, C.buf + (op == IBV_WR_RDMA_READ ? off : (8u << 20) + off),
					len, C.mr->lkey, C.raddr + off, C.rkey, IBV_SEND_SIGNALED) == 0);
			out("{\"op\":\"wr\",\"qpn\":%u,\"wr_id\":%llu,\"opcode\":\"%s\",\"bytes\":%u}",
			    p[q].qp->qp_num, (unsigned long long)id,
			    op == IBV_WR_RDMA_READ ? "RDMA_READ" : "RDMA_WRITE", len);
			posted++;
		}
	while (poll1(C.e.cq, &wc, 1500)) {
		out("{\"op\":\"cqe\",\"qpn\":%u,\"wr_id\":%llu,\"status\":%d}", wc.qp_num,
		    (unsigned long long)wc.wr_id, wc.status);
		seen++;
	}
	for (q = 0; q < 2; q++)
		for (i = 0; i < 6; i += 2) {
			uint64_t off = ((uint64_t)q * 6 + (uint64_t)i) * 65536;

			for (uint64_t k = 0; k < 4096 * (uint64_t)(i + 1); k++)
				CHECK(C.buf[off + k] == pattern(71, off + k));
		}
	out("{\"op\":\"observed\",\"posted\":%d,\"seen\":%d,\"reads_landed\":true,"
	    "\"wr_completed\":%lld}",
	    posted, seen, orbite_provider_counter("wr_completed"));
	pair_free(&p[0]);
	pair_free(&p[1]);
}

/* ------------------------------------------------------------------ mw -- */

/* The server QP's state once the NAK it sent had its effect (it moves to
 * ERR just after sending it): RTS for at most 2 s. */
static int server_state_after_nak(struct pair *p)
{
	uint64_t end = mono_ms() + 2000;
	int st;

	while ((st = (int)call(C_QPSTATE, p->sidx, 0, 0, 0).v[0]) == IBV_QPS_RTS && mono_ms() < end)
		usleep(1000);
	return st;
}

/* SEND_WITH_INV of n bytes naming rkey: the requester's status. */
static int send_inv(struct ibv_qp *qp, uint64_t wr_id, uint32_t n, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)C.buf, n, C.mr->lkey };
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;

	wr_one(&wr, &sge, wr_id, IBV_WR_SEND_WITH_INV, IBV_SEND_SIGNALED);
	wr.invalidate_rkey = rkey;
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
	CHECK(poll1(C.e.cq, &wc, 20000) && wc.wr_id == wr_id);
	return wc.status;
}

/* Remote invalidation: a SEND_WITH_INV naming the server's type-2 window
 * (bound through the QP it arrives on) kills the key, and the receive says
 * so; naming an MR's key is refused (both QPs to ERR). */
static void mw_send_inv(void)
{
	struct pair pp = pair_new(16, RW), *p = &pp;
	struct reply r = call(C_MW, p->sidx, 2, 0, 65536), got;
	uint32_t rk = (uint32_t)r.v[0];
	struct ibv_wc wc;
	int st, after;

	CHECK(r.v[1] == IBV_WC_SUCCESS);
	CHECK(rdma1(p->qp, IBV_WR_RDMA_READ, 6, 0, 4096, C.raddr, rk, NULL) == 0);
	CHECK(call(C_POSTRECV, p->sidx, 1 << 20, 64, 1).v[0] == 0);
	st = send_inv(p->qp, 7, 16, rk);
	got = call(C_POLL, 0, 0, 5000, 0);
	CHECK(got.v[0] == 1);
	after = rdma1(p->qp, IBV_WR_RDMA_READ, 8, 0, 4096, C.raddr, rk, &wc);
	out("{\"op\":\"send_inv\",\"status\":%d,\"recv_status\":%lld,\"recv_opcode\":%lld,"
	    "\"byte_len\":%lld,\"with_inv\":%d,\"rkey_match\":%d,\"after\":%d}",
	    st, (long long)got.v[1], (long long)got.v[2], (long long)got.v[3],
	    (got.v[5] & IBV_WC_WITH_INV) != 0, got.v[4] == (int64_t)rk, after);
	pair_free(p);
	*p = pair_new(16, RW);
	CHECK(call(C_POSTRECV, p->sidx, 1 << 20, 64, 1).v[0] == 0);
	st = send_inv(p->qp, 9, 16, C.rkey);
	got = call(C_POLL, 0, 0, 5000, 0);
	out("{\"op\":\"send_inv_mr\",\"status\":%d,\"recv_status\":%lld,\"client_state\":%d,"
	    "\"server_state\":%d}",
	    st, got.v[0] == 1 ? (long long)got.v[1] : -1LL, qp_state(p->qp), server_state_after_nak(p));
	pair_free(p);
}

static void sc_mw(void)
{
	struct pair p = pair_new(16, RW), p2;
	struct reply r;
	struct ibv_wc wc;
	uint32_t rk;

	call(C_FILL, 0, 0, 1 << 20, 81);
	/* Type 1: bound by the server through its QP; READs inside the window. */
	r = call(C_MW, p.sidx, 1, 8192, 16384);
	CHECK(r.v[1] == IBV_WC_SUCCESS);
	rk = (uint32_t)r.v[0];
	memset(C.buf, SENT_C, 65536);
	CHECK(rdma1(p.qp, IBV_WR_RDMA_READ, 1, 0, 16384, C.raddr + 8192, rk, NULL) == 0);
	for (uint64_t k = 0; k < 16384; k++)
		CHECK(C.buf[k] == pattern(81, 8192 + k));
	/* ... and not a byte outside it, even inside the MR. */
	CHECK(rdma1(p.qp, IBV_WR_RDMA_READ, 2, 0, 4096, C.raddr + 4096, rk, &wc) == IBV_WC_REM_ACCESS_ERR);
	out("{\"op\":\"mw\",\"type\":1,\"inside\":0,\"outside\":%d}", wc.status);
	pair_free(&p);

	/* Type 2: bound through one QP, usable through that QP only. */
	p = pair_new(16, RW);
	p2 = pair_new(16, RW);
	r = call(C_MW, p.sidx, 2, 0, 65536);
	CHECK(r.v[1] == IBV_WC_SUCCESS);
	rk = (uint32_t)r.v[0];
	CHECK(rdma1(p.qp, IBV_WR_RDMA_READ, 3, 0, 4096, C.raddr, rk, NULL) == 0);
	CHECK(rdma1(p2.qp, IBV_WR_RDMA_READ, 4, 0, 4096, C.raddr, rk, &wc) == IBV_WC_REM_ACCESS_ERR);
	out("{\"op\":\"mw\",\"type\":2,\"own_qp\":0,\"other_qp\":%d}", wc.status);
	/* Invalidated: the key is dead. */
	r = call(C_INV, p.sidx, (uint64_t)r.v[2], 0, 0);
	CHECK(r.v[0] == IBV_WC_SUCCESS);
	CHECK(rdma1(p.qp, IBV_WR_RDMA_READ, 5, 0, 4096, C.raddr, rk, &wc) == IBV_WC_REM_ACCESS_ERR);
	out("{\"op\":\"mw\",\"type\":2,\"after_invalidate\":%d}", wc.status);
	pair_free(&p);
	pair_free(&p2);
	mw_send_inv();
}

/* ----------------------------------------------------------- handshake -- */

/* A rogue local peer: a plain TCP connection to the server QP's listening
 * socket (its GID's address, port QPN >> 8), never a verbs QP. */
static int rogue_connect(uint32_t server_qpn)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)(server_qpn >> 8)) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	CHECK(fd >= 0);
	memcpy(&sa.sin_addr.s_addr, C.sgid.raw + 12, 4);
	CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	return fd;
}

/* Whether the responder has closed fd (EOF or reset), waiting up to ms. */
static int closed_by_peer(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char b;

	if (poll(&p, 1, ms) <= 0)
		return 0;
	return recv(fd, &b, 1, MSG_DONTWAIT) <= 0;
}

/* The first 63 of the hello's 64 bytes as the provider would send them:
 * magic "ORBP", version 2. */
static const uint8_t hello_prefix[63] = { 0x50, 0x42, 0x52, 0x4f, 0x02, 0x00, 0x07 };

/* Silent connections opened before the real peer's first WR: the WR is not
 * held up by them, and each is closed at its hello deadline. */
static void hs_silent(int silent, int hello_ms)
{
	struct pair p = pair_new(4, RW);
	int fds[16], i, closed = 0;
	uint64_t t0;

	CHECK(silent <= 16);
	for (i = 0; i < silent; i++)
		fds[i] = rogue_connect(p.sqpn);
	usleep(200000); /* accepted before the real peer dials */
	t0 = mono_ms();
	CHECK(rdma1(p.qp, IBV_WR_RDMA_READ, 1, 0, 4096, C.raddr, C.rkey, NULL) == IBV_WC_SUCCESS);
	out("{\"op\":\"hs_silent\",\"silent\":%d,\"first_wr_ms\":%llu}", silent,
	    (unsigned long long)(mono_ms() - t0));
	for (i = 0; i < silent; i++) {
		closed += closed_by_peer(fds[i], hello_ms + 2000);
		close(fds[i]);
	}
	out("{\"op\":\"hs_silent_closed\",\"closed\":%d}", closed);
	pair_free(&p);
}

/* One byte of the hello every 100 ms, never the whole: when does the
 * responder close it, counted from the connect (-1: not within 3x the
 * deadline)? */
static void hs_trickle(int hello_ms)
{
	struct pair p = pair_new(4, RW);
	int fd = rogue_connect(p.sqpn);
	uint64_t t0 = mono_ms(), limit = t0 + 3 * (uint64_t)hello_ms;
	long closed_ms = -1;
	size_t sent = 0;

	while (mono_ms() < limit) {
		if (sent < sizeof(hello_prefix) &&
		    send(fd, hello_prefix + sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
			sent++;
		if (closed_by_peer(fd, 100)) {
			closed_ms = (long)(mono_ms() - t0);
			break;
		}
	}
	close(fd);
	out("{\"op\":\"hs_trickle\",\"sent\":%zu,\"closed_ms\":%ld}", sent, closed_ms);
	pair_free(&p);
}

/* ibv_destroy_qp on the server while a half-sent hello is pending there:
 * how long the destroy takes (-1: not within 3 s; the rogue then hangs up
 * so the scenario can end). */
static void hs_destroy_pending(void)
{
	struct ibv_qp *qp = qp_new(&C.e, 4, 4);
	struct reply r = call(C_NEWQP, 0, qp->qp_num, RW, 0);
	int fd = rogue_connect((uint32_t)r.v[0]);
	struct pollfd pfd = { .fd = C.fd, .events = POLLIN };
	struct msg m;
	long destroy_ms = -1;
	uint64_t t0;

	CHECK(r.v[2] == 0);
	CHECK(send(fd, hello_prefix, 20, MSG_NOSIGNAL) == 20);
	usleep(300000); /* the responder has taken the connection and its first bytes */
	memset(&m, 0, sizeof(m));
	m.cmd = C_DESTROYQP;
	m.idx = (uint32_t)r.v[1];
	t0 = mono_ms();
	rv_send(C.fd, &m, sizeof(m));
	if (poll(&pfd, 1, 3000) == 1)
		destroy_ms = (long)(mono_ms() - t0);
	close(fd);
	CHECK(rv_recv(C.fd, &r, sizeof(r)) == 0);
	out("{\"op\":\"hs_destroy_pending\",\"rc\":%lld,\"destroy_ms\":%ld}", (long long)r.v[0], destroy_ms);
	CHECK(ibv_destroy_qp(qp) == 0);
}

/* More connections than handshake slots: the ones beyond are closed at
 * once, those in the slots stay until their deadline, and the real peer
 * gets through (its requester retries). */
static void hs_overflow(int extra, int hello_ms)
{
	struct pair p = pair_new(4, RW);
	int n = ORBITE_PROVIDER_MAX_HANDSHAKES + extra, fds[ORBITE_PROVIDER_MAX_HANDSHAKES + 8], i;
	int closed_at_once = 0, closed_later = 0;
	uint64_t t0;

	CHECK(extra <= 8);
	for (i = 0; i < n; i++) {
		fds[i] = rogue_connect(p.sqpn);
		usleep(20000); /* one by one: the kernel's accept queue never overflows */
	}
	usleep(100000);
	for (i = 0; i < n; i++)
		closed_at_once += closed_by_peer(fds[i], 0);
	t0 = mono_ms();
	CHECK(rdma1(p.qp, IBV_WR_RDMA_READ, 1, 0, 4096, C.raddr, C.rkey, NULL) == IBV_WC_SUCCESS);
	out("{\"op\":\"hs_overflow\",\"connections\":%d,\"closed_at_once\":%d,\"first_wr_ms\":%llu}", n,
	    closed_at_once, (unsigned long long)(mono_ms() - t0));
	for (i = 0; i < n; i++) {
		closed_later += closed_by_peer(fds[i], hello_ms + 2000);
		close(fds[i]);
	}
	out("{\"op\":\"hs_overflow_closed\",\"closed\":%d}", closed_later);
	pair_free(&p);
}

/* A rogue responder: a plain socket on this host's GID address answers the
 * server QP's hello with "single copy, pid <this process>, the nonce is at
 * <decoy>".  With the decoy left as it is the server must keep to TCP (the
 * proof failed); with the hello's nonce copied there (what only a process
 * that is that pid, or can write into it, can do) it takes the single copy. */
static void hs_rogue_responder(int copy_nonce)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	static uint8_t decoy[16];
	uint8_t hello[64];
	struct {
		uint32_t magic, status, pid, flags;
		uint64_t nonce_addr;
	} rep = { 0x4f524250u, 0, (uint32_t)getpid(), 1, (uint64_t)(uintptr_t)decoy };
	struct reply r;
	struct msg m;
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), fd;
	uint32_t sidx;

	memcpy(&sa.sin_addr.s_addr, C.e.gid.raw + 12, 4);
	CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(lfd, 1) == 0);
	CHECK(getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0);
	r = call(C_NEWQP, 0, (uint64_t)ntohs(sa.sin_port) << 8 | 1, RW, 0);
	CHECK(r.v[2] == 0);
	sidx = (uint32_t)r.v[1];
	/* the server's first WR (a LOCAL_INV) makes its requester dial us */
	memset(&m, 0, sizeof(m));
	m.cmd = C_INV;
	m.idx = sidx;
	rv_send(C.fd, &m, sizeof(m));
	fd = accept(lfd, NULL, NULL);
	CHECK(fd >= 0 && rv_recv(fd, hello, sizeof(hello)) == 0);
	memset(decoy, 0, sizeof(decoy));
	if (copy_nonce)
		memcpy(decoy, hello + 48, sizeof(decoy));
	rv_send(fd, &rep, sizeof(rep));
	CHECK(rv_recv(C.fd, &r, sizeof(r)) == 0);
	r = call(C_PAYLOAD, sidx, 0, 0, 0);
	out("{\"op\":\"rogue_responder\",\"nonce\":\"%s\",\"direct\":%lld,\"proof_failed\":%lld}",
	    copy_nonce ? "copied" : "absent", (long long)r.v[0], (long long)r.v[1]);
	close(fd);
	close(lfd);
	CHECK(call(C_DESTROYQP, sidx, 0, 0, 0).v[0] == 0);
}

static void sc_handshake(const char *what, int hello_ms)
{
	if (!strcmp(what, "silent"))
		hs_silent(3, hello_ms);
	else if (!strcmp(what, "trickle"))
		hs_trickle(hello_ms);
	else if (!strcmp(what, "destroy"))
		hs_destroy_pending();
	else if (!strcmp(what, "overflow"))
		hs_overflow(2, hello_ms);
	else if (!strcmp(what, "rogue_responder")) {
		hs_rogue_responder(0);
		hs_rogue_responder(1);
	}
	else
		CHECK(!"unknown handshake case");
}

/* --------------------------------------------------------------- bench -- */

/* ------------------------------------------------------ extended verbs -- */

/* A loopback pair inside the client's context: QP a (the requester) and QP
 * b (its responder, receives posted by the test), each with its own
 * extended CQ.  Local buffer: C.buf; a writes/reads b's side at XB. */
#define XB (8u << 20)
#define XWC (IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | \
	     IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |      \
	     IBV_WC_EX_WITH_DLID_PATH_BITS)

struct xpair {
	struct ibv_cq_ex *cqa, *cqb;
	struct ibv_qp *a, *b;
	struct ibv_qp_ex *ax;
};

static struct ibv_cq_ex *xcq_new(uint64_t wc_flags)
{
	struct ibv_cq_init_attr_ex ca;

	memset(&ca, 0, sizeof(ca));
	ca.cqe = 256;
	ca.wc_flags = wc_flags;
	return ibv_create_cq_ex(C.e.ctx, &ca);
}

/* send_ops != 0: QP a through ibv_create_qp_ex with those send_ops_flags;
 * srq: QP b takes its receives from it. */
static void xpair_make(struct xpair *x, uint64_t send_ops, int b_access, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr a;

	memset(x, 0, sizeof(*x));
	x->cqa = xcq_new(XWC);
	x->cqb = xcq_new(XWC);
	CHECK(x->cqa && x->cqb);
	memset(&a, 0, sizeof(a));
	a.send_cq = a.recv_cq = ibv_cq_ex_to_cq(x->cqa);
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 64;
	a.cap.max_recv_wr = 64;
	a.cap.max_send_sge = 4;
	a.cap.max_recv_sge = 4;
	a.cap.max_inline_data = 64;
	if (send_ops) {
		struct ibv_qp_init_attr_ex ax;

		memset(&ax, 0, sizeof(ax));
		ax.send_cq = ax.recv_cq = a.send_cq;
		ax.qp_type = IBV_QPT_RC;
		ax.cap = a.cap;
		ax.pd = C.e.pd;
		ax.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		ax.send_ops_flags = send_ops;
		x->a = ibv_create_qp_ex(C.e.ctx, &ax);
		CHECK(x->a != NULL);
		x->ax = ibv_qp_to_qp_ex(x->a);
		CHECK(x->ax != NULL && &x->ax->qp_base == x->a);
	} else {
		x->a = ibv_create_qp(C.e.pd, &a);
		CHECK(x->a != NULL);
	}
	a.send_cq = a.recv_cq = ibv_cq_ex_to_cq(x->cqb);
	a.srq = srq;
	x->b = ibv_create_qp(C.e.pd, &a);
	CHECK(x->b != NULL);
	CHECK(qp_connect(&C.e, x->a, &C.e.gid, x->b->qp_num, RW) == 0);
	CHECK(qp_connect(&C.e, x->b, &C.e.gid, x->a->qp_num, b_access) == 0);
}

static void xpair_new(struct xpair *x, uint64_t send_ops, int b_access)
{
	xpair_make(x, send_ops, b_access, NULL);
}

static void xpair_free(struct xpair *x)
{
	CHECK(ibv_destroy_qp(x->a) == 0);
	CHECK(ibv_destroy_qp(x->b) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(x->cqa)) == 0);
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(x->cqb)) == 0);
}

static void xrecv(struct ibv_qp *qp, uint64_t wr_id, uint64_t off, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)C.buf + off, len, C.mr->lkey };
	struct ibv_recv_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);
}

/* One completion through the extended poll (all accessors), with a deadline. */
static int xpoll1(struct ibv_cq_ex *cq, struct ibv_wc *wc, int ms)
{
	struct ibv_poll_cq_attr pa = { 0 };
	uint64_t end = mono_ms() + (uint64_t)ms;
	int rc;

	while ((rc = ibv_start_poll(cq, &pa)) == ENOENT) {
		if (mono_ms() > end)
			return 0;
		usleep(50);
	}
	CHECK(rc == 0);
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = cq->wr_id;
	wc->status = cq->status;
	wc->opcode = ibv_wc_read_opcode(cq);
	wc->vendor_err = ibv_wc_read_vendor_err(cq);
	wc->byte_len = ibv_wc_read_byte_len(cq);
	wc->imm_data = ibv_wc_read_imm_data(cq);
	wc->qp_num = ibv_wc_read_qp_num(cq);
	wc->src_qp = ibv_wc_read_src_qp(cq);
	wc->wc_flags = ibv_wc_read_wc_flags(cq);
	wc->slid = (uint16_t)ibv_wc_read_slid(cq);
	wc->sl = ibv_wc_read_sl(cq);
	wc->dlid_path_bits = ibv_wc_read_dlid_path_bits(cq);
	ibv_end_poll(cq);
	return 1;
}

static int wc_same(const struct ibv_wc *x, const struct ibv_wc *y)
{
	return x->wr_id == y->wr_id && x->status == y->status && x->opcode == y->opcode &&
	       x->vendor_err == y->vendor_err && x->byte_len == y->byte_len &&
	       x->imm_data == y->imm_data && x->qp_num == y->qp_num && x->src_qp == y->src_qp &&
	       x->wc_flags == y->wc_flags && x->slid == y->slid && x->sl == y->sl &&
	       x->dlid_path_bits == y->dlid_path_bits;
}

/* The four payload opcodes from a to b, classic post; every completion of
 * round 0 polled with poll_cq, of round 1 with the extended poll. */
static void xround(struct xpair *x, int ext, struct ibv_wc *wa, struct ibv_wc *wb)
{
	struct { enum ibv_wr_opcode op; uint32_t len; } ops[] = {
		{ IBV_WR_SEND_WITH_IMM, 300 }, { IBV_WR_RDMA_WRITE_WITH_IMM, 500 },
		{ IBV_WR_RDMA_WRITE, 700 }, { IBV_WR_RDMA_READ, 900 },
	};
	int i;

	memset(C.buf, SENT_C, 4u << 20);
	memset(C.buf + XB, SENT_C, 4u << 20);
	for (i = 0; i < 2; i++)
		xrecv(x->b, 0xb0 + (uint64_t)i, XB + (1u << 20) + (uint64_t)i * 4096, 4096);
	for (i = 0; i < 4; i++) {
		struct ibv_sge sge = { (uintptr_t)C.buf + (uint64_t)i * 4096, ops[i].len, C.mr->lkey };
		struct ibv_send_wr wr, *bad;

		fill(i == 3 ? C.buf + XB : C.buf, (uint64_t)i * 4096, ops[i].len, 40 + (uint32_t)i);
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = 0xa0 + (uint64_t)i;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = ops[i].op;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.imm_data = htonl(0x1000 + (uint32_t)i);
		wr.wr.rdma.remote_addr = (uintptr_t)C.buf + XB + (uint64_t)i * 4096;
		wr.wr.rdma.rkey = C.mr->rkey;
		CHECK(ibv_post_send(x->a, &wr, &bad) == 0);
	}
	for (i = 0; i < 4; i++)
		CHECK(ext ? xpoll1(x->cqa, &wa[i], 20000) : poll1(ibv_cq_ex_to_cq(x->cqa), &wa[i], 20000));
	for (i = 0; i < 2; i++)
		CHECK(ext ? xpoll1(x->cqb, &wb[i], 20000) : poll1(ibv_cq_ex_to_cq(x->cqb), &wb[i], 20000));
	/* the bytes, whichever poll saw the completions */
	CHECK(mismatches(C.buf + XB + (1u << 20), 0, 300, 40) == 0);
	CHECK(mismatches(C.buf + XB, 4096, 500, 41) == 0);
	CHECK(mismatches(C.buf + XB, 8192, 700, 42) == 0);
	CHECK(mismatches(C.buf, 3 * 4096, 900, 43) == 0);
}

static void sc_ext_cq(void)
{
	struct ibv_device_attr da;
	struct ibv_device_attr_ex dx;
	struct ibv_cq_init_attr_ex ca;
	struct ibv_poll_cq_attr pa = { 0 };
	struct ibv_wc wa[2][4], wb[2][2];
	struct xpair x;
	int i, same = 1, refused;

	CHECK(verbs_get_ctx(C.e.ctx) != NULL);
	CHECK(ibv_query_device(C.e.ctx, &da) == 0);
	memset(&dx, 0xee, sizeof(dx));
	CHECK(ibv_query_device_ex(C.e.ctx, NULL, &dx) == 0);
	out("{\"op\":\"query_device_ex\",\"orig_equal\":%d,\"ports\":%u,\"ports_ex\":%u,\"ts_mask\":%llu}",
	    !memcmp(&da, &dx.orig_attr, sizeof(da)), da.phys_port_cnt, dx.phys_port_cnt_ex,
	    (unsigned long long)dx.completion_timestamp_mask);
	/* what the model cannot serve is refused as mlx5 refuses it */
	memset(&ca, 0, sizeof(ca));
	ca.cqe = 16;
	ca.wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	errno = 0;
	refused = ibv_create_cq_ex(C.e.ctx, &ca) == NULL;
	out("{\"op\":\"cq_ex_refused\",\"what\":\"timestamp\",\"null\":%d,\"errno\":%d}", refused, errno);
	ca.wc_flags = 0;
	ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
	ca.parent_domain = C.e.pd;
	errno = 0;
	refused = ibv_create_cq_ex(C.e.ctx, &ca) == NULL;
	out("{\"op\":\"cq_ex_refused\",\"what\":\"pd\",\"null\":%d,\"errno\":%d}", refused, errno);
	xpair_new(&x, 0, RW);
	out("{\"op\":\"cq_ex_empty\",\"rc\":%d,\"ts_reader\":%d}", ibv_start_poll(x.cqa, &pa),
	    x.cqa->read_completion_ts != NULL);
	xround(&x, 0, wa[0], wb[0]);
	xround(&x, 1, wa[1], wb[1]);
	for (i = 0; i < 4; i++)
		same &= wc_same(&wa[0][i], &wa[1][i]);
	for (i = 0; i < 2; i++)
		same &= wc_same(&wb[0][i], &wb[1][i]);
	out("{\"op\":\"cq_ex_poll\",\"same\":%d,\"send_ops\":[%d,%d,%d,%d],\"recv_ops\":[%d,%d],"
	    "\"imm\":[%u,%u],\"src_qp_ok\":%d,\"recv_flags\":[%u,%u]}",
	    same, wa[1][0].opcode, wa[1][1].opcode, wa[1][2].opcode, wa[1][3].opcode, wb[1][0].opcode,
	    wb[1][1].opcode, ntohl(wb[1][0].imm_data), ntohl(wb[1][1].imm_data),
	    wb[1][0].src_qp == x.a->qp_num && wb[1][1].src_qp == x.a->qp_num, wb[1][0].wc_flags,
	    wb[1][1].wc_flags);
	xpair_free(&x);
}

#define XOPS (IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND | \
	      IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ)

/* ibv_create_qp_ex on the client's context; NULL and errno when refused. */
static struct ibv_qp *xqp_try(uint32_t comp_mask, uint64_t send_ops, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr_ex ax;

	memset(&ax, 0, sizeof(ax));
	ax.send_cq = ax.recv_cq = cq;
	ax.qp_type = IBV_QPT_RC;
	ax.cap.max_send_wr = ax.cap.max_recv_wr = 4;
	ax.cap.max_send_sge = ax.cap.max_recv_sge = 1;
	ax.pd = C.e.pd;
	ax.comp_mask = comp_mask;
	ax.send_ops_flags = send_ops;
	errno = 0;
	return ibv_create_qp_ex(C.e.ctx, &ax);
}

static void xrefused(const char *what, uint32_t comp_mask, uint64_t send_ops)
{
	struct ibv_qp *qp = xqp_try(comp_mask, send_ops, C.e.cq);
	int err = errno;

	if (qp)
		CHECK(ibv_destroy_qp(qp) == 0);
	out("{\"op\":\"qp_ex_refused\",\"what\":\"%s\",\"null\":%d,\"errno\":%d}", what, qp == NULL, err);
}

/* No completion on cq for ms (the extended poll answers ENOENT throughout). */
static int xquiet(struct ibv_cq_ex *cq, int ms)
{
	struct ibv_wc wc;

	return !xpoll1(cq, &wc, ms);
}

/* wr_bind_mw and wr_local_inv: a type-2 window bound and invalidated through
 * the wr_* family (the key domain witnesses both). */
static void sc_ext_mw(struct xpair *x)
{
	struct ibv_mw *mw = ibv_alloc_mw(C.e.pd, IBV_MW_TYPE_2);
	struct ibv_mw_bind_info info = { C.mr, (uintptr_t)C.buf, 4096, IBV_ACCESS_REMOTE_READ };
	uint32_t key;
	struct ibv_wc wc[2];
	long bound, after;

	CHECK(mw != NULL);
	key = ibv_inc_rkey(mw->rkey);
	ibv_wr_start(x->ax);
	x->ax->wr_id = 0x80;
	x->ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(x->ax, mw, key, &info);
	CHECK(ibv_wr_complete(x->ax) == 0);
	CHECK(xpoll1(x->cqa, &wc[0], 20000));
	bound = orbite_provider_key_query(C.e.ctx, key, "length");
	ibv_wr_start(x->ax);
	x->ax->wr_id = 0x81;
	ibv_wr_local_inv(x->ax, key);
	CHECK(ibv_wr_complete(x->ax) == 0);
	CHECK(xpoll1(x->cqa, &wc[1], 20000));
	after = orbite_provider_key_query(C.e.ctx, key, "windows");
	out("{\"op\":\"ext_mw\",\"bind\":[%llu,%d,%d],\"inv\":[%llu,%d,%d],\"length\":%ld,\"bound_after\":%ld}",
	    (unsigned long long)wc[0].wr_id, wc[0].status, wc[0].opcode, (unsigned long long)wc[1].wr_id,
	    wc[1].status, wc[1].opcode, bound, after);
	CHECK(ibv_dealloc_mw(mw) == 0);
}

static void sc_ext_post(void)
{
	const uint32_t PD_SEND = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	struct ibv_wc wa[5], wb[3];
	struct ibv_sge two[2];
	struct ibv_data_buf bufs[2];
	uint8_t inl[64], inl2[40];
	struct xpair x;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qx;
	uint8_t *l = C.buf, *r = C.buf + XB;
	uint64_t R = (uintptr_t)r;
	int i, rc, ok;

	/* what the model cannot serve is refused as rdma-core with mlx5 refuses it */
	xrefused("atomic_write", PD_SEND, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_ATOMIC_WRITE);
	xrefused("tso", PD_SEND, IBV_QP_EX_WITH_TSO);
	xrefused("no_pd", IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, IBV_QP_EX_WITH_SEND);
	xrefused("unknown_mask", PD_SEND | (1u << 20), IBV_QP_EX_WITH_SEND);
	/* only the asked opcodes get a pointer; a QP without send_ops has no qp_ex */
	qp = xqp_try(PD_SEND, IBV_QP_EX_WITH_RDMA_WRITE, C.e.cq);
	CHECK(qp != NULL);
	qx = ibv_qp_to_qp_ex(qp);
	{
		struct ibv_qp *classic = qp_new(&C.e, 4, 4);
		struct ibv_qp *pd_only = xqp_try(IBV_QP_INIT_ATTR_PD, 0, C.e.cq);

		CHECK(pd_only != NULL);
		out("{\"op\":\"qp_ex_ops\",\"write\":%d,\"send\":%d,\"read\":%d,\"classic_qp_ex\":%d,"
		    "\"pd_only_qp_ex\":%d}",
		    qx && qx->wr_rdma_write != NULL, qx && qx->wr_send != NULL, qx && qx->wr_rdma_read != NULL,
		    ibv_qp_to_qp_ex(classic) != NULL, ibv_qp_to_qp_ex(pd_only) != NULL);
		CHECK(ibv_destroy_qp(classic) == 0);
		CHECK(ibv_destroy_qp(pd_only) == 0);
	}
	CHECK(ibv_destroy_qp(qp) == 0);

	xpair_new(&x, XOPS, RW);
	qx = x.ax;
	memset(l, SENT_C, 4u << 20);
	memset(r, SENT_C, 4u << 20);
	fill(l, 0, 1000, 60);                 /* WRITE source */
	fill(l, 4096, 600, 61);               /* WRITE_IMM, two SGEs */
	fill(l, 8192, 400, 62);
	fill(r, 3 * 4096, 2000, 63);          /* READ source */
	fill(inl, 0, sizeof(inl), 64);        /* SEND, inline */
	fill(inl2, 0, sizeof(inl2), 65);      /* SEND_IMM, inline list */
	for (i = 0; i < 3; i++)
		xrecv(x.b, 0xb0 + (uint64_t)i, XB + (1u << 20) + (uint64_t)i * 4096, 4096);
	ibv_wr_start(qx);
	qx->wr_id = 0xe0;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, C.mr->rkey, R);
	ibv_wr_set_sge(qx, C.mr->lkey, (uintptr_t)l, 1000);
	qx->wr_id = 0xe1;
	ibv_wr_rdma_write_imm(qx, C.mr->rkey, R + 4096, htonl(0xabc));
	two[0] = (struct ibv_sge){ (uintptr_t)l + 4096, 600, C.mr->lkey };
	two[1] = (struct ibv_sge){ (uintptr_t)l + 8192, 400, C.mr->lkey };
	ibv_wr_set_sge_list(qx, 2, two);
	qx->wr_id = 0xe2;
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, inl, sizeof(inl));
	memset(inl, 0, sizeof(inl)); /* copied at the call: reusable at once */
	qx->wr_id = 0xe3;
	ibv_wr_send_imm(qx, htonl(0xdef));
	bufs[0] = (struct ibv_data_buf){ inl2, 15 };
	bufs[1] = (struct ibv_data_buf){ inl2 + 15, sizeof(inl2) - 15 };
	ibv_wr_set_inline_data_list(qx, 2, bufs);
	memset(inl2, 0, sizeof(inl2));
	qx->wr_id = 0xe4;
	ibv_wr_rdma_read(qx, C.mr->rkey, R + 3 * 4096);
	ibv_wr_set_sge(qx, C.mr->lkey, (uintptr_t)l + 3 * 4096, 2000);
	rc = ibv_wr_complete(qx);
	CHECK(rc == 0);
	for (i = 0; i < 5; i++)
		CHECK(xpoll1(x.cqa, &wa[i], 20000));
	for (i = 0; i < 3; i++)
		CHECK(xpoll1(x.cqb, &wb[i], 20000));
	ok = 1;
	for (i = 0; i < 5; i++)
		ok &= wa[i].status == IBV_WC_SUCCESS && wa[i].wr_id == 0xe0 + (uint64_t)i;
	for (i = 0; i < 3; i++)
		ok &= wb[i].status == IBV_WC_SUCCESS && wb[i].wr_id == 0xb0 + (uint64_t)i;
	fill(inl, 0, sizeof(inl), 64);
	fill(inl2, 0, sizeof(inl2), 65);
	out("{\"op\":\"ext_batch\",\"rc\":%d,\"completions_ok\":%d,\"send_ops\":[%d,%d,%d,%d,%d],"
	    "\"recv\":[[%d,%u,%u],[%d,%u,%u],[%d,%u,%u]],"
	    "\"write\":%llu,\"write_imm\":%llu,\"send\":%llu,\"send_imm\":%llu,\"read\":%llu,\"around\":%llu}",
	    rc, ok, wa[0].opcode, wa[1].opcode, wa[2].opcode, wa[3].opcode, wa[4].opcode,
	    wb[0].opcode, wb[0].byte_len, ntohl(wb[0].imm_data), wb[1].opcode, wb[1].byte_len,
	    ntohl(wb[1].imm_data), wb[2].opcode, wb[2].byte_len, ntohl(wb[2].imm_data),
	    (unsigned long long)mismatches(r, 0, 1000, 60),
	    (unsigned long long)(mismatches(r, 4096, 600, 61) + mismatches(r + 4096 + 600, 0, 400, 62)),
	    (unsigned long long)(memcmp(r + (1u << 20) + 4096, inl, sizeof(inl)) != 0),
	    (unsigned long long)(memcmp(r + (1u << 20) + 8192, inl2, sizeof(inl2)) != 0),
	    (unsigned long long)mismatches(l, 3 * 4096, 2000, 63),
	    (unsigned long long)(not_byte(r, 1000, 4096 - 1000, SENT_C) + not_byte(r, 4096 + 1000, 4096 - 1000, SENT_C) +
				 not_byte(l, 3 * 4096 + 2000, 4096, SENT_C)));

	/* wr_abort: nothing of the batch is posted */
	memset(r, SENT_C, 8192);
	ibv_wr_start(qx);
	qx->wr_id = 0xf0;
	ibv_wr_rdma_write(qx, C.mr->rkey, R);
	ibv_wr_set_sge(qx, C.mr->lkey, (uintptr_t)l, 1000);
	ibv_wr_abort(qx);
	out("{\"op\":\"ext_abort\",\"quiet\":%d,\"outstanding\":%ld,\"untouched\":%llu}", xquiet(x.cqa, 300),
	    orbite_provider_qp_outstanding(x.a), (unsigned long long)not_byte(r, 0, 8192, SENT_C));

	/* a failing WR in a batch: wr_complete answers its errno, as mlx5
	 * nothing of the batch is posted, and the QP goes on */
	ibv_wr_start(qx);
	qx->wr_id = 0xf1;
	ibv_wr_rdma_write(qx, C.mr->rkey, R);
	ibv_wr_set_sge(qx, C.mr->lkey, (uintptr_t)l, 1000);
	qx->wr_id = 0xf2;
	ibv_wr_rdma_write(qx, C.mr->rkey, R + 4096);
	{
		struct ibv_sge five[5];

		for (i = 0; i < 5; i++)
			five[i] = (struct ibv_sge){ (uintptr_t)l, 8, C.mr->lkey };
		ibv_wr_set_sge_list(qx, 5, five); /* max_send_sge is 4 */
	}
	rc = ibv_wr_complete(qx);
	out("{\"op\":\"ext_bad_sge\",\"rc\":%d,\"quiet\":%d,\"outstanding\":%ld,\"untouched\":%llu}", rc,
	    xquiet(x.cqa, 300), orbite_provider_qp_outstanding(x.a),
	    (unsigned long long)not_byte(r, 0, 8192, SENT_C));
	ibv_wr_start(qx);
	qx->wr_id = 0xf3;
	ibv_wr_send(qx);
	{
		uint8_t big_inl[65] = { 0 };

		ibv_wr_set_inline_data(qx, big_inl, sizeof(big_inl)); /* max_inline_data is 64 */
	}
	rc = ibv_wr_complete(qx);
	out("{\"op\":\"ext_bad_inline\",\"rc\":%d,\"quiet\":%d}", rc, xquiet(x.cqa, 300));
	/* a WR the send queue refuses at post (RDMA_READ inline) fails the batch
	 * after a good one: the good one is not posted either */
	ibv_wr_start(qx);
	qx->wr_id = 0xf4;
	ibv_wr_rdma_write(qx, C.mr->rkey, R);
	ibv_wr_set_sge(qx, C.mr->lkey, (uintptr_t)l, 1000);
	qx->wr_id = 0xf5;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_read(qx, C.mr->rkey, R);
	ibv_wr_set_inline_data(qx, inl, 8);
	rc = ibv_wr_complete(qx);
	out("{\"op\":\"ext_bad_post\",\"rc\":%d,\"quiet\":%d,\"outstanding\":%ld,\"untouched\":%llu}", rc,
	    xquiet(x.cqa, 300), orbite_provider_qp_outstanding(x.a),
	    (unsigned long long)not_byte(r, 0, 8192, SENT_C));
	/* the same checks as post_send: a bad rkey completes with REM_ACCESS_ERR */
	ibv_wr_start(qx);
	qx->wr_id = 0xf6;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, C.mr->rkey ^ 0x100, R);
	ibv_wr_set_sge(qx, C.mr->lkey, (uintptr_t)l, 16);
	rc = ibv_wr_complete(qx);
	CHECK(xpoll1(x.cqa, &wa[0], 20000));
	out("{\"op\":\"ext_bad_rkey\",\"rc\":%d,\"wr_id\":%llu,\"status\":%d}", rc,
	    (unsigned long long)wa[0].wr_id, wa[0].status);
	xpair_free(&x);
	xpair_new(&x, IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV, RW);
	sc_ext_mw(&x);
	xpair_free(&x);
}

/* ------------------------------------------------------------- atomics -- */

#define RWA (RW | IBV_ACCESS_REMOTE_ATOMIC)

static int post_atomic(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, void *laddr,
		       uint32_t lkey, uint64_t raddr, uint32_t rkey, uint64_t compare_add, uint64_t swap)
{
	struct ibv_sge sge = { (uintptr_t)laddr, 8, lkey };
	struct ibv_send_wr wr, *bad;

	wr_one(&wr, &sge, wr_id, op, IBV_SEND_SIGNALED);
	wr.wr.atomic.remote_addr = raddr;
	wr.wr.atomic.rkey = rkey;
	wr.wr.atomic.compare_add = compare_add;
	wr.wr.atomic.swap = swap;
	return ibv_post_send(qp, &wr, &bad);
}

static uint64_t u64_at(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, sizeof(v));
	return v;
}

static void u64_put(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, sizeof(v));
}

/* One atomic on a fresh pair whose responder has b_access; the status. */
static int atomic_case(int b_access, uint64_t roff, uint32_t rkey)
{
	struct xpair x;
	struct ibv_wc wc;

	xpair_new(&x, 0, b_access);
	CHECK(post_atomic(x.a, IBV_WR_ATOMIC_FETCH_AND_ADD, 0xc0, C.buf, C.mr->lkey,
			  (uintptr_t)C.buf + XB + roff, rkey, 1, 0) == 0);
	CHECK(xpoll1(x.cqa, &wc, 20000) && wc.wr_id == 0xc0);
	xpair_free(&x);
	return wc.status;
}

static void sc_atomics(void)
{
	enum { NP = 4, PER = 50, ROUNDS = 4 };
	struct ibv_device_attr da;
	struct ibv_mr *amr;
	struct xpair x, xs[NP];
	struct ibv_wc wc[6];
	uint8_t *l = C.buf, *r = C.buf + XB;
	uint64_t R = (uintptr_t)r, total = (uint64_t)NP * PER * ROUNDS, sum = 0;
	static uint8_t seen[NP * PER * ROUNDS];
	int i, k, p, rc, distinct = 1;

	CHECK(ibv_query_device(C.e.ctx, &da) == 0);
	amr = ibv_reg_mr(C.e.pd, r, 1u << 20, RWA);
	CHECK(amr != NULL);
	memset(l, SENT_C, 4096);
	memset(r, SENT_C, 4096);
	u64_put(r, 5);
	u64_put(r + 8, 100);
	/* classic post: a swap that matches, one that does not, an add */
	xpair_new(&x, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, RWA);
	CHECK(post_atomic(x.a, IBV_WR_ATOMIC_CMP_AND_SWP, 0xd0, l, C.mr->lkey, R, amr->rkey, 5, 9) == 0);
	CHECK(post_atomic(x.a, IBV_WR_ATOMIC_CMP_AND_SWP, 0xd1, l + 16, C.mr->lkey, R, amr->rkey, 1, 7) == 0);
	CHECK(post_atomic(x.a, IBV_WR_ATOMIC_FETCH_AND_ADD, 0xd2, l + 32, C.mr->lkey, R, amr->rkey,
			  0x100000001ull, 0) == 0);
	/* the same through the wr_* family */
	ibv_wr_start(x.ax);
	x.ax->wr_flags = IBV_SEND_SIGNALED;
	x.ax->wr_id = 0xd3;
	ibv_wr_atomic_cmp_swp(x.ax, amr->rkey, R + 8, 100, 200);
	ibv_wr_set_sge(x.ax, C.mr->lkey, (uintptr_t)l + 48, 8);
	x.ax->wr_id = 0xd4;
	ibv_wr_atomic_fetch_add(x.ax, amr->rkey, R + 8, 22);
	ibv_wr_set_sge(x.ax, C.mr->lkey, (uintptr_t)l + 64, 8);
	rc = ibv_wr_complete(x.ax);
	CHECK(rc == 0);
	for (i = 0; i < 5; i++)
		CHECK(xpoll1(x.cqa, &wc[i], 20000));
	out("{\"op\":\"atomic_values\",\"cap\":%d,\"status\":[%d,%d,%d,%d,%d],\"opcodes\":[%d,%d,%d,%d,%d],"
	    "\"byte_len\":%u,\"orig\":[%llu,%llu,%llu,%llu,%llu],\"remote\":[%llu,%llu],\"around\":%llu}",
	    da.atomic_cap, wc[0].status, wc[1].status, wc[2].status, wc[3].status, wc[4].status,
	    wc[0].opcode, wc[1].opcode, wc[2].opcode, wc[3].opcode, wc[4].opcode, wc[0].byte_len,
	    (unsigned long long)u64_at(l), (unsigned long long)u64_at(l + 16),
	    (unsigned long long)u64_at(l + 32), (unsigned long long)u64_at(l + 48),
	    (unsigned long long)u64_at(l + 64), (unsigned long long)u64_at(r),
	    (unsigned long long)u64_at(r + 8),
	    (unsigned long long)(not_byte(l, 8, 8, SENT_C) + not_byte(l, 24, 8, SENT_C) +
				 not_byte(l, 40, 8, SENT_C) + not_byte(l, 56, 8, SENT_C) +
				 not_byte(l, 72, 4096 - 72, SENT_C) + not_byte(r, 16, 4096 - 16, SENT_C)));
	/* opcodes not modelled: "not supported" at post, as mlx5 */
	{
		struct ibv_sge sge = { (uintptr_t)l, 8, C.mr->lkey };
		struct ibv_send_wr wr, *bad;

		memset(&wr, 0, sizeof(wr));
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_ATOMIC_WRITE;
		rc = ibv_post_send(x.a, &wr, &bad);
		wr.opcode = IBV_WR_TSO;
		out("{\"op\":\"not_modelled\",\"atomic_write\":%d,\"tso\":%d}", rc,
		    ibv_post_send(x.a, &wr, &bad));
	}
	xpair_free(&x);
	/* what the responder refuses */
	out("{\"op\":\"atomic_errors\",\"misaligned\":%d,\"mr_no_atomic\":%d,\"qp_no_atomic\":%d,"
	    "\"out_of_bounds\":%d}",
	    atomic_case(RWA, 4, amr->rkey), atomic_case(RWA, 0, C.mr->rkey), atomic_case(RW, 0, amr->rkey),
	    atomic_case(RWA, 1u << 20, amr->rkey));
	/* atomic with respect to each other: NP requesters add 1 to one counter
	 * concurrently; every original value is seen exactly once */
	u64_put(r + 256, 0);
	for (p = 0; p < NP; p++)
		xpair_new(&xs[p], 0, RWA);
	for (k = 0; k < ROUNDS; k++) {
		for (i = 0; i < PER; i++)
			for (p = 0; p < NP; p++)
				CHECK(post_atomic(xs[p].a, IBV_WR_ATOMIC_FETCH_AND_ADD, (uint64_t)i,
						  l + 8 * ((uint64_t)p * PER + (uint64_t)i), C.mr->lkey, R + 256,
						  amr->rkey, 1, 0) == 0);
		for (p = 0; p < NP; p++)
			for (i = 0; i < PER; i++) {
				struct ibv_wc w;

				CHECK(xpoll1(xs[p].cqa, &w, 20000) && w.status == IBV_WC_SUCCESS);
			}
		for (i = 0; i < NP * PER; i++) {
			uint64_t v = u64_at(l + 8 * (uint64_t)i);

			if (v >= total || seen[v])
				distinct = 0;
			else
				seen[v] = 1;
			sum += v;
		}
	}
	for (p = 0; p < NP; p++)
		xpair_free(&xs[p]);
	out("{\"op\":\"atomic_concurrent\",\"counter\":%llu,\"expect\":%llu,\"distinct\":%d}",
	    (unsigned long long)u64_at(r + 256), (unsigned long long)total, distinct);
	CHECK(ibv_dereg_mr(amr) == 0);
}

/* ----------------------------------------------------------------- SRQ -- */

static int srq_post(struct ibv_srq *srq, uint64_t wr_id, uint64_t off, uint32_t len)
{
	struct ibv_sge sge = { (uintptr_t)C.buf + off, len, C.mr->lkey };
	struct ibv_recv_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_srq_recv(srq, &wr, &bad);
}

static void send1(struct ibv_qp *qp, uint64_t wr_id, uint64_t off, uint32_t len)
{
	CHECK(post_rdma(qp, IBV_WR_SEND, wr_id, C.buf + off, len, C.mr->lkey, 0, 0, IBV_SEND_SIGNALED) == 0);
}

static struct ibv_srq *srq_new(uint32_t max_wr, uint32_t max_sge)
{
	struct ibv_srq_init_attr a;

	memset(&a, 0, sizeof(a));
	a.attr.max_wr = max_wr;
	a.attr.max_sge = max_sge;
	errno = 0;
	return ibv_create_srq(C.e.pd, &a);
}

/* Serve one SEND of x's requester from the SRQ: the receive's wr_id, and
 * whether its bytes landed where that receive pointed (off_of(wr_id)). */
static uint64_t srq_take1(struct xpair *x, uint64_t send_id, uint32_t seed)
{
	struct ibv_wc wa, wb;

	fill(C.buf, 0, 512, seed);
	send1(x->a, send_id, 0, 512);
	CHECK(xpoll1(x->cqa, &wa, 20000) && wa.status == IBV_WC_SUCCESS);
	CHECK(xpoll1(x->cqb, &wb, 20000) && wb.status == IBV_WC_SUCCESS && wb.byte_len == 512);
	CHECK(wb.qp_num == x->b->qp_num);
	CHECK(mismatches(C.buf, XB + (wb.wr_id & 0xff) * 4096, 512, seed) == 0);
	return wb.wr_id;
}

static void sc_srq(void)
{
	struct ibv_device_attr da;
	struct ibv_srq_init_attr_ex ax;
	struct ibv_srq_attr sa;
	struct ibv_async_event ev;
	struct ibv_srq *srq, *srq2;
	struct xpair x1, x2;
	uint64_t got[6];
	int i, rc, rc2, before[3];

	CHECK(ibv_query_device(C.e.ctx, &da) == 0);
	out("{\"op\":\"srq_caps\",\"max_srq\":%d,\"max_srq_wr\":%d,\"max_srq_sge\":%d}", da.max_srq,
	    da.max_srq_wr, da.max_srq_sge);
	srq = srq_new(40000, 1);
	rc = errno;
	srq2 = srq_new(8, 31);
	out("{\"op\":\"srq_refused\",\"max_wr\":%d,\"max_sge\":%d}", srq ? 0 : rc, srq2 ? 0 : errno);
	/* ibv_create_srq_ex: a basic SRQ is made, XRC is not modelled */
	memset(&ax, 0, sizeof(ax));
	ax.attr.max_wr = 4;
	ax.attr.max_sge = 1;
	ax.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
	ax.pd = C.e.pd;
	ax.srq_type = IBV_SRQT_BASIC;
	srq2 = ibv_create_srq_ex(C.e.ctx, &ax);
	CHECK(srq2 != NULL && ibv_query_srq(srq2, &sa) == 0 && sa.max_wr == 4);
	CHECK(ibv_destroy_srq(srq2) == 0);
	ax.srq_type = IBV_SRQT_XRC;
	ax.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
	ax.cq = C.e.cq;
	errno = 0;
	srq2 = ibv_create_srq_ex(C.e.ctx, &ax);
	out("{\"op\":\"srq_ex_xrc\",\"null\":%d,\"errno\":%d}", srq2 == NULL, errno);

	srq = srq_new(8, 2);
	CHECK(srq != NULL);
	xpair_make(&x1, 0, RW, srq);
	xpair_make(&x2, 0, RW, srq);
	memset(C.buf + XB, SENT_C, 0x80 * 4096);
	for (i = 0; i < 4; i++)
		CHECK(srq_post(srq, 0x50 + (uint64_t)i, XB + (uint64_t)(0x50 + i) * 4096, 4096) == 0);
	/* both QPs take from it, in order */
	got[0] = srq_take1(&x1, 1, 71);
	got[1] = srq_take1(&x2, 2, 72);
	got[2] = srq_take1(&x2, 3, 73);
	got[3] = srq_take1(&x1, 4, 74);
	{
		struct ibv_sge sge = { (uintptr_t)C.buf, 8, C.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1 }, *bad;
		struct ibv_sge three[3] = { sge, sge, sge };
		struct ibv_recv_wr wr3 = { .wr_id = 1, .sg_list = three, .num_sge = 3 };

		rc = ibv_post_recv(x1.b, &wr, &bad); /* the QP's own RQ is not there */
		rc2 = ibv_post_srq_recv(srq, &wr3, &bad);
	}
	out("{\"op\":\"srq_shared\",\"wr_ids\":[%llu,%llu,%llu,%llu],\"qp_post_recv\":%d,\"too_many_sge\":%d}",
	    (unsigned long long)got[0], (unsigned long long)got[1], (unsigned long long)got[2],
	    (unsigned long long)got[3], rc, rc2);
	/* full at max_wr */
	for (i = 0; i < 8; i++)
		CHECK(srq_post(srq, 0x60 + (uint64_t)i, XB + (uint64_t)(0x60 + i) * 4096, 4096) == 0);
	rc = srq_post(srq, 0x70, XB, 4096);
	/* resize keeps what is queued; not below it */
	sa.max_wr = 4;
	rc2 = ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR);
	sa.max_wr = 16;
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) == 0);
	CHECK(ibv_query_srq(srq, &sa) == 0);
	out("{\"op\":\"srq_sizes\",\"full\":%d,\"shrink_below_queued\":%d,\"max_wr\":%u}", rc, rc2, sa.max_wr);
	/* the limit: 8 queued, armed at 6; fires when fewer than 6 remain */
	sa.srq_limit = 17;
	rc = ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT);
	sa.srq_limit = 6;
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0);
	CHECK(ibv_query_srq(srq, &sa) == 0);
	rc2 = (int)sa.srq_limit;
	for (i = 0; i < 3; i++) {
		uint64_t id = srq_take1(i % 2 ? &x2 : &x1, 10 + (uint64_t)i, 80 + (uint32_t)i);

		CHECK(id == 0x60 + (uint64_t)i);
		before[i] = readable(C.e.ctx->async_fd, i == 2 ? 5000 : 200);
	}
	CHECK(ibv_get_async_event(C.e.ctx, &ev) == 0);
	out("{\"op\":\"srq_limit\",\"too_high\":%d,\"armed\":%d,\"readable\":[%d,%d,%d],\"event\":%d,"
	    "\"is_srq\":%d}",
	    rc, rc2, before[0], before[1], before[2], ev.event_type, ev.element.srq == srq);
	ibv_ack_async_event(&ev);
	CHECK(ibv_query_srq(srq, &sa) == 0);
	rc = (int)sa.srq_limit;
	/* a SEND waits (RNR) until the SRQ has a receive again: drain it first */
	for (i = 3; i < 8; i++)
		CHECK(srq_take1(&x1, 20 + (uint64_t)i, 90 + (uint32_t)i) == 0x60 + (uint64_t)i);
	{
		struct ibv_wc wa, wb;

		fill(C.buf, 0, 512, 99);
		send1(x2.a, 30, 0, 512);
		usleep(200 * 1000);
		rc2 = xquiet(x2.cqb, 1);
		CHECK(srq_post(srq, 0x5f, XB + 0x5f * 4096, 4096) == 0);
		CHECK(xpoll1(x2.cqa, &wa, 20000) && wa.status == IBV_WC_SUCCESS);
		CHECK(xpoll1(x2.cqb, &wb, 20000) && wb.wr_id == 0x5f);
		CHECK(mismatches(C.buf, XB + 0x5f * 4096, 512, 99) == 0);
	}
	out("{\"op\":\"srq_after_event\",\"limit\":%d,\"waited\":%d}", rc, rc2);
	/* destroy: EBUSY while a QP uses it */
	rc = ibv_destroy_srq(srq);
	xpair_free(&x1);
	rc2 = ibv_destroy_srq(srq);
	xpair_free(&x2);
	{
		long held = orbite_provider_held("srq");
		int freed = ibv_destroy_srq(srq);

		out("{\"op\":\"srq_destroy\",\"in_use\":%d,\"still_in_use\":%d,\"held\":%ld,\"free\":%d,"
		    "\"held_after\":%ld}",
		    rc, rc2, held, freed, orbite_provider_held("srq"));
	}
}

/* ------------------------------------------------------------ teardown -- */

/* The responder's QP destroyed at once on its receive completion, its
 * responses held back meanwhile: the requester's SEND and WRITE_WITH_IMM
 * must still complete with success (the ACK left before the receive
 * completed, as an HCA acks on receipt), not retry exceeded. */
static void teardown1(const char *what, enum ibv_wr_opcode op)
{
	struct pair p = pair_new(16, RW);
	struct ibv_sge sge = { (uintptr_t)C.buf, 64, C.mr->lkey };
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	struct reply got;
	struct msg m;

	CHECK(call(C_POSTRECV, p.sidx, 1 << 20, 64, 1).v[0] == 0);
	call(C_DELAYSENDS, 0, 300, 0, 0);
	wr_one(&wr, &sge, 0x70, op, IBV_SEND_SIGNALED);
	if (op == IBV_WR_RDMA_WRITE_WITH_IMM) {
		wr.imm_data = htonl(0x1234);
		wr.wr.rdma.remote_addr = C.raddr + (2u << 20);
		wr.wr.rdma.rkey = C.rkey;
	}
	CHECK(ibv_post_send(p.qp, &wr, &bad) == 0);
	memset(&m, 0, sizeof(m));
	m.cmd = C_RECVTEARDOWN;
	m.idx = p.sidx;
	m.a = 5000;
	rv_send(C.fd, &m, sizeof(m));
	CHECK(rv_recv(C.fd, &got, sizeof(got)) == 0);
	CHECK(poll1(C.e.cq, &wc, 60000) && wc.wr_id == 0x70);
	out("{\"op\":\"teardown\",\"wr\":\"%s\",\"status\":%d,\"recv_polled\":%lld,\"recv_status\":%lld,"
	    "\"recv_opcode\":%lld,\"destroy\":%lld}",
	    what, wc.status, (long long)got.v[0], (long long)got.v[1], (long long)got.v[2], (long long)got.v[3]);
	CHECK(ibv_destroy_qp(p.qp) == 0);
}

static void sc_teardown(void)
{
	teardown1("SEND", IBV_WR_SEND);
	teardown1("RDMA_WRITE_WITH_IMM", IBV_WR_RDMA_WRITE_WITH_IMM);
}

static void sc_bench(char **argv)
{
	int read = !strcmp(argv[0], "READ");
	uint64_t msg = strtoull(argv[1], NULL, 10), total = strtoull(argv[2], NULL, 10);
	int depth = atoi(argv[3]), inflight = 0;
	int mode = !strcmp(argv[4], "events") ? 2 : !strcmp(argv[4], "sleep") ? 1 : 0;
	uint64_t span = strtoull(argv[5], NULL, 10);
	uint64_t slots = span / msg, posted = 0, done = 0, n = total / msg;
	struct pair p = pair_new((uint32_t)depth, RW);
	struct ibv_wc wc[16];
	long long before;
	double t0;

	CHECK(msg > 0 && span >= msg && span <= (32u << 20) && depth > 0 && depth <= 64 && n > 0);
	/* one warm-up WR: connection set up outside the measurement */
	CHECK(rdma1(p.qp, read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, 0, 0, (uint32_t)msg, C.raddr,
		    C.rkey, NULL) == 0);
	before = orbite_provider_counter(read ? "read_bytes_landed" : "write_bytes_sent");
	t0 = mono_s();
	while (done < n) {
		while (inflight < depth && posted < n) {
			uint64_t off = (posted % slots) * msg;

			CHECK(post_rdma(p.qp, read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE, posted + 1,
					C.buf + off, (uint32_t)msg, C.mr->lkey, C.raddr + off, C.rkey,
					IBV_SEND_SIGNALED) == 0);
			posted++;
			inflight++;
		}
		int got = ibv_poll_cq(C.e.cq, 16, wc);

		CHECK(got >= 0);
		if (got == 0 && mode == 1) {
			usleep(50);
		} else if (got == 0 && mode == 2) {
			struct ibv_cq *ecq;
			void *ectx;

			/* Arm, look again (a completion may have come first), wait. */
			CHECK(ibv_req_notify_cq(C.e.cq, 0) == 0);
			got = ibv_poll_cq(C.e.cq, 16, wc);
			CHECK(got >= 0);
			if (got == 0) {
				CHECK(ibv_get_cq_event(C.e.ch, &ecq, &ectx) == 0);
				ibv_ack_cq_events(ecq, 1);
				continue;
			}
		}
		for (int i = 0; i < got; i++)
			CHECK(wc[i].status == IBV_WC_SUCCESS);
		done += (uint64_t)got;
		inflight -= got;
	}
	{
		double dt = mono_s() - t0;

		/* the provider's own count: every byte really moved */
		CHECK(orbite_provider_counter(read ? "read_bytes_landed" : "write_bytes_sent") - before ==
		      (long long)(n * msg));
		out("{\"op\":\"bench\",\"opcode\":\"%s\",\"msg\":%llu,\"bytes\":%llu,\"depth\":%d,"
		    "\"wait\":\"%s\",\"span\":%llu,\"seconds\":%.6f,\"mb_per_s\":%.1f}",
		    read ? "RDMA_READ" : "RDMA_WRITE", (unsigned long long)msg,
		    (unsigned long long)(n * msg), depth, argv[4], (unsigned long long)(slots * msg), dt,
		    (double)(n * msg) / dt / 1e6);
	}
	pair_free(&p);
}

/* ---------------------------------------------------------------- main -- */

int main(int argc, char **argv)
{
	const char *sc;

	if (argc >= 4 && !strcmp(argv[1], "server")) {
		server(argv[2], argv[3]);
		return 0;
	}
	if (argc < 5 || strcmp(argv[1], "client")) {
		fprintf(stderr, "usage: %s server <rv> <dev> | client <rv> <dev> <scenario> [arg]\n", argv[0]);
		return 2;
	}
	sc = argv[4];
	client_open(argv[2], argv[3],
		    !strcmp(sc, "events") || (!strcmp(sc, "bench") && argc > 9 && !strcmp(argv[9], "events")));
	if (!strcmp(sc, "rw"))
		sc_rw();
	else if (!strcmp(sc, "errors"))
		sc_errors();
	else if (!strcmp(sc, "sqfull"))
		sc_sqfull();
	else if (!strcmp(sc, "events"))
		sc_events();
	else if (!strcmp(sc, "ebusy"))
		sc_ebusy();
	else if (!strcmp(sc, "destroy") && argc > 5)
		sc_destroy(argv[5]);
	else if (!strcmp(sc, "dependency") && argc > 5)
		sc_dependency(argv[5]);
	else if (!strcmp(sc, "partial"))
		sc_partial(0);
	else if (!strcmp(sc, "partial_env"))
		sc_partial(1);
	else if (!strcmp(sc, "partial_pace"))
		sc_partial(2);
	else if (!strcmp(sc, "observe"))
		sc_observe();
	else if (!strcmp(sc, "inflight_read"))
		sc_inflight(0);
	else if (!strcmp(sc, "inflight_write"))
		sc_inflight(1);
	else if (!strcmp(sc, "mw"))
		sc_mw();
	else if (!strcmp(sc, "srq"))
		sc_srq();
	else if (!strcmp(sc, "teardown"))
		sc_teardown();
	else if (!strcmp(sc, "atomics"))
		sc_atomics();
	else if (!strcmp(sc, "ext_post"))
		sc_ext_post();
	else if (!strcmp(sc, "ext_cq"))
		sc_ext_cq();
	else if (!strcmp(sc, "handshake") && argc > 6)
		sc_handshake(argv[5], atoi(argv[6]));
	else if (!strcmp(sc, "bench") && argc > 10)
		sc_bench(argv + 5);
	else
		CHECK(!"unknown scenario");
	client_close();
	out("{\"op\":\"done\"}");
	return 0;
}
