/* Loopback verbs provider: the data path.
 *
 * Each RC QP listens on (GID IPv4 address, port), the port being QPN >> 8.
 * At RTS its requester threads connect to the peer QP found from the AV alone
 * (dgid -> IPv4, dest_qp_num >> 8), say hello (both GIDs and QPNs, checked
 * by the peer against its own RTR attributes), then:
 *   tx  sends one request per WR in order (READ: a header; WRITE/SEND: a
 *       header and the payload read straight from the local MR);
 *   rx  reads the responses in the same order (READ: the payload, written
 *       straight into the local MR; WRITE/SEND: an acknowledgement sent by
 *       the peer after the bytes landed) and only then writes the CQE;
 *   responder (one per QP, from creation) accepts the peer's connection and
 *       serves its requests against this process's key table, checking key,
 *       PD, bounds and access flags (a failure is a NAK: the requester's WR
 *       completes with IBV_WC_REM_ACCESS_ERR, both QPs go to ERR, as rxe).
 * Payload moves in chunks (ORBITE_PROVIDER_CHUNK); between chunks the QP
 * state is checked, so moving the QP to ERR stops a WR part way (some bytes
 * landed, some not) and it completes with IBV_WC_WR_FLUSH_ERR once nothing
 * can land any more.  Sockets only see send()/recv(), never write(): the
 * uverbs_fault observer's seccomp filter inspects write() calls. */
#define _GNU_SOURCE
#include "provider.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define HELLO_MAGIC 0x4f524250u /* "ORBP" */
#define HELLO_VERSION 2
#define HELLO_DIRECT 1 /* hello.flags: the requester can move payload itself */
#define REPLY_DIRECT 1 /* hello_reply.flags: ... and this responder lets it */
#define DRAIN_MS 2000

struct hello {
	uint32_t magic;
	uint16_t version;
	uint8_t rnr_retry;
	uint8_t flags;
	uint8_t src_gid[16];
	uint8_t dst_gid[16];
	uint32_t src_qpn;
	uint32_t dst_qpn;
	uint8_t nonce[16];       /* with HELLO_DIRECT: random; the responder shows it back */
};

enum hello_status {
	HS_OK,
	HS_NO_QP,        /* no QP with that number here */
	HS_NOT_MY_GID,   /* the destination GID is not this device's */
	HS_NOT_READY,    /* the QP did not reach RTR in time */
	HS_WRONG_PEER,   /* the QP's AV names another GID/QPN */
};

/* With REPLY_DIRECT, pid is the responder's process and nonce_addr where it
 * keeps the hello's nonce: reading it there proves the pid (a process that
 * cannot write into another cannot make it hold a fresh random nonce). */
struct hello_reply {
	uint32_t magic;
	uint32_t status;
	uint32_t pid;
	uint32_t flags;
	uint64_t nonce_addr;
};

enum {
	OP_WRITE = 1, OP_READ, OP_SEND, OP_WRITE_IMM, OP_SEND_IMM, OP_CMP_SWP, OP_FETCH_ADD, OP_SEND_INV,
	OP_DONE, OP_MOVED
};
#define REQ_SOLICITED 1
#define REQ_DIRECT 2 /* the requester moves the payload itself: grant, OP_MOVED per piece, then OP_DONE */
#define REQ_ACK 4    /* an OP_MOVED the responder acknowledges once counted */

struct req_hdr {
	uint8_t op;
	uint8_t flags;
	uint16_t reserved;
	uint32_t rkey;
	uint64_t raddr;
	uint64_t len;
	uint32_t imm;
	uint32_t seq;
};

/* Follows the header of an atomic request; its answer carries the 8 bytes
 * the remote memory held. */
struct atomic_args {
	uint64_t compare_add;
	uint64_t swap;
};

/* Atomics of this process's responders are atomic with respect to each
 * other (the guarantee IBV_ATOMIC_HCA gives), whatever the alignment of the
 * host address behind an aligned iova. */
static pthread_mutex_t atomic_lock = PTHREAD_MUTEX_INITIALIZER;

enum { R_ACK, R_NAK_ACCESS, R_NAK_INV_REQ, R_NAK_OP, R_NAK_RNR, R_GRANT };

struct resp_hdr {
	uint8_t status;
	uint8_t op;
	uint16_t reserved;
	uint32_t seq;
	uint64_t len;
};

static uint64_t payload_ordinal; /* ORBITE_PROVIDER_STALL counts these */

/* ---------------------------------------------------------------- helpers -- */

static int qstate(struct pqp *q)
{
	return (int)__atomic_load_n(&q->qp.state, __ATOMIC_ACQUIRE);
}

static void set_state(struct pqp *q, enum ibv_qp_state s)
{
	__atomic_store_n(&q->qp.state, s, __ATOMIC_RELEASE);
}

static int spawn(pthread_t *t, void *(*fn)(void *), void *arg)
{
	sigset_t all, old;
	int rc;

	/* Provider threads never run the program's signal handlers. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(t, NULL, fn, arg);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

static int send_all(int fd, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	while (len) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static int sendv_all(int fd, struct iovec *iov, int cnt)
{
	struct msghdr mh;

	while (cnt > 0) {
		ssize_t n;

		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)cnt;
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		while (cnt > 0 && (size_t)n >= iov->iov_len) {
			n -= (ssize_t)iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + n;
			iov->iov_len -= (size_t)n;
		}
	}
	return 0;
}

/* The requester gives up on a peer that stays silent after ERR. */
static int rx_abandon(struct pqp *q)
{
	int s = qstate(q);

	if (__atomic_load_n(&q->dead, __ATOMIC_ACQUIRE) || s == IBV_QPS_RESET)
		return 1;
	return s == IBV_QPS_ERR && now_ms() - __atomic_load_n(&q->err_ms, __ATOMIC_ACQUIRE) > DRAIN_MS;
}

/* 0 when all bytes came, -1 on error or end of stream.  With q, the socket
 * has a receive timeout and rx_abandon decides whether to keep waiting.
 * With got, the bytes that did come are added to it (also on error: what
 * landed of a WRITE stopped part way stays landed). */
static int recvv_count(struct pqp *q, int fd, struct iovec *iov, int cnt, uint64_t *got)
{
	struct msghdr mh;

	while (cnt > 0) {
		ssize_t n;

		if (iov->iov_len == 0) {
			iov++;
			cnt--;
			continue;
		}
		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)cnt;
		n = recvmsg(fd, &mh, MSG_WAITALL);
		if (n < 0 && (errno == EINTR || ((errno == EAGAIN || errno == EWOULDBLOCK) && q &&
						  !rx_abandon(q))))
			continue;
		if (n <= 0)
			return -1;
		if (got)
			*got += (uint64_t)n;
		while (cnt > 0 && (size_t)n >= iov->iov_len) {
			n -= (ssize_t)iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (uint8_t *)iov->iov_base + n;
			iov->iov_len -= (size_t)n;
		}
	}
	return 0;
}

static int recvv_q(struct pqp *q, int fd, struct iovec *iov, int cnt)
{
	return recvv_count(q, fd, iov, cnt, NULL);
}

static int recvv_all(int fd, struct iovec *iov, int cnt)
{
	return recvv_q(NULL, fd, iov, cnt);
}

static int recv_all(int fd, void *buf, size_t len)
{
	struct iovec iov = { buf, len };

	return recvv_all(fd, &iov, 1);
}

static int recv_q(struct pqp *q, int fd, void *buf, size_t len)
{
	struct iovec iov = { buf, len };

	return recvv_q(q, fd, &iov, 1);
}

static int discard(int fd, uint64_t len)
{
	uint8_t sink[16384];

	while (len) {
		size_t n = len < sizeof(sink) ? (size_t)len : sizeof(sink);

		if (recv_all(fd, sink, n))
			return -1;
		len -= n;
	}
	return 0;
}

/* Wait up to ms for fd to become readable; 1 readable, 0 timeout, -1 error. */
static int wait_readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int rc;

	do
		rc = poll(&p, 1, ms);
	while (rc < 0 && errno == EINTR);
	return rc;
}

