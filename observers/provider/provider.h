/* Internal declarations of the OrbiTE loopback verbs provider (a stand-in
 * libibverbs.so.1 that implements RC RDMA in user space over TCP loopback).
 * docs/provider.md describes the model; this header is shared by device.c
 * (sysfs devices, contexts), objects.c (PD/MR/MW/CQ/channel/QP lifetimes and
 * the uverbs destroy commands) and datapath.c (post/poll and the threads that
 * move payload between the two processes). */
#ifndef ORBITE_PROVIDER_H
#define ORBITE_PROVIDER_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "orbite_provider.h"

#define PROV_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------- counters -- */

enum held_kind { H_CTX, H_PD, H_MR, H_MW, H_CQ, H_CHANNEL, H_QP, H_SRQ, H_COUNT };
void held_add(int kind, long delta);

enum stat_kind {
	S_READ_BYTES_LANDED,   /* requester: READ payload written into local MRs */
	S_WRITE_BYTES_SENT,    /* requester: WRITE/SEND payload acknowledged by the peer */
	S_READ_BYTES_SERVED,   /* responder: READ payload sent from local MRs */
	S_WRITE_BYTES_LANDED,  /* responder: WRITE/SEND payload written into local MRs */
	S_WR_COMPLETED,        /* send WRs completed successfully */
	S_WR_FAILED,           /* send WRs completed with an error status */
	S_STALLS,              /* WRs that reached their stall point (test hook) */
	S_COUNT
};
struct pctx;
/* Count for the process and, when c is given, for that context (its device:
 * orbite_provider_ctx_counter). */
void stat_add(struct pctx *c, int kind, uint64_t delta);

/* Diagnostics on stderr, prefixed "orbite provider: ". */
void prov_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Tunables from the environment (read once). */
struct prov_config {
	char root[512];          /* ORBITE_PROVIDER_ROOT, "" for "/" */
	size_t chunk;            /* ORBITE_PROVIDER_CHUNK */
	long pace_us;            /* ORBITE_PROVIDER_PACE_US */
	long stall_skip;         /* ORBITE_PROVIDER_STALL=<skip>:<bytes>, -1 = off */
	uint64_t stall_bytes;
	long stall_ms;           /* ORBITE_PROVIDER_STALL_MS */
	long accept_ms;          /* how long an incoming connection waits for RTR */
	long hello_ms;           /* ORBITE_PROVIDER_HELLO_MS: the whole hello, from accept */
	int payload_tcp;         /* ORBITE_PROVIDER_PAYLOAD=tcp: never the single-copy path */
	int payload_log;         /* ORBITE_PROVIDER_PAYLOAD_LOG=1: each QP's path on stderr */
	int cmd_style;           /* ORBITE_PROVIDER_CMD: 0 ioctl, 1 write, 2 invoke_write */
};
extern struct prov_config cfg;
void config_load(void);

/* -------------------------------------------------------------- devices -- */

#define MAX_PORTS 8

struct pdev {
	struct ibv_device dev;   /* what programs see; first member */
	char sysdir[512];        /* <root>/sys/class/infiniband/<name> */
	int index;               /* position in the sorted list (ibv_get_device_index) */
	int nports;
	int present;             /* seen in the last scan */
};

/* Read "<sysdir>/<rel>" into buf (trailing newline stripped); -1 when absent. */
int sysfs_read(const char *sysdir, const char *rel, char *buf, size_t len);
/* GID of port/index from sysfs; -1 when the slot or file does not exist. */
int dev_gid(struct pdev *d, int port, int index, union ibv_gid *gid);
/* Number of GID slots of a port (files under ports/N/gids). */
int dev_gid_tbl_len(struct pdev *d, int port);
/* IPv4 address (network order) of an IPv4-mapped GID; 0 when not mapped. */
int gid_ipv4(const union ibv_gid *gid, uint32_t *addr);
/* Distinct IPv4 addresses of the device's GIDs (all ports); returns count. */
int dev_ipv4_addrs(struct pdev *d, uint32_t *out, int max);

/* ------------------------------------------------------------- contexts -- */

struct keyent;