static void set_nodelay(int fd)
{
	int one = 1;

	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* Build iovecs for bytes [off, off+len) of a scatter list of resolved memory. */
static int slice(const struct ibv_sge *sge, const struct memref *mem, int nsge, uint64_t off,
		 uint64_t len, struct iovec *iov, int maxiov)
{
	int i, n = 0;

	for (i = 0; i < nsge && len; i++) {
		uint64_t l = sge[i].length;

		if (off >= l) {
			off -= l;
			continue;
		}
		if (n == maxiov)
			break;
		iov[n].iov_base = mem[i].ptr + off;
		iov[n].iov_len = (size_t)(l - off < len ? l - off : len);
		len -= iov[n].iov_len;
		off = 0;
		n++;
	}
	return n;
}

void qp_wake(struct pqp *q)
{
	pthread_cond_broadcast(&q->cond);
	pthread_cond_broadcast(&q->txcv);
}

/* ------------------------------------------------------------ completions -- */

static enum ibv_wc_opcode wc_opcode(enum ibv_wr_opcode op)
{
	switch (op) {
	case IBV_WR_RDMA_READ:
		return IBV_WC_RDMA_READ;
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
		return IBV_WC_SEND;
	case IBV_WR_BIND_MW:
		return IBV_WC_BIND_MW;
	case IBV_WR_LOCAL_INV:
		return IBV_WC_LOCAL_INV;
	case IBV_WR_ATOMIC_CMP_AND_SWP:
		return IBV_WC_COMP_SWAP;
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		return IBV_WC_FETCH_ADD;
	default:
		return IBV_WC_RDMA_WRITE;
	}
}

void cq_push(struct pcq *cq, const struct cqe_slot *slot)
{
	struct pchan *ch = (struct pchan *)cq->cq.channel;
	int fire;

	pthread_mutex_lock(&cq->lock);
	if (cq->count == cq->cap) {
		/* CQ overrun: the completion is lost, as on an RNIC, and the
		 * program gets IBV_EVENT_CQ_ERR. */
		if (cq->overruns++ == 0) {
			prov_warn("CQ %p overrun (%d entries): completions are lost", (void *)cq, cq->cap);
			ctx_async_event(pctx_of(cq->cq.context), (uintptr_t)cq, IBV_EVENT_CQ_ERR);
		}
		pthread_mutex_unlock(&cq->lock);
		return;
	}
	cq->ring[(cq->head + cq->count) % cq->cap] = *slot;
	cq->count++;
	fire = cq->armed == 1 ||
	       (cq->armed == 2 && (slot->solicited || slot->wc.status != IBV_WC_SUCCESS));
	if (fire && ch) {
		struct {
			uint64_t cq_handle;
		} ev = { cq->id };

		cq->armed = 0;
		send(ch->wfd, &ev, sizeof(ev), MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	pthread_mutex_unlock(&cq->lock);
}

void cq_purge_qp(struct pcq *cq, struct pqp *qp)
{
	int i, out = 0;

	pthread_mutex_lock(&cq->lock);
	for (i = 0; i < cq->count; i++) {
		struct cqe_slot *s = &cq->ring[(cq->head + i) % cq->cap];

		if (s->qp != qp)
			cq->ring[(cq->head + out++) % cq->cap] = *s;
	}
	cq->count = out;
	pthread_mutex_unlock(&cq->lock);
}

/* One send CQE (q->lock held).  Error completions carry only wr_id, status,
 * qp_num and vendor_err: the rest is poisoned so that no engine relies on it. */
static void complete_send(struct pqp *q, struct swqe *e, enum ibv_wc_status status)
{
	struct cqe_slot s;
	int signaled = q->sq_sig_all || (e->send_flags & IBV_SEND_SIGNALED);

	stat_add(q->c, status == IBV_WC_SUCCESS ? S_WR_COMPLETED : S_WR_FAILED, 1);
	if (status == IBV_WC_SUCCESS && !signaled)
		return; /* its send-queue slot goes with the next polled CQE */
	memset(&s, 0, sizeof(s));
	s.qp = q;
	s.is_send = 1;
	s.sq_seq = e->seq;
	s.wc.wr_id = e->wr_id;
	s.wc.status = status;
	s.wc.qp_num = q->qp.qp_num;
	if (status == IBV_WC_SUCCESS) {
		s.wc.opcode = wc_opcode(e->opcode);
		s.wc.byte_len = (uint32_t)e->len;
	} else {
		s.wc.opcode = (enum ibv_wc_opcode)0x5a;
		s.wc.byte_len = 0xdeadbeef;
		s.wc.vendor_err = 0x100 + (uint32_t)status;
	}
	cq_push((struct pcq *)q->qp.send_cq, &s);
}

/* flags: 0, IBV_WC_WITH_IMM (imm is the immediate) or IBV_WC_WITH_INV (imm
 * is the rkey the SEND invalidated). */
static void complete_recv(struct pqp *q, const struct rwqe *r, enum ibv_wc_status status,
			  enum ibv_wc_opcode op, uint64_t len, unsigned int flags, uint32_t imm,
			  int solicited)
{
	struct cqe_slot s;

	memset(&s, 0, sizeof(s));
	s.qp = q;
	s.solicited = solicited;
	s.wc.wr_id = r->wr_id;
	s.wc.status = status;
	s.wc.qp_num = q->qp.qp_num;
	if (status == IBV_WC_SUCCESS) {
		s.wc.opcode = op;
		s.wc.byte_len = (uint32_t)len;
		s.wc.src_qp = q->dest_qpn;
		if (flags) {
			s.wc.wc_flags = flags;
			s.wc.imm_data = imm;
		}
	} else {
		s.wc.opcode = (enum ibv_wc_opcode)0x5a;
		s.wc.byte_len = 0xdeadbeef;
		s.wc.vendor_err = 0x100 + (uint32_t)status;
	}
	cq_push((struct pcq *)q->qp.recv_cq, &s);
}

/* Flush what is queued (q->lock held): the first WR gets the pending error
 * (a transport failure), every other one IBV_WC_WR_FLUSH_ERR. */
void qp_flush_locked(struct pqp *q)
{
	uint32_t n = q->cap.max_send_wr ? q->cap.max_send_wr : 1;
	uint32_t rn = q->cap.max_recv_wr ? q->cap.max_recv_wr : 1;

	while (q->sq_rx < q->sq_head) {
		struct swqe *e = &q->sq[q->sq_rx % n];
		enum ibv_wc_status st = IBV_WC_WR_FLUSH_ERR;

		if (q->pending_err != IBV_WC_SUCCESS && q->pending_err != IBV_WC_WR_FLUSH_ERR)
			st = q->pending_err;
		q->pending_err = IBV_WC_WR_FLUSH_ERR;
		complete_send(q, e, st);
		q->sq_rx++;
	}
	q->sq_tx = q->sq_rx;
	while (q->rq_tail < q->rq_head) {
		complete_recv(q, &q->rq[q->rq_tail % rn], IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0, 0);
		q->rq_tail++;
	}
	q->flushed = 1;
}

void qp_set_error_locked(struct pqp *q, enum ibv_wc_status status)
{
	if (q->qp.state == IBV_QPS_ERR)
		return;
	set_state(q, IBV_QPS_ERR);
	__atomic_store_n(&q->err_ms, now_ms(), __ATOMIC_RELEASE);
	if (q->pending_err == IBV_WC_SUCCESS)
		q->pending_err = status;
	/* A QP in error answers nothing: the peer's requests go unanswered. */
	if (q->ifd >= 0)
		shutdown(q->ifd, SHUT_RDWR);
	if (!q->rx_running)
		qp_flush_locked(q);
	qp_wake(q);
}

/* ------------------------------------------------------------ posting -- */

static int is_payload(enum ibv_wr_opcode op)
{
	return op == IBV_WR_RDMA_READ || op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM ||
	       op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV;
}

/* Queue one WR (q->lock held); 0 or the errno post_send returns. */
static int post_one_locked(struct pqp *q, const struct ibv_send_wr *w, int type1_bind)
{
	uint32_t n = q->cap.max_send_wr;
	struct swqe *e;
	uint64_t len = 0;
	int i, inl = (w->send_flags & IBV_SEND_INLINE) != 0;

	switch (w->opcode) {
	case IBV_WR_RDMA_READ:
	case IBV_WR_ATOMIC_CMP_AND_SWP:
	case IBV_WR_ATOMIC_FETCH_AND_ADD:
		if (inl)
			return EINVAL;
		break;
	case IBV_WR_RDMA_WRITE:
	case IBV_WR_RDMA_WRITE_WITH_IMM:
	case IBV_WR_SEND:
	case IBV_WR_SEND_WITH_IMM:
	case IBV_WR_SEND_WITH_INV:
		break;
	case IBV_WR_BIND_MW:
		/* Type-2 windows through post_send, type 1 through ibv_bind_mw. */
		if (!w->bind_mw.mw || w->bind_mw.mw->context != q->qp.context ||
		    w->bind_mw.mw->type != (type1_bind ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2))
			return EINVAL;
		break;
	case IBV_WR_LOCAL_INV:
		break;
	case IBV_WR_TSO:
	case IBV_WR_DRIVER1:
	case IBV_WR_ATOMIC_WRITE:
		return EOPNOTSUPP; /* known, not modelled: mlx5's "not supported" */
	default:
		return EINVAL;
	}
	if (w->num_sge < 0 || (uint32_t)w->num_sge > q->cap.max_send_sge)
		return EINVAL;
	for (i = 0; i < w->num_sge; i++)
		len += w->sg_list[i].length;
	if (inl && len > q->cap.max_inline_data)
		return EINVAL;
	if (len > (1ull << 31))
		return EINVAL; /* max_msg_sz */
	if (!n || q->sq_head - __atomic_load_n(&q->sq_tail, __ATOMIC_SEQ_CST) >= n)
		return ENOMEM; /* the send queue is full */
	e = &q->sq[q->sq_head % n];
	e->wr_id = w->wr_id;
	e->opcode = w->opcode;
	e->send_flags = w->send_flags;
	e->imm = w->imm_data;
	e->inv_rkey = w->invalidate_rkey;
	e->rkey = w->wr.rdma.rkey;
	e->raddr = w->wr.rdma.remote_addr;
	e->num_sge = w->num_sge;
	e->len = len;
	e->mw = NULL;
	if (w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		/* wr.atomic, not wr.rdma: rkey sits after the two operands */
		e->rkey = w->wr.atomic.rkey;
		e->raddr = w->wr.atomic.remote_addr;
		e->compare_add = w->wr.atomic.compare_add;
		e->swap = w->wr.atomic.swap;
	}
	if (w->opcode == IBV_WR_BIND_MW) {
		e->mw = w->bind_mw.mw;
		e->new_rkey = w->bind_mw.rkey;
		e->bind = w->bind_mw.bind_info;
		e->len = 0;
	}
	if (inl) {
		uint64_t off = 0;

		/* Inline data is copied now: no key is checked, the buffer
		 * may be reused as soon as post_send returns. */
		for (i = 0; i < w->num_sge; i++) {
			memcpy(e->inl + off, (void *)(uintptr_t)w->sg_list[i].addr, w->sg_list[i].length);
			off += w->sg_list[i].length;
		}
		e->num_sge = 0;
	} else if (w->num_sge) {
		memcpy(e->sge, w->sg_list, sizeof(*e->sge) * (size_t)w->num_sge);
	}
	e->stall_at = UINT64_MAX;
	if (is_payload(w->opcode)) {
		uint64_t ord = __atomic_fetch_add(&payload_ordinal, 1, __ATOMIC_RELAXED);

		if (cfg.stall_skip >= 0 && ord == (uint64_t)cfg.stall_skip) {
			e->stall_at = cfg.stall_bytes;
			q->stall_ms = cfg.stall_ms;
		} else if (q->stall_next != UINT64_MAX) {
			e->stall_at = q->stall_next;
			q->stall_next = UINT64_MAX;
		}
	}
	e->state = W_POSTED;
	e->status = IBV_WC_SUCCESS;
	e->seq = q->sq_head++;
	return 0;
}

/* The one posting path of ibv_post_send and wr_complete.  whole: as mlx5's
 * wr_complete, a failing WR drops the whole batch (the queue is rolled back
 * before tx, which waits for q->lock, could see any of it). */
static int post_list(struct pqp *q, struct ibv_send_wr *wr, struct ibv_send_wr **bad, int whole)
{
	struct ibv_send_wr *w;
	uint64_t head, stall_next;
	int ret = 0, st;

	pthread_mutex_lock(&q->lock);
	st = q->qp.state;
	head = q->sq_head;
	stall_next = q->stall_next;
	for (w = wr; w; w = w->next) {
		ret = (st == IBV_QPS_RTS || st == IBV_QPS_ERR) ? post_one_locked(q, w, 0) : EINVAL;
		if (ret) {
			*bad = w;
			break;
		}
	}
	if (ret && whole) {
		q->sq_head = head;
		q->stall_next = stall_next;
	}
	/* In ERR a WR is accepted and flushed at once, after the queue. */
	if (st == IBV_QPS_ERR && q->flushed)
		qp_flush_locked(q);
	pthread_cond_signal(&q->txcv); /* only tx waits for posts */
	pthread_mutex_unlock(&q->lock);
	return ret;
}

int dp_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	return post_list((struct pqp *)qp, wr, bad, 0);
}

/* ------------------------------------------------------ extended post -- */

/* The wr_* family builds ibv_send_wr entries (q->xb) and wr_complete posts
 * them through post_list, so keys, bounds, access, the send queue and the
 * completions are those of ibv_post_send.  The program's ops.post_send is
 * not called: observers wrap the wr_* pointers themselves. */
static struct pqp *xq(struct ibv_qp_ex *qx)
{
	return (struct pqp *)qx;
}

static void xb_fail(struct xbatch *b, int err)
{
	if (!b->err)
		b->err = err;
}

/* The current WR of the batch (NULL before the first opcode call). */
static struct xwr *xb_cur(struct pqp *q)
{
	if (!q->xb.open || !q->xb.n) {
		xb_fail(&q->xb, EINVAL);
		return NULL;
	}
	return &q->xb.w[q->xb.n - 1];
}

/* Begin a WR: wr_id and wr_flags as the program set them before the call. */
static struct xwr *xb_new(struct pqp *q, enum ibv_wr_opcode op)
{
	struct xbatch *b = &q->xb;
	struct xwr *x;

	if (!b->open) {
		xb_fail(b, EINVAL);
		return NULL;
	}
	if (b->n == b->cap) {
		int ncap = b->cap ? b->cap * 2 : 8;
		struct xwr *n;

		/* More WRs than the send queue holds cannot all be posted. */
		if ((uint32_t)b->n > q->cap.max_send_wr || !(n = realloc(b->w, sizeof(*n) * (size_t)ncap))) {
			xb_fail(b, ENOMEM);
			return NULL;
		}
		b->w = n;
		b->cap = ncap;
	}
	x = &b->w[b->n++];
	memset(&x->wr, 0, sizeof(x->wr));
	x->wr.wr_id = q->qpx.wr_id;
	x->wr.send_flags = q->qpx.wr_flags;
	x->wr.opcode = op;
	return x;
}

static void x_start(struct ibv_qp_ex *qx)
{
	struct pqp *q = xq(qx);

	q->xb.open = 1;
	q->xb.n = 0;
	q->xb.err = 0;
}

static void x_abort(struct ibv_qp_ex *qx)
{
	struct pqp *q = xq(qx);

	q->xb.open = 0;
	q->xb.n = 0;
	q->xb.err = 0;
}

static int x_complete(struct ibv_qp_ex *qx)
{
	struct pqp *q = xq(qx);
	struct xbatch *b = &q->xb;
	struct ibv_send_wr *bad = NULL;
	int i, ret = b->err;

	if (!b->open)
		ret = EINVAL;
	if (!ret && b->n) {
		for (i = 0; i < b->n; i++) {
			struct ibv_send_wr *w = &b->w[i].wr;

			if (w->send_flags & IBV_SEND_INLINE) {
				w->sg_list = b->w[i].sge; /* one SGE over the copy */
				b->w[i].sge[0].addr = (uintptr_t)b->w[i].inl;
			} else {
				w->sg_list = b->w[i].sge;
			}
			w->next = i + 1 < b->n ? &b->w[i + 1].wr : NULL;
		}
		ret = post_list(q, &b->w[0].wr, &bad, 1);
	}
	b->open = 0;
	b->n = 0;
	b->err = 0;
	return ret;
}

static void x_rdma(struct ibv_qp_ex *qx, enum ibv_wr_opcode op, uint32_t rkey, uint64_t raddr,
		   __be32 imm)
{
	struct xwr *x = xb_new(xq(qx), op);

	if (x) {
		x->wr.wr.rdma.rkey = rkey;
		x->wr.wr.rdma.remote_addr = raddr;
		x->wr.imm_data = imm;
	}
}

static void x_rdma_read(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t raddr)
{
	x_rdma(qx, IBV_WR_RDMA_READ, rkey, raddr, 0);
}

static void x_rdma_write(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t raddr)
{
	x_rdma(qx, IBV_WR_RDMA_WRITE, rkey, raddr, 0);
}

static void x_rdma_write_imm(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t raddr, __be32 imm)
{
	x_rdma(qx, IBV_WR_RDMA_WRITE_WITH_IMM, rkey, raddr, imm);
}

static void x_send(struct ibv_qp_ex *qx)
{
	x_rdma(qx, IBV_WR_SEND, 0, 0, 0);
}

static void x_send_imm(struct ibv_qp_ex *qx, __be32 imm)
{
	x_rdma(qx, IBV_WR_SEND_WITH_IMM, 0, 0, imm);
}

static void x_atomic(struct ibv_qp_ex *qx, enum ibv_wr_opcode op, uint32_t rkey, uint64_t raddr,
		     uint64_t compare_add, uint64_t swap)
{
	struct xwr *x = xb_new(xq(qx), op);

	if (x) {
		x->wr.wr.atomic.rkey = rkey;
		x->wr.wr.atomic.remote_addr = raddr;
		x->wr.wr.atomic.compare_add = compare_add;
		x->wr.wr.atomic.swap = swap;
	}
}

static void x_atomic_cmp_swp(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t raddr, uint64_t compare,
			     uint64_t swap)
{
	x_atomic(qx, IBV_WR_ATOMIC_CMP_AND_SWP, rkey, raddr, compare, swap);
}

static void x_atomic_fetch_add(struct ibv_qp_ex *qx, uint32_t rkey, uint64_t raddr, uint64_t add)
{
	x_atomic(qx, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, raddr, add, 0);
}

static void x_send_inv(struct ibv_qp_ex *qx, uint32_t rkey)
{
	struct xwr *x = xb_new(xq(qx), IBV_WR_SEND_WITH_INV);

	if (x)
		x->wr.invalidate_rkey = rkey;
}

static void x_local_inv(struct ibv_qp_ex *qx, uint32_t rkey)
{
	struct xwr *x = xb_new(xq(qx), IBV_WR_LOCAL_INV);

	if (x)
		x->wr.invalidate_rkey = rkey;
}

static void x_bind_mw(struct ibv_qp_ex *qx, struct ibv_mw *mw, uint32_t rkey,
		      const struct ibv_mw_bind_info *info)
{
	struct xwr *x = xb_new(xq(qx), IBV_WR_BIND_MW);

	if (x) {
		x->wr.bind_mw.mw = mw;
		x->wr.bind_mw.rkey = rkey;
		x->wr.bind_mw.bind_info = *info;
	}
}

static void x_set_sge_list(struct ibv_qp_ex *qx, size_t n, const struct ibv_sge *sg)
{
	struct pqp *q = xq(qx);
	struct xwr *x = xb_cur(q);

	if (!x)
		return;
	if (n > q->cap.max_send_sge || n > MAX_SGE) {
		xb_fail(&q->xb, EINVAL);
		return;
	}
	x->wr.send_flags &= ~(unsigned int)IBV_SEND_INLINE;
	memcpy(x->sge, sg, sizeof(*sg) * n);
	x->wr.num_sge = (int)n;
}

static void x_set_sge(struct ibv_qp_ex *qx, uint32_t lkey, uint64_t addr, uint32_t length)
{
	struct ibv_sge sge = { addr, length, lkey };

	x_set_sge_list(qx, 1, &sge);
}

/* Inline data is copied now, as mlx5 copies it into the WQE: the buffers
 * may be reused as soon as the call returns. */
static void x_set_inline_data_list(struct ibv_qp_ex *qx, size_t n, const struct ibv_data_buf *bufs)
{
	struct pqp *q = xq(qx);
	struct xwr *x = xb_cur(q);
	size_t i, len = 0;

	if (!x)
		return;
	for (i = 0; i < n; i++) {
		if (bufs[i].length > q->cap.max_inline_data - len) {
			xb_fail(&q->xb, EINVAL);
			return;
		}
		memcpy(x->inl + len, bufs[i].addr, bufs[i].length);
		len += bufs[i].length;
	}
	x->wr.send_flags |= IBV_SEND_INLINE;
	x->sge[0].length = (uint32_t)len;
	x->sge[0].lkey = 0;
	x->wr.num_sge = 1;
}

static void x_set_inline_data(struct ibv_qp_ex *qx, void *addr, size_t length)
{
	struct ibv_data_buf b = { addr, length };

	x_set_inline_data_list(qx, 1, &b);
}

void qp_ex_init_ops(struct pqp *q, uint64_t ops)
{
	struct ibv_qp_ex *x = &q->qpx;

	x->wr_start = x_start;
	x->wr_complete = x_complete;
	x->wr_abort = x_abort;
	x->wr_set_sge = x_set_sge;
	x->wr_set_sge_list = x_set_sge_list;
	x->wr_set_inline_data = x_set_inline_data;
	x->wr_set_inline_data_list = x_set_inline_data_list;
	/* as mlx5: an opcode's pointer only when send_ops_flags asked for it */
	if (ops & IBV_QP_EX_WITH_RDMA_READ)
		x->wr_rdma_read = x_rdma_read;
	if (ops & IBV_QP_EX_WITH_RDMA_WRITE)
		x->wr_rdma_write = x_rdma_write;
	if (ops & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)
		x->wr_rdma_write_imm = x_rdma_write_imm;
	if (ops & IBV_QP_EX_WITH_SEND)
		x->wr_send = x_send;
	if (ops & IBV_QP_EX_WITH_SEND_WITH_IMM)
		x->wr_send_imm = x_send_imm;
	if (ops & IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP)
		x->wr_atomic_cmp_swp = x_atomic_cmp_swp;
	if (ops & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)
		x->wr_atomic_fetch_add = x_atomic_fetch_add;
	if (ops & IBV_QP_EX_WITH_SEND_WITH_INV)
		x->wr_send_inv = x_send_inv;
	if (ops & IBV_QP_EX_WITH_LOCAL_INV)
		x->wr_local_inv = x_local_inv;
	if (ops & IBV_QP_EX_WITH_BIND_MW)
		x->wr_bind_mw = x_bind_mw;
}

void qp_ex_free(struct pqp *q)
{
	free(q->xb.w);
}

int dp_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind)
{
	struct pqp *q = (struct pqp *)qp;
	struct ibv_send_wr w;
	int ret;

	memset(&w, 0, sizeof(w));
	w.wr_id = bind->wr_id;
	w.send_flags = bind->send_flags;
	w.opcode = IBV_WR_BIND_MW;
	w.bind_mw.mw = mw;
	w.bind_mw.bind_info = bind->bind_info;
	w.bind_mw.rkey = orbite_ibv_inc_rkey(mw->rkey);
	pthread_mutex_lock(&q->lock);
	if (q->qp.state != IBV_QPS_RTS && q->qp.state != IBV_QPS_ERR) {
		pthread_mutex_unlock(&q->lock);
		return EINVAL;
	}
	/* A type-1 bind is a send-queue operation too. */
	ret = post_one_locked(q, &w, 1);
	if (!ret)
		mw->rkey = w.bind_mw.rkey; /* the new key is known at once */
	if (q->qp.state == IBV_QPS_ERR && q->flushed)
		qp_flush_locked(q);
	pthread_cond_signal(&q->txcv);
	pthread_mutex_unlock(&q->lock);
	return ret;
}

int dp_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct pqp *q = (struct pqp *)qp;
	uint32_t n = q->cap.max_recv_wr;
	struct ibv_recv_wr *w;
	int ret = 0;

	pthread_mutex_lock(&q->lock);
	for (w = wr; w; w = w->next) {
		struct rwqe *r;

		if (q->qp.state == IBV_QPS_RESET || q->srq) {
			ret = EINVAL; /* with an SRQ, receives go to the SRQ */
		} else if (w->num_sge < 0 || (uint32_t)w->num_sge > q->cap.max_recv_sge) {
			ret = EINVAL;
		} else if (!n || q->rq_head - q->rq_tail >= n) {
			ret = ENOMEM;
		}
		if (ret) {
			*bad = w;
			break;
		}
		r = &q->rq[q->rq_head % n];
		r->wr_id = w->wr_id;
		r->num_sge = w->num_sge;
		if (w->num_sge)
			memcpy(r->sge, w->sg_list, sizeof(*r->sge) * (size_t)w->num_sge);
		q->rq_head++;
	}
	if (q->qp.state == IBV_QPS_ERR && q->flushed)
		qp_flush_locked(q);
	qp_wake(q);
	pthread_mutex_unlock(&q->lock);
	return ret;
}

int cq_take_locked(struct pcq *cq, struct ibv_wc *wc)
{
	struct cqe_slot *s;

	if (!cq->count)
		return 0;
	s = &cq->ring[cq->head];
	*wc = s->wc;
	/* A polled send CQE frees its slot and every earlier one (unsignaled
	 * WRs included), as on hardware. */
	if (s->is_send)
		__atomic_store_n(&s->qp->sq_tail, s->sq_seq + 1, __ATOMIC_SEQ_CST);
	cq->head = (cq->head + 1) % cq->cap;
	cq->count--;
	return 1;
}

int dp_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct psrq *s = (struct psrq *)srq;
	struct ibv_recv_wr *w;
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	for (w = wr; w; w = w->next) {
		struct rwqe *r;

		if (w->num_sge < 0 || (uint32_t)w->num_sge > s->max_sge)
			ret = EINVAL;
		else if (s->head - s->tail >= s->max_wr)
			ret = ENOMEM;
		if (ret) {
			*bad = w;
			break;
		}
		r = &s->rq[s->head % s->max_wr];
		r->wr_id = w->wr_id;
		r->num_sge = w->num_sge;
		if (w->num_sge)
			memcpy(r->sge, w->sg_list, sizeof(*r->sge) * (size_t)w->num_sge);
		s->head++;
	}
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->lock);
	return ret;
}

int dp_poll_cq(struct ibv_cq *ibcq, int num, struct ibv_wc *wc)
{
	struct pcq *cq = (struct pcq *)ibcq;
	int n = 0;

	pthread_mutex_lock(&cq->lock);
	while (n < num && cq_take_locked(cq, &wc[n]))
		n++;
	pthread_mutex_unlock(&cq->lock);
	return n;
}

/* ------------------------------------------------------ extended poll -- */

/* start_poll takes the CQ's lock and the oldest completion (consumed as
 * poll_cq consumes it); next_poll the next one; end_poll lets go.  As
 * mlx5: ENOENT when there is none, and start_poll's ENOENT releases the
 * lock itself (the program must not call end_poll then). */
static void cq_ex_load(struct pcq *cq)
{
	cq->cqx.wr_id = cq->cur.wr_id;
	cq->cqx.status = cq->cur.status;
}

static int cq_ex_start_poll(struct ibv_cq_ex *ibcq, struct ibv_poll_cq_attr *attr)
{
	struct pcq *cq = (struct pcq *)ibcq;

	if (attr->comp_mask)
		return EINVAL;
	pthread_mutex_lock(&cq->lock);
	if (!cq_take_locked(cq, &cq->cur)) {
		pthread_mutex_unlock(&cq->lock);
		return ENOENT;
	}
	cq_ex_load(cq);
	return 0;
}

static int cq_ex_next_poll(struct ibv_cq_ex *ibcq)
{
	struct pcq *cq = (struct pcq *)ibcq;

	if (!cq_take_locked(cq, &cq->cur))
		return ENOENT;
	cq_ex_load(cq);
	return 0;
}

static void cq_ex_end_poll(struct ibv_cq_ex *ibcq)
{
	pthread_mutex_unlock(&((struct pcq *)ibcq)->lock);
}

#define CUR(ibcq) (&((struct pcq *)(ibcq))->cur)

static enum ibv_wc_opcode cq_ex_read_opcode(struct ibv_cq_ex *c)
{
	return CUR(c)->opcode;
}

static uint32_t cq_ex_read_vendor_err(struct ibv_cq_ex *c)
{
	return CUR(c)->vendor_err;
}

static uint32_t cq_ex_read_byte_len(struct ibv_cq_ex *c)
{
	return CUR(c)->byte_len;
}

static __be32 cq_ex_read_imm_data(struct ibv_cq_ex *c)
{
	return CUR(c)->imm_data;
}

static uint32_t cq_ex_read_qp_num(struct ibv_cq_ex *c)
{
	return CUR(c)->qp_num;
}

static uint32_t cq_ex_read_src_qp(struct ibv_cq_ex *c)
{
	return CUR(c)->src_qp;
}

static unsigned int cq_ex_read_wc_flags(struct ibv_cq_ex *c)
{
	return CUR(c)->wc_flags;
}

static uint32_t cq_ex_read_slid(struct ibv_cq_ex *c)
{
	return CUR(c)->slid;
}

static uint8_t cq_ex_read_sl(struct ibv_cq_ex *c)
{
	return CUR(c)->sl;
}

static uint8_t cq_ex_read_dlid_path_bits(struct ibv_cq_ex *c)
{
	return CUR(c)->dlid_path_bits;
}

#undef CUR

/* As mlx5: opcode, vendor_err and wc_flags always; the others only when
 * their IBV_WC_EX_WITH_* flag was asked (NULL otherwise). */
void cq_ex_init_ops(struct pcq *cq)
{
	struct ibv_cq_ex *x = &cq->cqx;
	uint64_t f = cq->wc_flags;

	x->start_poll = cq_ex_start_poll;
	x->next_poll = cq_ex_next_poll;
	x->end_poll = cq_ex_end_poll;
	x->read_opcode = cq_ex_read_opcode;
	x->read_vendor_err = cq_ex_read_vendor_err;
	x->read_wc_flags = cq_ex_read_wc_flags;
	x->read_byte_len = (f & IBV_WC_EX_WITH_BYTE_LEN) ? cq_ex_read_byte_len : NULL;
	x->read_imm_data = (f & IBV_WC_EX_WITH_IMM) ? cq_ex_read_imm_data : NULL;
	x->read_qp_num = (f & IBV_WC_EX_WITH_QP_NUM) ? cq_ex_read_qp_num : NULL;
	x->read_src_qp = (f & IBV_WC_EX_WITH_SRC_QP) ? cq_ex_read_src_qp : NULL;
	x->read_slid = (f & IBV_WC_EX_WITH_SLID) ? cq_ex_read_slid : NULL;
	x->read_sl = (f & IBV_WC_EX_WITH_SL) ? cq_ex_read_sl : NULL;
	x->read_dlid_path_bits = (f & IBV_WC_EX_WITH_DLID_PATH_BITS) ? cq_ex_read_dlid_path_bits : NULL;
}