struct pctx {
	/* Programs see vctx.context: a verbs_context as rdma-core's providers
	 * hand out, so verbs_get_ctx_op() finds the extended verbs. */
	struct verbs_context vctx;
	struct pdev *dev;
	pthread_mutex_t lock;    /* key table, object lists, use counts */
	pthread_cond_t cond;     /* MR busy counts dropping to zero */
	uint32_t next_handle;
	struct keyent *keys;     /* slot i holds key index i (slot 0 unused) */
	uint32_t nkeys, capkeys, freekey;
	struct pqp **qps;        /* every live QP, for close_device */
	int nqps, capqps;
	struct ppd *pds;         /* singly linked lists of live objects */
	struct pcq *cqs;
	struct pchan *chans;
	struct psrq *srqs;
	int async_wfd;           /* writing end of async_fd */
	int closing;
	uint64_t stats[S_COUNT]; /* what moved through this context (atomic) */
};

/* The provider context of a program's ibv_context (NULL for NULL). */
static inline struct pctx *pctx_of(struct ibv_context *ctx)
{
	return ctx ? (struct pctx *)((char *)ctx - offsetof(struct pctx, vctx.context)) : NULL;
}

uint32_t ctx_new_handle(struct pctx *c);
void ctx_async_event(struct pctx *c, uint64_t element, enum ibv_event_type type);

/* Issue the destroy command of one object on the context's uverbs descriptor,
 * laid out as libibverbs lays it out; 0 when the "kernel" took it, else the
 * errno of the syscall (EIO injected by a seccomp filter, for example). */
int uverbs_destroy(struct ibv_context *ctx, uint16_t object, uint16_t method,
		   uint32_t write_cmd, uint32_t handle, int has_resp);

/* ------------------------------------------------------------ PD, MR, MW -- */

struct ppd {
	struct ibv_pd pd;
	struct ppd *next;
	long usecnt;             /* MRs, MWs and QPs on it (EBUSY on dealloc) */
};

struct pmr {
	struct ibv_mr mr;
	struct pmr *next;
	uint64_t iova;           /* address the keys' users name: addr by default */
	int access;
	long busy;               /* transfers in progress on it (ctx->lock) */
	long mw_bound;           /* MWs bound to it (EBUSY on dereg) */
	int dead;                /* deregistered: no new transfer may start */
};

struct pqp;

struct pmw {
	struct ibv_mw mw;
	int bound;
	struct pmr *mr;          /* bound to this MR */
	uint64_t addr, length;   /* window, in the MR's iova space */
	int access;
	struct pqp *qp;          /* type 2: the QP it is bound through */
};

enum key_kind { KEY_FREE, KEY_MR, KEY_MW };

struct keyent {
	int kind;
	uint8_t tag;             /* low 8 bits of the current key */
	void *obj;
	uint32_t next_free;
};

/* Allocate a key slot for obj; returns the key (index << 8 | tag). */
uint32_t key_alloc(struct pctx *c, int kind, void *obj);
void key_free(struct pctx *c, uint32_t key);

/* A resolved memory reference: host pointer plus the MR that backs it (its
 * busy count is held until mem_release). */
struct memref {
	uint8_t *ptr;
	struct pmr *mr;
};

/* Resolve (key, addr, len) for an access: local (lkey, an MR only) or remote
 * (rkey, MR or MW, through qp for type-2 windows and the PD check).  Needs
 * `access` bits (IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_READ/WRITE, 0 for
 * a local read).  Returns 0 and holds the MR busy, or -1. */
int mem_acquire(struct pctx *c, struct ibv_pd *pd, struct pqp *qp, uint32_t key,
		uint64_t addr, uint64_t len, int access, int remote, struct memref *out);
void mem_release(struct pctx *c, struct memref *m);

/* ------------------------------------------------------------- CQ, chan -- */

struct pchan {
	struct ibv_comp_channel ch;
	struct pchan *next;
	int wfd;                 /* the provider's end; ch.fd is the program's */
};

struct cqe_slot {
	struct ibv_wc wc;
	struct pqp *qp;          /* whose send queue a polled send CQE retires */
	uint64_t sq_seq;
	int is_send;
	int solicited;
};

struct pcq {
	union {                  /* first member: ibv_cq_ex begins as ibv_cq */
		struct ibv_cq cq;
		struct ibv_cq_ex cqx;
	};
	struct pcq *next;
	uint64_t wc_flags;       /* ibv_create_cq_ex: the read_* accessors asked for */
	struct ibv_wc cur;       /* extended poll: the completion being read */
	uint64_t id;             /* carried by completion events */
	pthread_mutex_t lock;
	struct cqe_slot *ring;
	int cap, head, count;
	int armed;               /* 1 any completion, 2 solicited only */
	long usecnt;             /* QPs using it (EBUSY on destroy) */
	uint32_t events_delivered; /* read by ibv_get_cq_event */
	uint64_t overruns;
};