int dp_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
	struct pcq *cq = (struct pcq *)ibcq;

	pthread_mutex_lock(&cq->lock);
	cq->armed = solicited_only ? 2 : 1;
	pthread_mutex_unlock(&cq->lock);
	return 0;
}

/* ---------------------------------------------------- local operations -- */

/* Invalidate the type-2 window behind rkey, bound and of q's PD (remote:
 * bound through q too, as type 2B; MRs are not remotely invalidated, as
 * for ibv_reg_mr memory on mlx5).  0, or -1 for a key that is none of
 * those; c->lock held. */
static int invalidate_locked(struct pqp *q, uint32_t rkey, int remote)
{
	struct pctx *c = q->c;
	uint32_t idx = rkey >> 8;
	struct keyent *k = idx && idx < c->nkeys ? &c->keys[idx] : NULL;
	struct pmw *w;

	if (!k || k->kind != KEY_MW || k->tag != (uint8_t)rkey)
		return -1;
	w = k->obj;
	if (w->mw.type != IBV_MW_TYPE_2 || !w->bound || w->mw.pd != q->qp.pd || (remote && w->qp != q))
		return -1;
	if (w->mr)
		w->mr->mw_bound--;
	w->bound = 0;
	w->mr = NULL;
	w->qp = NULL;
	return 0;
}

/* SEND_WITH_INV on the responder, once the payload landed: 0 or -1. */
static int remote_invalidate(struct pqp *q, uint32_t rkey)
{
	int rc;

	pthread_mutex_lock(&q->c->lock);
	rc = invalidate_locked(q, rkey, 1);
	pthread_mutex_unlock(&q->c->lock);
	return rc;
}

static unsigned int recv_flags(int op)
{
	return op == OP_SEND_IMM ? IBV_WC_WITH_IMM : op == OP_SEND_INV ? IBV_WC_WITH_INV : 0;
}

/* Bind or invalidate a memory window (tx thread); 0 or IBV_WC_MW_BIND_ERR. */
static enum ibv_wc_status local_op(struct pqp *q, struct swqe *e)
{
	struct pctx *c = q->c;
	enum ibv_wc_status st = IBV_WC_MW_BIND_ERR;
	struct pmw *w;

	pthread_mutex_lock(&c->lock);
	if (e->opcode == IBV_WR_LOCAL_INV) {
		if (invalidate_locked(q, e->inv_rkey, 0) == 0)
			st = IBV_WC_SUCCESS;
	} else {
		struct pmr *mr = (struct pmr *)e->bind.mr;
		uint32_t idx;

		w = (struct pmw *)e->mw;
		idx = w->mw.rkey >> 8;
		if (!e->bind.length && w->mw.type == IBV_MW_TYPE_1) {
			/* A zero-length type-1 bind unbinds the window. */
			if (w->bound && w->mr)
				w->mr->mw_bound--;
			w->bound = 0;
			w->mr = NULL;
			st = IBV_WC_SUCCESS;
		} else if (mr && !mr->dead && mr->mr.pd == q->qp.pd && w->mw.pd == q->qp.pd &&
			   (mr->access & IBV_ACCESS_MW_BIND) &&
			   (e->new_rkey >> 8) == idx &&
			   !(w->mw.type == IBV_MW_TYPE_2 && w->bound) &&
			   e->bind.addr >= mr->iova && e->bind.addr - mr->iova <= mr->mr.length &&
			   e->bind.length <= mr->mr.length - (e->bind.addr - mr->iova) &&
			   (!(e->bind.mw_access_flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) ||
			    (mr->access & IBV_ACCESS_LOCAL_WRITE))) {
			if (w->bound && w->mr)
				w->mr->mw_bound--;
			w->bound = 1;
			w->mr = mr;
			mr->mw_bound++;
			w->addr = e->bind.addr;
			w->length = e->bind.length;
			w->access = (int)e->bind.mw_access_flags;
			w->qp = w->mw.type == IBV_MW_TYPE_2 ? q : NULL;
			/* The new key is live from here; mw->rkey is the program's
			 * (type 1: set by ibv_bind_mw at post time). */
			c->keys[idx].tag = (uint8_t)e->new_rkey;
			st = IBV_WC_SUCCESS;
		}
	}
	pthread_mutex_unlock(&c->lock);
	return st;
}

/* ------------------------------------------------------------- connect -- */

/* Transport retry budget: retry_cnt x 4.096 us x 2^timeout, at least one
 * second (a loaded 2-CPU runner), at most 30 s (timeout 0 = infinite). */
static long transport_ms(struct pqp *q)
{
	double ms;

	if (q->timeout == 0)
		return 30000;
	ms = 0.004096 * (double)(1ull << (q->timeout > 31 ? 31 : q->timeout)) * (q->retry_cnt + 1);
	if (ms < 1000)
		ms = 1000;
	if (ms > 30000)
		ms = 30000;
	return (long)ms;
}

static int connect_once(struct pqp *q, uint32_t dip, uint16_t port, int ms)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = dip, .sin_port = htons(port) };
	struct pollfd p;
	uint32_t sip;
	int fd, err = 0, flags;
	socklen_t el = sizeof(err);

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	/* From our own GID's address, so the peer sees who we claim to be. */
	if (gid_ipv4(&q->sgid, &sip)) {
		struct sockaddr_in src = { .sin_family = AF_INET, .sin_addr.s_addr = sip };

		if (bind(fd, (struct sockaddr *)&src, sizeof(src))) {
			close(fd);
			return -1;
		}
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) && errno != EINPROGRESS) {
		err = errno;
		close(fd);
		errno = err;
		return -1;
	}
	p.fd = fd;
	p.events = POLLOUT;
	if (poll(&p, 1, ms) <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) || err) {
		close(fd);
		errno = err ? err : ETIMEDOUT;
		return -1;
	}
	flags = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
	set_nodelay(fd);
	{
		/* rx wakes up now and then to see whether to give up (rx_abandon). */
		struct timeval tv = { 0, 200 * 1000 };

		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	}
	return fd;
}

/* Say hello on fd and read the answer, which comes once the peer QP is in
 * RTR; give up at the deadline or as soon as this QP leaves RTS.  0 (HS_OK),
 * 1 when the peer closed without answering (its handshake slots were all
 * busy: worth another try), -1 refused or given up. */
static int hello_exchange(struct pqp *q, int fd, const struct hello *h, uint64_t deadline,
			  struct hello_reply *reply)
{
	struct hello_reply r;
	ssize_t n;

	if (send_all(fd, h, sizeof(*h)))
		return -1;
	for (;;) {
		int rc = wait_readable(fd, 100);

		if (rc > 0)
			break;
		if (rc < 0 || now_ms() >= deadline || qstate(q) != IBV_QPS_RTS ||
		    __atomic_load_n(&q->dead, __ATOMIC_ACQUIRE))
			return -1;
	}
	n = recv(fd, &r, sizeof(r), MSG_PEEK | MSG_DONTWAIT);
	if (n == 0 || (n < 0 && errno == ECONNRESET))
		return 1;
	if (recv_q(q, fd, &r, sizeof(r)) || r.magic != HELLO_MAGIC || r.status != HS_OK)
		return -1;
	*reply = r;
	return 0;
}

/* The payload path of this connection: single copy only when offered,
 * granted, and the peer's pid proven (it holds this hello's nonce where it
 * said); else TCP.  The choice and its reason go to q->direct_why. */
static void choose_payload_path(struct pqp *q, const struct hello *h, const struct hello_reply *r)
{
	uint8_t seen[sizeof(h->nonce)];
	struct iovec local = { seen, sizeof(seen) };
	struct iovec remote = { (void *)(uintptr_t)r->nonce_addr, sizeof(seen) };
	char why[sizeof(q->direct_why)];
	int direct = 0;

	if (cfg.payload_tcp)
		snprintf(why, sizeof(why), "tcp: ORBITE_PROVIDER_PAYLOAD=tcp");
	else if (!(h->flags & HELLO_DIRECT))
		snprintf(why, sizeof(why), "tcp: no random nonce to prove the peer's pid with");
	else if (!(r->flags & REPLY_DIRECT))
		snprintf(why, sizeof(why), "tcp: the peer keeps to TCP (its ORBITE_PROVIDER_PAYLOAD)");
	else if (process_vm_readv((pid_t)r->pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof(seen))
		snprintf(why, sizeof(why), "tcp: process_vm_readv of pid %u: %s", r->pid, strerror(errno));
	else if (memcmp(seen, h->nonce, sizeof(seen)))
		snprintf(why, sizeof(why), "tcp: pid %u does not hold this hello's nonce", r->pid);
	else {
		snprintf(why, sizeof(why), "process_vm_readv/writev with pid %u", r->pid);
		direct = 1;
	}
	pthread_mutex_lock(&q->lock);
	q->direct = direct;
	q->peer_pid = direct ? (int)r->pid : 0;
	memcpy(q->direct_why, why, sizeof(why));
	pthread_mutex_unlock(&q->lock);
	if (cfg.payload_log)
		prov_warn("QP %u -> QP %u: payload by %s", q->qp.qp_num, q->dest_qpn, why);
}

/* Connect to the peer QP named by the AV; the fd, or -1 (unreachable). */
static int do_connect(struct pqp *q)
{
	uint64_t deadline = now_ms() + (uint64_t)transport_ms(q);
	struct hello h;
	uint32_t dip;
	int fd, rc;

	if (!gid_ipv4(&q->dgid, &dip))
		return -1; /* only IPv4-mapped GIDs are reachable here */
	memset(&h, 0, sizeof(h));
	h.magic = HELLO_MAGIC;
	h.version = HELLO_VERSION;
	h.rnr_retry = (uint8_t)q->rnr_retry;
	memcpy(h.src_gid, q->sgid.raw, 16);
	memcpy(h.dst_gid, q->dgid.raw, 16);
	h.src_qpn = q->qp.qp_num;
	h.dst_qpn = q->dest_qpn;
	if (!cfg.payload_tcp && getrandom(h.nonce, sizeof(h.nonce), 0) == (ssize_t)sizeof(h.nonce))
		h.flags = HELLO_DIRECT;
	for (;;) {
		struct hello_reply reply;
		uint64_t now = now_ms();

		if (now >= deadline || qstate(q) != IBV_QPS_RTS || __atomic_load_n(&q->dead, __ATOMIC_ACQUIRE))
			return -1;
		fd = connect_once(q, dip, (uint16_t)(q->dest_qpn >> 8), (int)(deadline - now));
		if (fd < 0) {
			if (errno != ECONNREFUSED && errno != EAGAIN && errno != ETIMEDOUT)
				return -1;
		} else {
			rc = hello_exchange(q, fd, &h, deadline, &reply);
			if (rc == 0) {
				choose_payload_path(q, &h, &reply);
				return fd;
			}
			close(fd);
			if (rc < 0)
				return -1;
		}
		usleep(20000); /* nobody listens, or answers, yet: retry, as the transport does */
	}
}

/* ------------------------------------------------------------ requester -- */

enum { TX_OK, TX_LOCAL_ERR, TX_ABORTED, TX_IOERR };

/* Stall hook: wait until the QP leaves RTS (or the hook's time is up). */
static void stall_wait(struct pqp *q)
{
	struct timespec ts;

	abstime_in(&ts, q->stall_ms > 0 ? q->stall_ms : cfg.stall_ms);
	stat_add(q->c, S_STALLS, 1);
	pthread_mutex_lock(&q->lock);
	while (q->qp.state == IBV_QPS_RTS && !q->dead)
		if (pthread_cond_timedwait(&q->cond, &q->lock, &ts))
			break;
	pthread_mutex_unlock(&q->lock);
}

/* Bytes of the next piece: a chunk, cut at the stall point. */
static uint64_t piece_len(struct swqe *e, uint64_t done)
{
	uint64_t n = e->len - done;

	if (n > cfg.chunk)
		n = cfg.chunk;
	if (e->stall_at > done && e->stall_at - done < n)
		n = e->stall_at - done;
	return n;
}

static int acquire_sges(struct pqp *q, struct swqe *e, int access, struct memref *mem)
{
	int i;

	for (i = 0; i < e->num_sge; i++) {
		if (mem_acquire(q->c, q->qp.pd, q, e->sge[i].lkey, e->sge[i].addr, e->sge[i].length,
				access, 0, &mem[i])) {
			while (i--)
				mem_release(q->c, &mem[i]);
			return -1;
		}
	}
	return 0;
}

static void release_sges(struct pqp *q, int n, struct memref *mem)
{
	int i;

	for (i = 0; i < n; i++)
		mem_release(q->c, &mem[i]);
}

static int is_atomic(enum ibv_wr_opcode op)
{
	return op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
}

/* Total length of a WR's scatter list. */
static uint64_t sge_total(const struct swqe *e)
{
	uint64_t len = 0;
	int i;

	for (i = 0; i < e->num_sge; i++)
		len += e->sge[i].length;
	return len;
}

/* An atomic: the header and its operands; the local SGE (8 bytes at least,
 * writable) receives the original value when rx reads the answer. */
static int tx_atomic(struct pqp *q, int fd, struct swqe *e)
{
	struct memref mem[32];
	struct req_hdr h;
	struct atomic_args a = { e->compare_add, e->swap };
	struct iovec iov[2] = { { &h, sizeof(h) }, { &a, sizeof(a) } };

	if (sge_total(e) < 8) {
		e->status = IBV_WC_LOC_LEN_ERR;
		return TX_LOCAL_ERR;
	}
	if (acquire_sges(q, e, IBV_ACCESS_LOCAL_WRITE, mem)) {
		e->status = IBV_WC_LOC_PROT_ERR;
		return TX_LOCAL_ERR;
	}
	release_sges(q, e->num_sge, mem); /* rx checks them again when landing */
	memset(&h, 0, sizeof(h));
	h.op = e->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? OP_CMP_SWP : OP_FETCH_ADD;
	h.rkey = e->rkey;
	h.raddr = e->raddr;
	h.len = 8;
	h.seq = (uint32_t)e->seq;
	return sendv_all(fd, iov, 2) ? TX_IOERR : TX_OK;
}

/* READ and WRITE (not inline) move by single copy when the connection has
 * that path; every other opcode keeps to TCP. */
static int direct_wr(struct pqp *q, const struct swqe *e)
{
	return q->direct && e->len && !(e->send_flags & IBV_SEND_INLINE) &&
	       (e->opcode == IBV_WR_RDMA_READ || e->opcode == IBV_WR_RDMA_WRITE);
}

static int tx_one(struct pqp *q, int fd, struct swqe *e)
{
	struct memref mem[32];
	struct req_hdr h;
	uint64_t done = 0;
	int inl = (e->send_flags & IBV_SEND_INLINE) != 0, hdr = 1;

	if (e->opcode == IBV_WR_BIND_MW || e->opcode == IBV_WR_LOCAL_INV) {
		e->status = local_op(q, e);
		return e->status == IBV_WC_SUCCESS ? TX_OK : TX_LOCAL_ERR;
	}
	if (is_atomic(e->opcode))
		return tx_atomic(q, fd, e);
	/* Local keys first: a bad lkey never puts a request on the wire. */
	if (acquire_sges(q, e, e->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0, mem)) {
		e->status = IBV_WC_LOC_PROT_ERR;
		return TX_LOCAL_ERR;
	}
	memset(&h, 0, sizeof(h));
	switch (e->opcode) {
	case IBV_WR_RDMA_READ:
		h.op = OP_READ;
		break;
	case IBV_WR_RDMA_WRITE:
		h.op = OP_WRITE;
		break;
	case IBV_WR_RDMA_WRITE_WITH_IMM:
		h.op = OP_WRITE_IMM;
		break;
	case IBV_WR_SEND:
		h.op = OP_SEND;
		break;
	case IBV_WR_SEND_WITH_INV:
		h.op = OP_SEND_INV;
		break;
	default:
		h.op = OP_SEND_IMM;
		break;
	}
	h.flags = (e->send_flags & IBV_SEND_SOLICITED) ? REQ_SOLICITED : 0;
	h.rkey = h.op == OP_SEND_INV ? e->inv_rkey : e->rkey;
	h.raddr = e->raddr;
	h.len = e->len;
	h.imm = e->imm;
	h.seq = (uint32_t)e->seq;
	if (direct_wr(q, e)) {
		/* Only the request: rx moves the bytes once the peer granted it. */
		h.flags |= REQ_DIRECT;
		release_sges(q, e->num_sge, mem);
		return send_all(fd, &h, sizeof(h)) ? TX_IOERR : TX_OK;
	}
	if (h.op == OP_READ || e->len == 0 || e->stall_at == 0) {
		if (send_all(fd, &h, sizeof(h))) {
			release_sges(q, e->num_sge, mem);
			return TX_IOERR;
		}
		hdr = 0;
	}
	if (h.op == OP_READ) {
		release_sges(q, e->num_sge, mem); /* rx checks them again when landing */
		return TX_OK;
	}
	while (done < e->len) {
		struct iovec iov[33];
		uint64_t n;
		int cnt;

		if (done == e->stall_at)
			stall_wait(q);
		if (qstate(q) != IBV_QPS_RTS) {
			release_sges(q, e->num_sge, mem);
			return TX_ABORTED; /* moved to ERR (or RESET) part way */
		}
		n = piece_len(e, done);
		/* The header travels with the first piece: one call, one segment less. */
		if (hdr) {
			iov[0].iov_base = &h;
			iov[0].iov_len = sizeof(h);
		}
		if (inl) {
			iov[hdr].iov_base = e->inl + done;
			iov[hdr].iov_len = (size_t)n;
			cnt = 1;
		} else {
			cnt = slice(e->sge, mem, e->num_sge, done, n, iov + hdr, 32);
		}
		cnt += hdr;
		hdr = 0;
		if (sendv_all(fd, iov, cnt)) {
			release_sges(q, e->num_sge, mem);
			return TX_IOERR;
		}
		done += n;
		if (cfg.pace_us)
			usleep((useconds_t)cfg.pace_us);
	}
	release_sges(q, e->num_sge, mem);
	return TX_OK;
}

/* Whether the last WR tx sent is a granted one rx has not finished (tx
 * sends nothing behind it until then). */
static int granted_in_flight(struct pqp *q, uint32_t n)
{
	return q->sq_rx < q->sq_tx && direct_wr(q, &q->sq[(q->sq_tx - 1) % n]);
}

static void *tx_main(void *arg)
{
	struct pqp *q = arg;
	uint32_t n = q->cap.max_send_wr ? q->cap.max_send_wr : 1;
	int fd;

	pthread_mutex_lock(&q->lock);
	while (!q->dead && q->qp.state == IBV_QPS_RTS && q->sq_tx == q->sq_head)
		pthread_cond_wait(&q->txcv, &q->lock);
	if (q->dead || q->qp.state != IBV_QPS_RTS)
		goto out;
	/* Connected on the first WR: with nothing posted a QP never finds out
	 * that its peer is unreachable, as on hardware. */
	pthread_mutex_unlock(&q->lock);
	fd = do_connect(q);
	pthread_mutex_lock(&q->lock);
	if (fd < 0) {
		q->conn_failed = 1;
		if (q->qp.state == IBV_QPS_RTS)
			qp_set_error_locked(q, IBV_WC_RETRY_EXC_ERR);
		goto out;
	}
	q->ofd = fd;
	q->connected = 1;
	qp_wake(q);
	for (;;) {
		struct swqe *e;
		int r, direct;

		while (!q->dead && q->qp.state == IBV_QPS_RTS && q->sq_tx == q->sq_head)
			pthread_cond_wait(&q->txcv, &q->lock);
		if (q->dead || q->qp.state != IBV_QPS_RTS)
			break;
		e = &q->sq[q->sq_tx % n];
		direct = direct_wr(q, e);
		pthread_mutex_unlock(&q->lock);
		r = tx_one(q, fd, e);
		pthread_mutex_lock(&q->lock);
		if (r == TX_OK) {
			e->state = (e->opcode == IBV_WR_BIND_MW || e->opcode == IBV_WR_LOCAL_INV) ?
				   W_LOCAL_DONE : W_SENT;
			q->sq_tx++;
			qp_wake(q);
			/* rx talks on the connection for a granted WR: nothing is
			 * sent until it finished */
			while (direct && !q->dead && q->qp.state == IBV_QPS_RTS && q->sq_rx < q->sq_tx)
				pthread_cond_wait(&q->txcv, &q->lock);
			continue;
		}
		if (r == TX_LOCAL_ERR) {
			/* Completed in order by rx, which then moves the QP to ERR. */
			e->state = W_LOCAL_ERR;
			q->sq_tx++;
			qp_wake(q);
		} else if (r == TX_IOERR && q->qp.state == IBV_QPS_RTS) {
			qp_set_error_locked(q, IBV_WC_RETRY_EXC_ERR);
		}
		break;
	}
out:
	q->tx_stopped = 1;
	/* The peer lands everything sent so far, then sees the end; a granted WR
	 * still moving keeps the connection for rx to report to the end (rx_flush
	 * ends it). */
	if (q->ofd >= 0 && !granted_in_flight(q, n))
		shutdown(q->ofd, SHUT_WR);
	qp_wake(q);
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

enum { RX_OK, RX_NAK, RX_IOERR, RX_ABORTED };

static enum ibv_wc_status nak_status(int s)
{
	switch (s) {
	case R_NAK_ACCESS:
		return IBV_WC_REM_ACCESS_ERR;
	case R_NAK_INV_REQ:
		return IBV_WC_REM_INV_REQ_ERR;
	case R_NAK_RNR:
		return IBV_WC_RNR_RETRY_EXC_ERR;
	default:
		return IBV_WC_REM_OP_ERR;
	}
}

/* The original value of an atomic, into the first 8 bytes of its SGEs. */
static int rx_atomic(struct pqp *q, int fd, struct swqe *e, const struct resp_hdr *h)
{
	struct memref mem[32];
	struct iovec iov[32];
	int cnt;

	if (h->len != 8) {
		e->status = IBV_WC_BAD_RESP_ERR;
		return RX_NAK;
	}
	if (acquire_sges(q, e, IBV_ACCESS_LOCAL_WRITE, mem)) {
		e->status = IBV_WC_LOC_PROT_ERR;
		return discard(fd, 8) ? RX_IOERR : RX_NAK;
	}
	cnt = slice(e->sge, mem, e->num_sge, 0, 8, iov, 32);
	if (recvv_q(q, fd, iov, cnt)) {
		release_sges(q, e->num_sge, mem);
		return RX_IOERR;
	}
	release_sges(q, e->num_sge, mem);
	return RX_OK;
}

/* Whether the peer shut the connection (it sends nothing while a granted
 * WR moves): its QP left RTS, as the TCP path sees at its next chunk. */
static int peer_hung_up(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };

	return poll(&p, 1, 0) != 0;
}

/* Bytes [off, off + n) of e's SGEs to or from the peer's memory at addr + off. */
static int copy_piece(struct pqp *q, struct swqe *e, const struct memref *mem, uint64_t addr,
		      uint64_t off, uint64_t n, int read)
{
	while (n) {
		struct iovec local[32];
		struct iovec remote = { (void *)(uintptr_t)(addr + off), (size_t)n };
		int cnt = slice(e->sge, mem, e->num_sge, off, n, local, 32);
		ssize_t r = read ? process_vm_readv((pid_t)q->peer_pid, local, (unsigned long)cnt, &remote, 1, 0) :
				   process_vm_writev((pid_t)q->peer_pid, local, (unsigned long)cnt, &remote, 1, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1; /* the peer's memory or process went away */
		off += (uint64_t)r;
		n -= (uint64_t)r;
	}
	return 0;
}

/* A message of a granted WR to its responder: op OP_MOVED or OP_DONE. */
static int send_grant_msg(int fd, const struct swqe *e, int op, int flags, uint64_t len)
{
	struct req_hdr d;

	memset(&d, 0, sizeof(d));
	d.op = (uint8_t)op;
	d.flags = (uint8_t)flags;
	d.seq = (uint32_t)e->seq;
	d.len = len;
	return send_all(fd, &d, sizeof(d));
}

static int send_done(int fd, const struct swqe *e, uint64_t moved)
{
	return send_grant_msg(fd, e, OP_DONE, 0, moved);
}

/* Tell the responder a piece moved, so that it counts it as it would have
 * landed (WRITE) or served (READ) it on TCP.  At the stall point the report
 * is acknowledged: the responder's figure is complete before the WR waits,
 * and so before whoever watches the stall moves the QP. */
static int report_piece(struct pqp *q, int fd, const struct swqe *e, uint64_t n, int sync)
{
	struct resp_hdr ack;

	if (send_grant_msg(fd, e, OP_MOVED, sync ? REQ_ACK : 0, n))
		return -1;
	if (!sync)
		return 0;
	if (recv_q(q, fd, &ack, sizeof(ack)))
		return -1;
	return ack.status == R_ACK && ack.op == OP_MOVED && ack.seq == (uint32_t)e->seq ? 0 : -1;
}

/* A granted READ or WRITE: the payload moves between this process's SGEs
 * and the peer's memory at the granted address, piece by piece with the
 * stall point and state checks of the TCP path, each piece reported; then
 * OP_DONE with the bytes moved, and the peer's acknowledgement of a whole
 * transfer. */
static int rx_direct(struct pqp *q, int fd, struct swqe *e, const struct resp_hdr *h)
{
	int read = e->opcode == IBV_WR_RDMA_READ, rc = RX_OK;
	struct memref mem[32];
	struct resp_hdr ack;
	uint64_t addr, done = 0;

	if (recv_q(q, fd, &addr, sizeof(addr)))
		return RX_IOERR;
	if (h->len != e->len) {
		e->status = IBV_WC_BAD_RESP_ERR;
		return RX_NAK;
	}
	if (acquire_sges(q, e, read ? IBV_ACCESS_LOCAL_WRITE : 0, mem)) {
		e->status = IBV_WC_LOC_PROT_ERR; /* the MR went away since the request left */
		return send_done(fd, e, 0) ? RX_IOERR : RX_NAK;
	}
	while (done < e->len) {
		uint64_t n;

		if (done == e->stall_at)
			stall_wait(q);
		if (qstate(q) != IBV_QPS_RTS) {
			rc = RX_ABORTED; /* what landed stays, the rest never will */
			break;
		}
		n = piece_len(e, done);
		if (peer_hung_up(fd) || copy_piece(q, e, mem, addr, done, n, read)) {
			rc = RX_IOERR;
			break;
		}
		done += n;
		if (read)
			stat_add(q->c, S_READ_BYTES_LANDED, n);
		/* Paced between landing and report: a move to ERR then finds the
		 * piece landed but not yet reported, and its report still goes. */
		if (cfg.pace_us)
			usleep((useconds_t)cfg.pace_us);
		if (report_piece(q, fd, e, n, done == e->stall_at)) {
			rc = RX_IOERR;
			break;
		}
	}
	release_sges(q, e->num_sge, mem);
	if (send_done(fd, e, done))
		return RX_IOERR;
	if (rc != RX_OK)
		return rc;
	if (recv_q(q, fd, &ack, sizeof(ack)))
		return RX_IOERR;
	if (ack.seq != (uint32_t)e->seq || ack.status != R_ACK) {
		e->status = ack.status == R_ACK ? IBV_WC_BAD_RESP_ERR : nak_status(ack.status);
		return RX_NAK;
	}
	if (!read)
		stat_add(q->c, S_WRITE_BYTES_SENT, e->len);
	return RX_OK;
}

static int rx_one(struct pqp *q, int fd, struct swqe *e)
{
	struct memref mem[32];
	struct resp_hdr h;
	uint64_t done = 0;

	if (recv_q(q, fd, &h, sizeof(h)))
		return RX_IOERR;
	if (h.seq != (uint32_t)e->seq) {
		e->status = IBV_WC_BAD_RESP_ERR;
		return RX_NAK;
	}
	if (h.status == R_GRANT && direct_wr(q, e))
		return rx_direct(q, fd, e, &h);
	if (h.status != R_ACK) {
		e->status = nak_status(h.status);
		return RX_NAK;
	}
	if (is_atomic(e->opcode))
		return rx_atomic(q, fd, e, &h);
	if (e->opcode != IBV_WR_RDMA_READ) {
		stat_add(q->c, S_WRITE_BYTES_SENT, e->len);
		return RX_OK;
	}
	if (h.len != e->len) {
		e->status = IBV_WC_BAD_RESP_ERR;
		return RX_NAK;
	}
	if (acquire_sges(q, e, IBV_ACCESS_LOCAL_WRITE, mem)) {
		/* The MR went away since the request left. */
		e->status = IBV_WC_LOC_PROT_ERR;
		return discard(fd, e->len) ? RX_IOERR : RX_NAK;
	}
	while (done < e->len) {
		struct iovec iov[32];
		uint64_t n;
		int cnt;

		if (done == e->stall_at)
			stall_wait(q);
		if (qstate(q) != IBV_QPS_RTS) {
			release_sges(q, e->num_sge, mem);
			return RX_ABORTED; /* what landed stays, the rest never will */
		}
		n = piece_len(e, done);
		cnt = slice(e->sge, mem, e->num_sge, done, n, iov, 32);
		if (recvv_q(q, fd, iov, cnt)) {
			release_sges(q, e->num_sge, mem);
			return RX_IOERR;
		}
		done += n;
		stat_add(q->c, S_READ_BYTES_LANDED, n);
		if (cfg.pace_us)
			usleep((useconds_t)cfg.pace_us);
	}
	release_sges(q, e->num_sge, mem);
	return RX_OK;
}

/* After ERR: stop tx, let the peer land and answer what it got, then flush. */
static void rx_flush(struct pqp *q)
{
	struct timespec ts;
	int fd;

	abstime_in(&ts, DRAIN_MS);
	while (q->tx_running && !q->tx_stopped)
		if (pthread_cond_timedwait(&q->cond, &q->lock, &ts)) {
			/* tx is stuck in send() to a peer that does not read. */
			if (q->ofd >= 0)
				shutdown(q->ofd, SHUT_RDWR);
			abstime_in(&ts, DRAIN_MS);
		}
	fd = q->ofd;
	if (fd >= 0) {
		uint64_t deadline = now_ms() + DRAIN_MS;
		uint8_t sink[16384];

		/* tx left it open for a granted WR's last reports: the peer sees the end now. */
		shutdown(fd, SHUT_WR);
		pthread_mutex_unlock(&q->lock);
		for (;;) {
			uint64_t now = now_ms();
			ssize_t r;

			if (now >= deadline || wait_readable(fd, (int)(deadline - now)) <= 0)
				break;
			r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
				break;
		}
		shutdown(fd, SHUT_RDWR);
		pthread_mutex_lock(&q->lock);
	}
	qp_flush_locked(q);
}

static void *rx_main(void *arg)
{
	struct pqp *q = arg;
	uint32_t n = q->cap.max_send_wr ? q->cap.max_send_wr : 1;

	pthread_mutex_lock(&q->lock);
	for (;;) {
		struct swqe *e;
		int r;

		if (q->dead || q->qp.state == IBV_QPS_RESET)
			break;
		if (q->qp.state == IBV_QPS_ERR) {
			/* rx_flush drops the lock: look again before sleeping. */
			if (!q->flushed)
				rx_flush(q);
			else
				pthread_cond_wait(&q->cond, &q->lock);
			continue;
		}
		if (q->sq_rx == q->sq_tx) {
			pthread_cond_wait(&q->cond, &q->lock);
			continue;
		}
		e = &q->sq[q->sq_rx % n];
		if (e->state == W_LOCAL_DONE) {
			complete_send(q, e, IBV_WC_SUCCESS);
			q->sq_rx++;
			continue;
		}
		if (e->state == W_LOCAL_ERR) {
			complete_send(q, e, e->status);
			q->sq_rx++;
			qp_set_error_locked(q, IBV_WC_WR_FLUSH_ERR);
			continue;
		}
		pthread_mutex_unlock(&q->lock);
		r = rx_one(q, q->ofd, e);
		pthread_mutex_lock(&q->lock);
		if (q->direct)
			pthread_cond_broadcast(&q->txcv); /* tx waits for a granted WR to end */
		if (r == RX_OK) {
			complete_send(q, e, IBV_WC_SUCCESS);
			q->sq_rx++;
		} else if (r == RX_NAK) {
			complete_send(q, e, e->status);
			q->sq_rx++;
			qp_set_error_locked(q, IBV_WC_WR_FLUSH_ERR);
		} else if (q->qp.state == IBV_QPS_RTS) {
			/* The peer stopped answering: retries exhausted. */
			complete_send(q, e, IBV_WC_RETRY_EXC_ERR);
			q->sq_rx++;
			qp_set_error_locked(q, IBV_WC_WR_FLUSH_ERR);
		}
		/* RX_ABORTED, or an error after ERR/RESET: the loop decides. */
	}
	q->rx_running = 0;
	qp_wake(q);
	pthread_mutex_unlock(&q->lock);
	return NULL;
}

/* Called with q->lock held, at the move to RTS. */
int qp_start_requester(struct pqp *q)
{
	q->tx_stopped = 0;
	q->connected = 0;
	q->conn_failed = 0;
	q->flushed = 0;
	q->tx_running = 1;
	q->rx_running = 1;
	q->req_threads = 0;
	if (spawn(&q->tx, tx_main, q)) {
		q->tx_running = q->rx_running = 0;
		return -1;
	}
	q->req_threads = 1;
	if (spawn(&q->rx, rx_main, q)) {
		q->rx_running = 0; /* errors flush at once; tx is joined later */
		return -1;
	}
	q->req_threads = 2;
	return 0;
}

void qp_stop_requester(struct pqp *q)
{
	int threads;

	pthread_mutex_lock(&q->lock);
	threads = q->req_threads;
	q->req_threads = 0;
	if (q->ofd >= 0)
		shutdown(q->ofd, SHUT_RDWR);
	qp_wake(q);
	pthread_mutex_unlock(&q->lock);
	if (threads >= 1)
		pthread_join(q->tx, NULL);
	if (threads >= 2)
		pthread_join(q->rx, NULL);
	pthread_mutex_lock(&q->lock);
	q->tx_running = 0;
	q->rx_running = 0;
	q->connected = 0;
	if (q->ofd >= 0)
		close(q->ofd);
	q->ofd = -1;
	pthread_mutex_unlock(&q->lock);
}

/* ------------------------------------------------------------ responder -- */

static int send_resp(int fd, int status, const struct req_hdr *r, uint64_t len)
{
	struct resp_hdr h;

	memset(&h, 0, sizeof(h));
	h.status = (uint8_t)status;
	h.op = r->op;
	h.seq = r->seq;
	h.len = len;
	return send_all(fd, &h, sizeof(h));
}

static int qp_serving(struct pqp *q);

/* take_recv from the QP's SRQ.  The wait is sliced: a QP leaving RTR/RTS
 * does not signal the SRQ's condition.  Taking a WR that leaves fewer than
 * the armed srq_limit fires IBV_EVENT_SRQ_LIMIT_REACHED once (disarmed). */
static int take_srq_recv(struct pqp *q, long wait_ms, struct rwqe *out, struct ibv_sge *sges)
{
	struct psrq *s = q->srq;
	uint64_t end = now_ms() + (uint64_t)wait_ms;
	int ok = 0, fire = 0;

	pthread_mutex_lock(&s->lock);
	while (qp_serving(q) && s->tail == s->head && now_ms() < end) {
		struct timespec ts;

		abstime_in(&ts, 10);
		pthread_cond_timedwait(&s->cond, &s->lock, &ts);
	}
	if (qp_serving(q) && s->tail != s->head) {
		struct rwqe *r = &s->rq[s->tail % s->max_wr];

		*out = *r;
		memcpy(sges, r->sge, sizeof(*sges) * (size_t)r->num_sge);
		out->sge = sges;
		s->tail++;
		ok = 1;
		if (s->limit && s->head - s->tail < s->limit) {
			s->limit = 0;
			fire = 1;
		}
	}
	pthread_mutex_unlock(&s->lock);
	if (fire)
		ctx_async_event(s->c, (uintptr_t)s, IBV_EVENT_SRQ_LIMIT_REACHED);
	return ok ? 0 : -1;
}

/* Take a receive WR for an incoming SEND/WRITE_WITH_IMM, waiting as RNR
 * retries would; 0 and *out, or -1 (RNR retries exhausted or QP left). */
static int take_recv(struct pqp *q, int rnr_retry, struct rwqe *out, struct ibv_sge *sges)
{
	uint32_t n = q->cap.max_recv_wr ? q->cap.max_recv_wr : 1;
	long per = q->min_rnr_timer == 0 ? 655 : 1 + q->min_rnr_timer * q->min_rnr_timer / 2;
	struct timespec ts;
	int ok = 0;

	if (q->srq)
		return take_srq_recv(q, rnr_retry == 7 ? 3600L * 1000 : per * (rnr_retry + 1), out, sges);
	abstime_in(&ts, rnr_retry == 7 ? 3600L * 1000 : per * (rnr_retry + 1));
	pthread_mutex_lock(&q->lock);
	while (!q->dead && (q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS) &&
	       q->rq_tail == q->rq_head)
		if (pthread_cond_timedwait(&q->cond, &q->lock, &ts))
			break;
	if (!q->dead && (q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS) &&
	    q->rq_tail != q->rq_head) {
		struct rwqe *r = &q->rq[q->rq_tail % n];

		*out = *r;
		memcpy(sges, r->sge, sizeof(*sges) * (size_t)r->num_sge);
		out->sge = sges;
		q->rq_tail++;
		ok = 1;
	}
	pthread_mutex_unlock(&q->lock);
	return ok ? 0 : -1;
}

static int qp_serving(struct pqp *q)
{
	int s = qstate(q);

	return (s == IBV_QPS_RTR || s == IBV_QPS_RTS) && !__atomic_load_n(&q->dead, __ATOMIC_ACQUIRE);
}

/* Receive len bytes into a resolved scatter list, chunk by chunk, stopping
 * when the QP leaves RTR/RTS: 0 done, 1 stopped, -1 stream error. */
static int land(struct pqp *q, int fd, const struct ibv_sge *sge, const struct memref *mem,
		int nsge, uint64_t len)
{
	uint64_t done = 0;

	while (done < len) {
		struct iovec iov[32];
		uint64_t n = len - done < cfg.chunk ? len - done : cfg.chunk;
		int cnt = slice(sge, mem, nsge, done, n, iov, 32);
		uint64_t got = 0;
		int rc;

		if (!qp_serving(q))
			return 1;
		rc = recvv_count(NULL, fd, iov, cnt, &got);
		stat_add(q->c, S_WRITE_BYTES_LANDED, got); /* a piece cut short still landed that much */
		if (rc)
			return -1;
		done += n;
	}
	return 0;
}

/* One atomic request: 0 answered, 1 NAK sent (this QP goes to ERR), -1 the
 * connection ended.  A misaligned address is an invalid request, a key or
 * QP without IBV_ACCESS_REMOTE_ATOMIC an access error, as on an RNIC. */
static int serve_atomic(struct pqp *q, int fd, const struct req_hdr *r)
{
	struct atomic_args a;
	struct memref m;
	uint64_t old, val;
	struct resp_hdr h;
	struct iovec iov[2] = { { &h, sizeof(h) }, { &old, sizeof(old) } };

	if (recv_all(fd, &a, sizeof(a)))
		return -1;
	if (r->raddr & 7) {
		send_resp(fd, R_NAK_INV_REQ, r, 0);
		return 1;
	}
	if (!(__atomic_load_n(&q->access, __ATOMIC_ACQUIRE) & IBV_ACCESS_REMOTE_ATOMIC) ||
	    mem_acquire(q->c, q->qp.pd, q, r->rkey, r->raddr, 8, IBV_ACCESS_REMOTE_ATOMIC, 1, &m)) {
		send_resp(fd, R_NAK_ACCESS, r, 0);
		return 1;
	}
	/* Host byte order, as rxe: the memory is a native 64-bit integer. */
	pthread_mutex_lock(&atomic_lock);
	memcpy(&old, m.ptr, sizeof(old));
	val = r->op == OP_CMP_SWP ? (old == a.compare_add ? a.swap : old) : old + a.compare_add;
	memcpy(m.ptr, &val, sizeof(val));
	pthread_mutex_unlock(&atomic_lock);
	mem_release(q->c, &m);
	memset(&h, 0, sizeof(h));
	h.status = R_ACK;
	h.op = r->op;
	h.seq = r->seq;
	h.len = 8;
	return sendv_all(fd, iov, 2) ? -1 : 0;
}

/* The granted WR's reports up to its OP_DONE: each OP_MOVED piece counted
 * as it arrives (acknowledged when asked), the total checked against the
 * OP_DONE.  The bytes moved, or -1 when the connection ended or broke the
 * protocol (what was reported stays counted: it landed). */
static int64_t count_reports(struct pqp *q, int fd, const struct req_hdr *r)
{
	uint64_t moved = 0;

	for (;;) {
		struct req_hdr d;

		if (recv_all(fd, &d, sizeof(d)) || d.seq != r->seq)
			return -1;
		if (d.op == OP_DONE)
			return d.len == moved ? (int64_t)moved : -1;
		if (d.op != OP_MOVED || d.len > r->len - moved)
			return -1;
		moved += d.len;
		stat_add(q->c, r->op == OP_READ ? S_READ_BYTES_SERVED : S_WRITE_BYTES_LANDED, d.len);
		if ((d.flags & REQ_ACK) && send_resp(fd, R_ACK, &d, moved))
			return -1;
	}
}

/* A READ or WRITE the requester moves itself (REQ_DIRECT), its key, range
 * and access checked: grant the range's address, count the requester's
 * reports of the pieces moved until its OP_DONE (the memory held until
 * then), acknowledge a whole transfer.  0 served, -1 the connection ended or
 * broke the protocol. */
static int serve_direct(struct pqp *q, int fd, const struct req_hdr *r, struct memref *m)
{
	uint64_t addr = (uint64_t)(uintptr_t)m->ptr;
	struct resp_hdr h;
	struct iovec iov[2] = { { &h, sizeof(h) }, { &addr, sizeof(addr) } };
	int64_t moved = -1;

	memset(&h, 0, sizeof(h));
	h.status = R_GRANT;
	h.op = r->op;
	h.seq = r->seq;
	h.len = r->len;
	if (sendv_all(fd, iov, 2) == 0)
		moved = count_reports(q, fd, r);
	mem_release(q->c, m);
	if (moved < 0)
		return -1;
	if ((uint64_t)moved < r->len)
		return 0; /* stopped part way: the requester ends the connection */
	return send_resp(fd, R_ACK, r, 0) ? -1 : 0;
}

/* Payload bytes that follow a request header on the connection. */
static uint64_t wire_len(const struct req_hdr *r)
{
	return (r->flags & REQ_DIRECT) ? 0 : r->len;
}

/* Serve one connection; returns when it ends.  1 = a NAK was sent (class C
 * error: this QP is now in ERR and the caller drains the connection). */
static int serve(struct pqp *q, int fd, int rnr_retry)
{
	struct pctx *c = q->c;

	for (;;) {
		struct req_hdr r;
		struct memref m;
		int access, rc;

		if (recv_all(fd, &r, sizeof(r)) || !qp_serving(q))
			return 0;
		switch (r.op) {
		case OP_READ:
			if (!(__atomic_load_n(&q->access, __ATOMIC_ACQUIRE) & IBV_ACCESS_REMOTE_READ) ||
			    mem_acquire(c, q->qp.pd, q, r.rkey, r.raddr, r.len, IBV_ACCESS_REMOTE_READ, 1, &m)) {
				send_resp(fd, R_NAK_ACCESS, &r, 0);
				return 1;
			}
			if (r.flags & REQ_DIRECT) {
				if (serve_direct(q, fd, &r, &m))
					return 0;
				break;
			}
			if (r.len == 0 && send_resp(fd, R_ACK, &r, 0)) {
				mem_release(c, &m);
				return 0;
			}
			for (uint64_t done = 0; done < r.len;) {
				uint64_t n = r.len - done < cfg.chunk ? r.len - done : cfg.chunk;
				struct resp_hdr h;
				struct iovec iov[2];
				int cnt = 0;

				/* The answer's header travels with the first chunk. */
				if (done == 0) {
					memset(&h, 0, sizeof(h));
					h.status = R_ACK;
					h.op = r.op;
					h.seq = r.seq;
					h.len = r.len;
					iov[cnt].iov_base = &h;
					iov[cnt++].iov_len = sizeof(h);
				}
				iov[cnt].iov_base = m.ptr + done;
				iov[cnt++].iov_len = (size_t)n;
				/* Counted before the bytes leave: the requester may complete the
				 * WR and its engine ask this process for the figure before this
				 * thread runs again (taken back if the chunk does not go). */
				stat_add(q->c, S_READ_BYTES_SERVED, n);
				if (!qp_serving(q) || sendv_all(fd, iov, cnt)) {
					stat_add(q->c, S_READ_BYTES_SERVED, -n);
					mem_release(c, &m);
					return 0;
				}
				done += n;
			}
			mem_release(c, &m);
			break;
		case OP_WRITE:
		case OP_WRITE_IMM: {
			struct rwqe rw;
			struct ibv_sge rs[32];
			struct ibv_sge one;

			access = IBV_ACCESS_REMOTE_WRITE;
			if (!(__atomic_load_n(&q->access, __ATOMIC_ACQUIRE) & access) ||
			    mem_acquire(c, q->qp.pd, q, r.rkey, r.raddr, r.len, access, 1, &m)) {
				if (discard(fd, wire_len(&r)) == 0)
					send_resp(fd, R_NAK_ACCESS, &r, 0);
				return 1;
			}
			if (r.op == OP_WRITE && (r.flags & REQ_DIRECT)) {
				if (serve_direct(q, fd, &r, &m))
					return 0;
				break;
			}
			if (r.op == OP_WRITE_IMM && take_recv(q, rnr_retry, &rw, rs)) {
				mem_release(c, &m);
				if (discard(fd, r.len) == 0)
					send_resp(fd, R_NAK_RNR, &r, 0);
				if (!qp_serving(q))
					return 0;
				break;
			}
			one.addr = r.raddr;
			one.length = (uint32_t)r.len;
			one.lkey = r.rkey;
			rc = land(q, fd, &one, &m, 1, r.len);
			mem_release(c, &m);
			if (rc) {
				if (r.op == OP_WRITE_IMM) {
					pthread_mutex_lock(&q->lock);
					complete_recv(q, &rw, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0, 0);
					pthread_mutex_unlock(&q->lock);
				}
				return 0;
			}
			/* Acknowledged before the receive completes (as a SEND below). */
			rc = send_resp(fd, R_ACK, &r, 0);
			if (r.op == OP_WRITE_IMM) {
				pthread_mutex_lock(&q->lock);
				complete_recv(q, &rw, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, r.len, IBV_WC_WITH_IMM,
					      r.imm, r.flags & REQ_SOLICITED);
				pthread_mutex_unlock(&q->lock);
			}
			if (rc)
				return 0;
			break;
		}
		case OP_SEND:
		case OP_SEND_IMM:
		case OP_SEND_INV: {
			struct rwqe rw;
			struct ibv_sge rs[32];
			struct memref mem[32];
			uint64_t cap = 0;
			int i, bad = 0, acked;

			if (take_recv(q, rnr_retry, &rw, rs)) {
				if (discard(fd, r.len) == 0)
					send_resp(fd, R_NAK_RNR, &r, 0);
				if (!qp_serving(q))
					return 0;
				break;
			}
			for (i = 0; i < rw.num_sge; i++) {
				if (mem_acquire(c, q->qp.pd, q, rs[i].lkey, rs[i].addr, rs[i].length,
						IBV_ACCESS_LOCAL_WRITE, 0, &mem[i])) {
					bad = 1;
					break;
				}
				cap += rs[i].length;
			}
			if (bad || cap < r.len) {
				release_sges(q, i, mem);
				pthread_mutex_lock(&q->lock);
				complete_recv(q, &rw, bad ? IBV_WC_LOC_PROT_ERR : IBV_WC_LOC_LEN_ERR,
					      IBV_WC_RECV, 0, 0, 0, 0);
				pthread_mutex_unlock(&q->lock);
				if (discard(fd, r.len) == 0)
					send_resp(fd, R_NAK_INV_REQ, &r, 0);
				return 1;
			}
			rc = land(q, fd, rs, mem, rw.num_sge, r.len);
			release_sges(q, rw.num_sge, mem);
			if (!rc && r.op == OP_SEND_INV && remote_invalidate(q, r.rkey)) {
				/* as rxe: the receive fails, the requester gets the NAK */
				pthread_mutex_lock(&q->lock);
				complete_recv(q, &rw, IBV_WC_REM_INV_REQ_ERR, IBV_WC_RECV, 0, 0, 0, 0);
				pthread_mutex_unlock(&q->lock);
				send_resp(fd, R_NAK_INV_REQ, &r, 0);
				return 1;
			}
			/* Acknowledged as soon as it landed, before its receive completes, as
			 * an HCA acks on receipt: an engine that tears its QP down on its last
			 * receive completion must not take the requester's ACK with it. */
			acked = !rc && send_resp(fd, R_ACK, &r, 0) == 0;
			pthread_mutex_lock(&q->lock);
			if (rc)
				complete_recv(q, &rw, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, 0, 0, 0);
			else
				complete_recv(q, &rw, IBV_WC_SUCCESS, IBV_WC_RECV, r.len, recv_flags(r.op),
					      r.op == OP_SEND_INV ? r.rkey : r.imm, r.flags & REQ_SOLICITED);
			pthread_mutex_unlock(&q->lock);
			if (!acked)
				return 0;
			break;
		}
		case OP_CMP_SWP:
		case OP_FETCH_ADD:
			rc = serve_atomic(q, fd, &r);
			if (rc)
				return rc > 0;
			break;
		default:
			send_resp(fd, R_NAK_OP, &r, 0);
			return 1;
		}
	}
}

/* ------------------------------------------------------------ handshakes -- */

/* The responder never waits on one connection: it polls its listening
 * sockets and every connection in handshake together, each under its own
 * deadline (the whole hello within cfg.hello_ms of accept, then RTR within
 * cfg.accept_ms), so a silent or slow peer delays no other one, and destroy
 * always finds the thread in poll (wakefd) or serving (ifd). */

_Static_assert(sizeof(struct hello) == HELLO_BYTES, "HELLO_BYTES is the hello's size");

#define RTR_TICK_MS 50 /* how often a whole hello looks again at the QP's state */

/* Close a handshake's connection; q->lock held, as qp_stop_all reads the slots. */
static void hs_drop_locked(struct hs_conn *c)
{
	close(c->fd);
	c->fd = -1;
}

static void hs_drop(struct pqp *q, struct hs_conn *c)
{
	pthread_mutex_lock(&q->lock);
	hs_drop_locked(c);
	pthread_mutex_unlock(&q->lock);
}

static void hs_drop_all(struct pqp *q)
{
	int i;

	pthread_mutex_lock(&q->lock);
	for (i = 0; i < MAX_HANDSHAKES; i++)
		if (q->hs[i].fd >= 0)
			hs_drop_locked(&q->hs[i]);
	pthread_mutex_unlock(&q->lock);
}

/* The answer fits the empty send buffer of a fresh socket: never waits. */
static int hs_send(int fd, const struct hello_reply *rep)
{
	return send(fd, rep, sizeof(*rep), MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof(*rep) ? 0 : -1;
}

static int hs_reply(int fd, int status)
{
	struct hello_reply rep = { .magic = HELLO_MAGIC, .status = (uint32_t)status };

	return hs_send(fd, &rep);
}

/* HS_OK, granting the single-copy path when the hello offers it: the
 * nonce kept where the requester can read it (q->lock held). */
static int hs_accept_hello_locked(struct pqp *q, int fd, const struct hello *h)
{
	struct hello_reply rep = { .magic = HELLO_MAGIC, .status = HS_OK };

	if (!cfg.payload_tcp && (h->flags & HELLO_DIRECT)) {
		memcpy(q->peer_nonce, h->nonce, sizeof(q->peer_nonce));
		rep.flags = REPLY_DIRECT;
		rep.pid = (uint32_t)getpid();
		rep.nonce_addr = (uint64_t)(uintptr_t)q->peer_nonce;
	}
	return hs_send(fd, &rep);
}

/* Take every connection waiting on lfd: each into a free slot with the
 * hello's deadline, or closed at once when all slots are busy (the
 * requester behind it retries within its transport budget). */
static void hs_accept(struct pqp *q, int lfd)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC), i;

		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				usleep(10000); /* out of descriptors: poll would spin */
			return;
		}
		pthread_mutex_lock(&q->lock);
		for (i = 0; i < MAX_HANDSHAKES && q->hs[i].fd >= 0; i++)
			;
		if (i == MAX_HANDSHAKES || q->dead) {
			pthread_mutex_unlock(&q->lock);
			close(fd);
			continue;
		}
		q->hs[i].fd = fd;
		q->hs[i].got = 0;
		q->hs[i].deadline = now_ms() + (uint64_t)cfg.hello_ms;
		pthread_mutex_unlock(&q->lock);
		set_nodelay(fd);
	}
}