/* Add one completion; fires the channel event when armed. */
void cq_push(struct pcq *cq, const struct cqe_slot *slot);
/* Drop every completion of qp (its destroy or reset). */
void cq_purge_qp(struct pcq *cq, struct pqp *qp);

/* ------------------------------------------------------------------- QP -- */

enum wqe_state { W_POSTED, W_SENT, W_LOCAL_DONE, W_LOCAL_ERR };

struct swqe {
	uint64_t wr_id;
	enum ibv_wr_opcode opcode;
	unsigned int send_flags;
	uint32_t imm;            /* network order, as given */
	uint32_t rkey;
	uint64_t raddr;
	uint64_t compare_add, swap; /* atomics */
	int num_sge;
	struct ibv_sge *sge;     /* max_send_sge entries of qp->sge_pool */
	uint8_t *inl;            /* copy of inline data (max_inline_data) */
	uint64_t len;
	uint64_t stall_at;       /* UINT64_MAX = never */
	/* bind / invalidate */
	struct ibv_mw *mw;
	uint32_t new_rkey;
	struct ibv_mw_bind_info bind;
	uint32_t inv_rkey;
	int state;
	enum ibv_wc_status status;
	uint64_t seq;
};

struct rwqe {
	uint64_t wr_id;
	int num_sge;
	struct ibv_sge *sge;
};

/* Shared receive queue: QPs created with it take their receives here. */
struct psrq {
	struct ibv_srq srq;      /* first member */
	struct psrq *next;
	struct pctx *c;
	pthread_mutex_t lock;
	pthread_cond_t cond;     /* a receive was posted */
	struct rwqe *rq;         /* slot = seq % max_wr */
	struct ibv_sge *sge_pool;
	uint32_t max_wr, max_sge;
	uint64_t head, tail;
	uint32_t limit;          /* armed srq_limit, 0 = not armed */
	long usecnt;             /* QPs using it (ctx->lock; EBUSY on destroy) */
};

/* Allocate a ring of n receive WRs of nsge SGEs each (rq, sge pool). */
int rq_ring_alloc(uint32_t n, uint32_t nsge, struct rwqe **rq, struct ibv_sge **pool);
int dp_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

#define MAX_LISTEN 8
#define MAX_HANDSHAKES ORBITE_PROVIDER_MAX_HANDSHAKES
#define HELLO_BYTES 64 /* sizeof(struct hello), datapath.c */

/* A connection a QP's responder accepted whose hello is not checked yet. */
struct hs_conn {
	int fd;                  /* -1: free slot */
	int got;                 /* bytes of the hello read so far */
	uint64_t deadline;       /* now_ms: the whole hello by then, then RTR by then */
	uint8_t hello[HELLO_BYTES];
};

/* Limits of a QP (ibv_create_qp answers EINVAL beyond them). */
#define MAX_WR 32768
#define MAX_SGE 30
#define MAX_INLINE 512

/* The WRs an extended QP builds between wr_start and wr_complete, handed
 * to the same posting path as ibv_post_send at wr_complete. */
struct xwr {
	struct ibv_send_wr wr;
	struct ibv_sge sge[MAX_SGE];
	uint8_t inl[MAX_INLINE]; /* copied at wr_set_inline_data* */
};

struct xbatch {
	struct xwr *w;
	int n, cap;
	int open;                /* between wr_start and wr_complete/abort */
	int err;                 /* first error a setter found (EINVAL, ENOMEM) */
};