/* What the hello itself says, before the QP's state matters: HS_OK, the
 * reason to refuse, or -1 for no hello of this provider. */
static int hello_check(struct pqp *q, int fd, const struct hello *h)
{
	struct sockaddr_in local;
	socklen_t ll = sizeof(local);
	union ibv_gid dst;
	uint32_t a;

	if (h->magic != HELLO_MAGIC || h->version != HELLO_VERSION)
		return -1;
	if (h->dst_qpn != q->qp.qp_num)
		return HS_NO_QP;
	/* The GID it dialled must be the address it reached. */
	memcpy(dst.raw, h->dst_gid, 16);
	if (getsockname(fd, (struct sockaddr *)&local, &ll) || !gid_ipv4(&dst, &a) ||
	    a != local.sin_addr.s_addr)
		return HS_NOT_MY_GID;
	return HS_OK;
}

/* In RTR or RTS: is the hello from the peer the QP's AV names (its QPN, its
 * GID, and that GID's address as the socket's source)?  q->lock held. */
static int hello_peer_locked(struct pqp *q, int fd, const struct hello *h)
{
	struct sockaddr_in peer;
	socklen_t pl = sizeof(peer);
	union ibv_gid src;
	uint32_t a;

	memcpy(src.raw, h->src_gid, 16);
	if (h->src_qpn != q->dest_qpn || memcmp(src.raw, q->dgid.raw, 16))
		return HS_WRONG_PEER;
	if (gid_ipv4(&src, &a) && (getpeername(fd, (struct sockaddr *)&peer, &pl) || peer.sin_addr.s_addr != a))
		return HS_WRONG_PEER;
	return HS_OK;
}