struct pqp {
	union {                  /* first member: ibv_qp_ex begins as ibv_qp */
		struct ibv_qp qp;
		struct ibv_qp_ex qpx;
	};
	int is_ex;               /* created with send_ops_flags (ibv_qp_to_qp_ex) */
	struct xbatch xb;
	struct pctx *c;
	pthread_mutex_t lock;
	pthread_cond_t cond;     /* any change of state, queues, connection */
	pthread_cond_t txcv;     /* new WRs for tx (and every change, via qp_wake) */
	/* attributes */
	int port, access, sgid_index, timeout, retry_cnt, rnr_retry, min_rnr_timer;
	int path_mtu, max_rd_atomic, max_dest_rd_atomic;
	uint32_t sq_psn, rq_psn, dest_qpn;
	union ibv_gid dgid, sgid;
	struct ibv_ah_attr ah;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	/* send queue: seq numbers; slot = seq % max_send_wr */
	struct swqe *sq;
	struct ibv_sge *sge_pool;
	uint8_t *inl_pool;
	uint64_t sq_head;        /* next seq to post */
	uint64_t sq_tx;          /* next to transmit (tx thread) */
	uint64_t sq_rx;          /* next to complete (rx thread) */
	uint64_t sq_tail;        /* retired by polled CQEs (atomic) */
	/* receive queue */
	struct rwqe *rq;
	struct ibv_sge *rsge_pool;
	uint64_t rq_head, rq_tail;
	struct psrq *srq;        /* receives come from it instead (create attr) */
	/* error handling */
	enum ibv_wc_status pending_err; /* given to the first flushed WR */
	int flushed;             /* queues flushed; later posts flush at once */
	/* listening sockets (one per local IPv4 GID address, same port) */
	int lfd[MAX_LISTEN];
	int nlfd;
	uint16_t lport;
	int wakefd;              /* eventfd: wakes the responder on destroy */
	/* outgoing connection (requester role) */
	int ofd;
	int direct;              /* READ/WRITE payload by process_vm_readv/writev (else TCP) */
	char direct_why[96];     /* why that path (orbite_provider_qp_payload) */
	int peer_pid;            /* with direct: the peer's process, proven at the hello */
	uint8_t peer_nonce[16];  /* responder: the nonce of the hello served, its proof of pid */
	int tx_running, rx_running, tx_stopped, connected, conn_failed;
	int req_threads;         /* 0, 1 (tx) or 2 (tx and rx) to join */
	uint64_t err_ms;         /* when it entered ERR (now_ms) */
	pthread_t tx, rx;
	/* incoming connections (responder role): the ones in handshake, then
	 * the one served; each is the QP's, so ERR and destroy reach it */
	struct hs_conn hs[MAX_HANDSHAKES];
	int ifd;
	pthread_t resp;
	int dead;                /* being destroyed */
	/* issue-15 hook: stall the next payload WR after this many bytes */
	uint64_t stall_next;
	long stall_ms;
};

/* Wake every thread of the QP waiting for a change (qp->lock held). */
void qp_wake(struct pqp *q);
/* Move the QP to ERR (qp->lock held); status goes to the first flushed WR. */
void qp_set_error_locked(struct pqp *q, enum ibv_wc_status status);
/* Flush both queues now (qp->lock held, no rx thread running). */
void qp_flush_locked(struct pqp *q);
/* Start the responder thread (at create) and the requester threads (at RTS). */
int qp_start_responder(struct pqp *q);
int qp_start_requester(struct pqp *q);
/* Stop and join the requester threads; closes the outgoing connection. */
void qp_stop_requester(struct pqp *q);
/* Stop and join every thread of the QP (destroy, context close). */
void qp_stop_all(struct pqp *q);

/* Extended QP: the wr_* pointers for send_ops (IBV_QP_EX_WITH_*). */
void qp_ex_init_ops(struct pqp *q, uint64_t send_ops);
void qp_ex_free(struct pqp *q);
struct ibv_qp *obj_create_qp_ex(struct ibv_context *ctx, struct ibv_qp_init_attr_ex *attr);
struct ibv_srq *obj_create_srq_ex(struct ibv_context *ctx, struct ibv_srq_init_attr_ex *attr);

/* data path ops installed in ibv_context.ops */
int dp_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int dp_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);
int dp_poll_cq(struct ibv_cq *cq, int num, struct ibv_wc *wc);
int dp_req_notify_cq(struct ibv_cq *cq, int solicited_only);
/* Take the oldest completion of cq (cq->lock held); 0 when empty, else 1. */
int cq_take_locked(struct pcq *cq, struct ibv_wc *wc);
/* Extended CQ: the start/next/end_poll and read_* pointers for its wc_flags. */
void cq_ex_init_ops(struct pcq *cq);
struct ibv_cq_ex *obj_create_cq_ex(struct ibv_context *ctx, struct ibv_cq_init_attr_ex *attr);
int dev_query_device_ex(struct ibv_context *ctx, const struct ibv_query_device_ex_input *input,
			struct ibv_device_attr_ex *attr, size_t attr_size);
int dp_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *bind);
struct ibv_mw *obj_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type);
int obj_dealloc_mw(struct ibv_mw *mw);

/* Tear down every object of a context (ibv_close_device). */
void objects_close_context(struct pctx *c);

/* time helpers */
uint64_t now_ms(void);
void abstime_in(struct timespec *ts, long ms);

#endif