/* Read what came of the hello; once whole, check it and give it the RTR
 * deadline.  0 while the handshake goes on, -1 when it was dropped. */
static int hs_read(struct pqp *q, struct hs_conn *c, short revents)
{
	struct hello h;
	ssize_t n;
	int st;

	if (revents & (POLLIN | POLLHUP | POLLERR)) {
		n = recv(c->fd, c->hello + c->got, (size_t)(HELLO_BYTES - c->got), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
			hs_drop(q, c);
			return -1;
		}
		if (n > 0)
			c->got += (int)n;
	}
	if (c->got < HELLO_BYTES) {
		if (now_ms() < c->deadline)
			return 0;
		hs_drop(q, c); /* the whole hello, or nothing, by the deadline */
		return -1;
	}
	memcpy(&h, c->hello, sizeof(h));
	st = hello_check(q, c->fd, &h);
	if (st != HS_OK) {
		if (st > 0)
			hs_reply(c->fd, st);
		hs_drop(q, c);
		return -1;
	}
	c->deadline = now_ms() + (uint64_t)cfg.accept_ms;
	return 0;
}

/* A whole hello: answer it once the QP is in RTR or RTS (a request reaching
 * a QP before RTR is dropped and retried: HS_NOT_READY at the deadline or
 * when the peer gives up).  The fd handed over to ifd, to serve, or -1. */
static int hs_answer(struct pqp *q, struct hs_conn *c, short revents, int *rnr_retry)
{
	struct hello h;
	int st, fd = -1;

	memcpy(&h, c->hello, sizeof(h));
	pthread_mutex_lock(&q->lock);
	if (q->dead)
		st = HS_NOT_READY;
	else if (q->qp.state == IBV_QPS_RTR || q->qp.state == IBV_QPS_RTS)
		st = hello_peer_locked(q, c->fd, &h);
	else if (now_ms() >= c->deadline || (revents & (POLLRDHUP | POLLHUP | POLLERR)))
		st = HS_NOT_READY;
	else {
		pthread_mutex_unlock(&q->lock);
		return -1;
	}
	if (st == HS_OK && hs_accept_hello_locked(q, c->fd, &h) == 0) {
		fd = c->fd;
		c->fd = -1;
		q->ifd = fd; /* published: ERR and destroy shut it down */
		*rnr_retry = h.rnr_retry;
	} else {
		if (st != HS_OK)
			hs_reply(c->fd, st);
		hs_drop_locked(c);
	}
	pthread_mutex_unlock(&q->lock);
	return fd;
}

/* Move one handshake on after poll: the connection to serve, or -1. */
static int hs_step(struct pqp *q, struct hs_conn *c, short revents, int *rnr_retry)
{
	if (c->got < HELLO_BYTES && (hs_read(q, c, revents) || c->got < HELLO_BYTES))
		return -1;
	return hs_answer(q, c, revents, rnr_retry);
}

/* The poll set: listening sockets, wakefd, every handshake (slot[i]: its
 * entry or -1); *timeout until the nearest deadline. */
static nfds_t hs_pollset(struct pqp *q, struct pollfd *p, int *slot, int *timeout)
{
	uint64_t now = now_ms();
	nfds_t n = 0;
	int i;

	*timeout = -1;
	for (i = 0; i < q->nlfd; i++)
		p[n++] = (struct pollfd){ .fd = q->lfd[i], .events = POLLIN };
	p[n++] = (struct pollfd){ .fd = q->wakefd, .events = POLLIN };
	for (i = 0; i < MAX_HANDSHAKES; i++) {
		struct hs_conn *c = &q->hs[i];
		int whole = c->got == HELLO_BYTES, ms;

		slot[i] = -1;
		if (c->fd < 0)
			continue;
		slot[i] = (int)n;
		p[n++] = (struct pollfd){ .fd = c->fd, .events = (short)(whole ? POLLRDHUP : POLLIN | POLLRDHUP) };
		ms = c->deadline > now ? (int)(c->deadline - now) : 0;
		if (whole && ms > RTR_TICK_MS)
			ms = RTR_TICK_MS;
		if (*timeout < 0 || ms < *timeout)
			*timeout = ms;
	}
	return n;
}

/* After a NAK the requester moves to ERR and closes its side: read until
 * then (a close with unread data would reset the NAK away). */
static void drain_until_closed(struct pqp *q, int fd)
{
	uint8_t sink[16384];
	uint64_t deadline = now_ms() + DRAIN_MS;

	while (!__atomic_load_n(&q->dead, __ATOMIC_ACQUIRE) && now_ms() < deadline) {
		ssize_t r;

		if (wait_readable(fd, 100) <= 0)
			continue;
		r = recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
		if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
			break;
	}
}

/* Serve one connection until it ends; a NAK moves the QP to ERR. */
static void serve_connection(struct pqp *q, int fd, int rnr)
{
	int nak = serve(q, fd, rnr);

	pthread_mutex_lock(&q->lock);
	q->ifd = -1;
	if (nak)
		qp_set_error_locked(q, IBV_WC_WR_FLUSH_ERR); /* class C: both QPs */
	pthread_mutex_unlock(&q->lock);
	if (nak)
		drain_until_closed(q, fd);
	close(fd);
}

static void *resp_main(void *arg)
{
	struct pqp *q = arg;
	struct pollfd p[MAX_LISTEN + 1 + MAX_HANDSHAKES];
	int slot[MAX_HANDSHAKES];
	int i;

	while (!__atomic_load_n(&q->dead, __ATOMIC_ACQUIRE)) {
		int fd = -1, rnr = 7, timeout;
		nfds_t n = hs_pollset(q, p, slot, &timeout);

		if (poll(p, n, timeout) < 0 && errno != EINTR)
			break;
		if (__atomic_load_n(&q->dead, __ATOMIC_ACQUIRE))
			break;
		for (i = 0; i < MAX_HANDSHAKES && fd < 0; i++)
			if (q->hs[i].fd >= 0)
				fd = hs_step(q, &q->hs[i], slot[i] >= 0 ? p[slot[i]].revents : 0, &rnr);
		if (fd >= 0) {
			hs_drop_all(q); /* one peer at a time: the others are refused */
			serve_connection(q, fd, rnr);
			continue;
		}
		for (i = 0; i < q->nlfd; i++)
			if (p[i].revents & POLLIN)
				hs_accept(q, q->lfd[i]);
	}
	hs_drop_all(q);
	return NULL;
}

int qp_start_responder(struct pqp *q)
{
	return spawn(&q->resp, resp_main, q) ? -1 : 0;
}

void qp_stop_all(struct pqp *q)
{
	uint64_t one = 1;
	int i;

	pthread_mutex_lock(&q->lock);
	__atomic_store_n(&q->dead, 1, __ATOMIC_RELEASE);
	if (q->ifd >= 0)
		shutdown(q->ifd, SHUT_RDWR);
	if (q->ofd >= 0)
		shutdown(q->ofd, SHUT_RDWR);
	for (i = 0; i < MAX_HANDSHAKES; i++)
		if (q->hs[i].fd >= 0)
			shutdown(q->hs[i].fd, SHUT_RDWR);
	qp_wake(q);
	pthread_mutex_unlock(&q->lock);
	if (write(q->wakefd, &one, sizeof(one)) < 0)
		prov_warn("cannot wake the responder of QP %u", q->qp.qp_num);
	pthread_join(q->resp, NULL);
	qp_stop_requester(q);
}

/* ------------------------------------------------------------ exported -- */

PROV_EXPORT int orbite_provider_qp_payload(struct ibv_qp *qp, char *why, size_t len)
{
	struct pqp *q = (struct pqp *)qp;
	int rc;

	if (!qp)
		return -1;
	pthread_mutex_lock(&q->lock);
	rc = q->connected ? q->direct : -1;
	if (why && len)
		snprintf(why, len, "%s", rc < 0 ? "not connected" : q->direct_why);
	pthread_mutex_unlock(&q->lock);
	return rc;
}

PROV_EXPORT int orbite_provider_qp_stall(struct ibv_qp *qp, uint64_t bytes, long max_ms)
{
	struct pqp *q = (struct pqp *)qp;

	if (!qp)
		return EINVAL;
	pthread_mutex_lock(&q->lock);
	q->stall_next = bytes;
	q->stall_ms = max_ms > 0 ? max_ms : cfg.stall_ms;
	pthread_mutex_unlock(&q->lock);
	return 0;
}

/* Send-queue slots of qp still held: WRs posted whose completion (or, for
 * an unsignaled WR, a later completion of the QP) was not polled yet. */
PROV_EXPORT long orbite_provider_qp_outstanding(struct ibv_qp *qp)
{
	struct pqp *q = (struct pqp *)qp;
	long n;

	if (!qp)
		return -1;
	pthread_mutex_lock(&q->lock);
	n = (long)(q->sq_head - __atomic_load_n(&q->sq_tail, __ATOMIC_SEQ_CST));
	pthread_mutex_unlock(&q->lock);
	return n;
}

PROV_EXPORT int orbite_ibv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
	return qp->context->ops.post_send(qp, wr, bad_wr);
}

PROV_EXPORT int orbite_ibv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
	return qp->context->ops.post_recv(qp, wr, bad_wr);
}

PROV_EXPORT int orbite_ibv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc)
{
	return cq->context->ops.poll_cq(cq, num_entries, wc);
}

PROV_EXPORT int orbite_ibv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return cq->context->ops.req_notify_cq(cq, solicited_only);
}

PROV_EXPORT struct ibv_mw *orbite_ibv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
	return ibv_alloc_mw(pd, type);
}

PROV_EXPORT int orbite_ibv_dealloc_mw(struct ibv_mw *mw)
{
	return ibv_dealloc_mw(mw);
}

PROV_EXPORT int orbite_ibv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *mw_bind)
{
	return ibv_bind_mw(qp, mw, mw_bind);
}

PROV_EXPORT uint32_t orbite_ibv_inc_rkey(uint32_t rkey)
{
	return ibv_inc_rkey(rkey);
}
