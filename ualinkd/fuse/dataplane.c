/* The data plane's fast path: GPU loads and stores of imported memory, in C on both daemons.
 *
 * Appended to the cffi source of _fuse_ll (fuse/_build.py); fuse/dataplane.py is its only
 * user. Why it exists: a 4 KiB remote load through the Python daemons took three process
 * turns of ~150 µs each (FUSE read -> LOAD, LOAD -> DATA, DATA -> FUSE reply), against a
 * floor of one FUSE round trip and one TCP round trip (38 µs on one CPU).
 *
 * What it carries, and what it leaves to Python. Each pair of daemons has a data channel
 * (the fabric link authenticates it; fabric/channels.py hands it here: DataChannels.open), a
 * TCP connection carrying only LOAD, STORE and DATA frames in the link's own encoding
 * (fabric/wire.py). One thread per daemon reads every channel.
 *  - Importer: a FUSE read of a render node whose range a route covers (installed by
 *    Python after it served a load of that mapping itself) is sent as a LOAD on the
 *    exporter's channel straight from the read callback; the thread replies to FUSE
 *    with the DATA (a large one spliced from the channel into /dev/fuse).
 *  - Exporter: a LOAD that an export route covers (installed by Python after it served a
 *    load of that range itself: the BO chunk's bytes, by address) is answered with DATA by
 *    the thread.
 *  - Everything else goes the way it went before, through Python and the link: a read
 *    with no route, a LOAD with no route (answered DP_FALLBACK, so the importer asks
 *    again on the link), any DATA that is not a whole answer, every load of a channel that
 *    goes down; and a load not answered within the link's deadline (its ack_timeout,
 *    ualinkd_dp_set_timeout), handed back marked expired: Python faults it as the link
 *    faults a LOAD it got no answer to in time. Python decides every fault
 *    and every refusal, with its logging: the C code only repeats what Python already
 *    served.
 * Routes are caches. ualinkd_dp_flush() drops them all (amdgpu/translation.py calls it
 * whenever a GPU VM, an NPA mapping, an importer set, an accel's state or a BO's memory
 * changes), under the lock the thread holds while it copies a BO's bytes, so after a flush
 * no byte is read through an old route and a freed BO is never touched.
 */
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/sendfile.h>
#include <netinet/in.h>

#define DP_CHANNELS 64            /* peers of one node (a 64-node pod has 63) */
#define DP_ACCELS 1024            /* accel ids are 10 bits (ualink/npa.py GPUID_MASK) */
/* The largest load the fast path carries: the link's largest (fabric/agent.py CHUNK) and
   the largest FUSE read (max_pages 256). At 64 KiB, every 1 MiB load went through both
   daemons' Python: 600 µs, 0.4 of a C TCP stream. */
#define DP_FAST_MAX (1u << 20)
#define DP_INFLIGHT 64            /* loads outstanding on one channel */
#define DP_INFLIGHT_BYTES (4u << 20)  /* the answers they ask for: what the socket buffers hold */
#define DP_OUT_MAX (8u << 20)     /* bytes queued for a peer that does not read: dropped */
#define DP_TIMEOUT_NS 2000000000LL  /* until ualinkd_dp_set_timeout: the link's default */
/* The thread's longest sleep: it wakes for its channels, for Python (wakefd) and for the
   next load's deadline; with no load out, once a second (it was 10 times, in every daemon of
   an idle pod). A load sent with a shorter deadline than this wakes it to sleep less. */
#define DP_IDLE_NS 1000000000LL
#define DP_IMPORT_ROUTES 64
/* Export routes: one per BO chunk (64 KiB), so 4096 keep a 256 MiB working set of every
   importer's loads; found through buckets of 64 KiB of NPA space (a route covers at most
   two), each holding the routes last put in it (small BOs: several share a bucket). With
   256 routes in one list, a working set past 16 MiB missed on every LOAD: each went to
   Python after a wasted round trip, slower than the link alone. */
#define DP_EXPORT_ROUTES 4096
#define DP_EBUCKET_BITS 13
#define DP_EBUCKET_WAYS 4
#define DP_FALLBACK (-EAGAIN)     /* DATA status: not served here, ask on the link */
#define DP_EVENTS 32

#define DP_LOAD 0x20              /* fabric/wire.py FrameType */
#define DP_STORE 0x21
#define DP_DATA 0x22
#define DP_LOAD_SIZE 29           /* <IBIHHQII: length, type, seq, src, dst, npa, length, deadline */
#define DP_STORE_HEAD 25          /* <IBIHHQI: length, type, seq, src, dst, npa, deadline; data */
#define DP_DATA_HEAD 13           /* <IBIi: length, type, seq, status */
/* A channel's receive buffer starts this big and grows to one whole DATA when one comes
   (a spliced answer never enters it); an idle channel's shrinks back (dp_expire). */
#define DP_IN_START (64 * 1024)
/* A DATA goes out as one sendmsg of its head and its pieces, straight from the routes'
   memory (no copy through a frame buffer). A load of DP_FAST_MAX finds at most about 90
   pieces (a bucket keeps 4 routes of its 64 KiB); one of more is Python's to answer. */
#define DP_IOV 128
#define DP_ZEROS (64 * 1024)      /* a chunk never written is sent from here, in pieces */
/* An answer this big to a load of ours is spliced from the channel into a pipe and from the
   pipe into /dev/fuse: the kernel's one copy, into the caller's buffer, where a recv into
   memory and a write to /dev/fuse were two (a 1 MiB load: 660 µs on one CPU, against 275 µs
   for a C TCP stream's two copies). Smaller ones are not worth the pipe's three calls. */
#define DP_SPLICE_MIN (128 * 1024)
/* The pipe: its slots, not its bytes, are what fills. Loopback TCP's pieces are 32 KiB page
   fragments (a 1 MiB answer takes some 40); a NIC's GRO or a fragmented memory hands over
   pieces of a page or less, more than a 1 MiB pipe's 256 slots (2 MiB needs
   CAP_SYS_RESOURCE). Such answers go to memory (dp_splice_to_memory); a channel whose
   answers do so DP_SPLICE_MISSES times in a row stops splicing for its next DP_SPLICE_PAUSE
   large answers, which take the memory path at once (the pipe's extra calls bought
   nothing). */
#define DP_PIPE_SIZE (2u << 20)
#define DP_SPLICE_STALLS 16       /* splices that move nothing while bytes wait: pipe full */
#define DP_SPLICE_MISSES 2
#define DP_SPLICE_PAUSE 256
/* A STORE whose bytes still to come are this many or more is received straight into the
   BO's chunks, once they are all in the socket (dp_store_direct): one copy, where a
   receive into `in` and a copy into the chunks were two. */
#define DP_DIRECT_MIN (64 * 1024)
/* ... waiting at most this long for them all to be in the socket (a TCP receive buffer
   that cannot grow to hold them, memory pressure): then they go through `in`. */
#define DP_DIRECT_WAIT_NS 20000000LL
#define DP_CLOCK_MOD 4294967296LL  /* fabric/session.py CLOCK_MOD: link clocks in ms */
#define DP_ANSWER_MARGIN_MS 500   /* fabric/session.py ANSWER_MARGIN */
/* A carried store this big keeps libfuse's request buffer (dp_try_store); a smaller one is
   copied: the buffer is as big as the largest write, and the next receive allocates it
   anew. */
#define DP_STEAL_MIN (64 * 1024)
/* A store is read, not spliced, from /dev/fuse (measured 2026-12-06, issue 34): a 1 MiB
   write's request is 1 MiB + 80 bytes, 257 pipe pages, and a pipe past pipe-max-size
   (1 MiB) needs CAP_SYS_RESOURCE, which containers drop: the kernel fails a request the
   pipe cannot hold (EIO to the writer) and libfuse reads instead. Nor would it pay where
   it can: bytes copied into fresh pipe pages (fuse_dev_splice_read allocates each) and
   spliced into loopback TCP took 445-516 us per MiB against 384-436 us copied into a
   warm buffer and sent (one CPU, 3 x 3,000). */
/* A stolen buffer, once its store is answered, is kept (up to DP_SPARES of them) and given
   to libfuse in place of the next one a store steals: with none, libfuse's next receive
   allocated a fresh 1 MiB whose pages the kernel then faulted in, zeroed and charged one
   by one while it copied the next write into them, and the old one was unmapped (perf: a
   quarter of the trio thread's time in a 1 MiB store). An idle thread frees them
   (dp_expire, as it shrinks `in`). */
#define DP_SPARES 2

enum { DP_FREE, DP_OPEN, DP_BROKEN, DP_CLOSING };

struct dp_pending {
    fuse_req_t req;
    uint64_t fh, off, unique;
    fuse_ino_t ino;
    uint32_t seq, size;
    int64_t started;
    int used;
    char *data;                               /* a store's bytes (NULL: a load), kept for
                                                 Python should it have to store them itself */
    void *block;                              /* what holds them, freed with them */
    size_t stolen;                            /* block is a libfuse buffer of this many
                                                 usable bytes (0: a malloc of the store's) */
    char *dest;                               /* a GPU engine's load (ualinkd_dp_load_into):
                                                 where its bytes go (NULL: a FUSE request's) */
    uint64_t token;                           /* ... and what its outcome is posted as */
};

struct dp_channel {
    int state, fd, want_out;
    uint32_t gen, next_seq;
    pthread_mutex_t lock;                     /* out, pending */
    struct dp_pending pend[DP_INFLIGHT];
    int npend;
    uint32_t inflight_bytes;
    char *out;
    size_t out_len, out_cap;
    char *in;                                 /* the thread's */
    size_t in_len, in_cap;
    int64_t in_used;                          /* when it last received into a grown `in` */
    int big;                                  /* loads pending of DP_SPLICE_MIN or more:
                                                 their answers' heads are read alone */
    uint32_t spl_seq, spl_size, spl_left;     /* the answer being spliced (spl_left > 0) */
    int spl_stalls;                           /* splices in a row that moved nothing */
    int spl_misses, spl_pause;                /* answers in a row the pipe failed; large
                                                 answers left before it is tried again */
    int nodirect;                             /* the STORE in front is received into `in` */
    int tcp;                                  /* a TCP socket (SO_RCVLOWAT grows its buffer) */
    int64_t direct_since;                     /* waiting for a STORE's bytes since (0: not) */
    int lowat_raised;                         /* SO_RCVLOWAT raised for them (1 again after) */
    /* The link's clocks (fabric/session.py), for STORE deadlines: our link clock's zero
       (CLOCK_MONOTONIC ns; 0: not known, no STORE of the peer's is found late), and the
       peer's clock from its last PING (its ms, our ns on receipt; peer_at 0: none yet, our
       STOREs carry no deadline). */
    int64_t clk_origin, peer_at;
    uint32_t peer_ms;
    char why[160];
    uint8_t accels[DP_ACCELS / 8];            /* the peer's accels */
    int engine;                               /* engine loads pending: their answers' heads
                                                 are read alone (dp_direct_begin) */
    char *dr_dest;                            /* the engine answer being received straight
                                                 into its destination (NULL: its load
                                                 expired meanwhile, the rest is dropped) */
    uint32_t dr_seq, dr_size, dr_left;        /* ... its load, size and bytes still to come */
};

#define DP_READ 1                 /* an import route's permissions: what Python served */
#define DP_WRITE 2
struct dp_import_route {
    uint64_t fh, va_start, va_end, npa_start;
    uint64_t gen;
    uint16_t src, dst;
    int used, perm;
};

struct dp_export_route {
    uint64_t npa_start, fd_off;
    const char *mem;                          /* NULL: in `fd` at fd_off, or zeros (fd < 0) */
    int fd;
    uint32_t len;
    uint64_t gen;
    uint16_t src, dst;
    int used;
};

/* expired: no answer came within the deadline (Python faults it), else Python serves it;
   data: a store's bytes, NULL for a load, in `block` (malloc'd: Python frees it). */
struct dp_fallback { fuse_req_t req; fuse_ino_t ino; uint64_t size, off, fh, unique; int expired;
                     char *data; void *block; };
struct dp_event { int handle; char why[160]; };
/* An engine load's outcome: 0 (its bytes are at its destination), DP_FALLBACK (not carried:
   Python loads it through the link), -ETIME (no answer within the deadline: the link's
   fault) or -errno (the data plane stopped). */
struct dp_loaded { uint64_t token; int32_t status; };

struct ualinkd_dp {
    int epfd, wakefd, notifyfd, running, stop;
    int64_t timeout_ns;                       /* a load's deadline after it is sent */
    pthread_t thread;
    pthread_mutex_t lock;                     /* routes, gen, channel states, queues */
    uint64_t gen;                             /* a route of another gen is gone: 64 bits, so
                                                 it never comes round again (32 bits did,
                                                 after 2^32 flushes: a freed chunk's route) */
    struct dp_channel ch[DP_CHANNELS];
    int16_t accel_chan[DP_ACCELS];
    struct dp_import_route iroute[DP_IMPORT_ROUTES];
    struct dp_export_route eroute[DP_EXPORT_ROUTES];
    int16_t ebucket[1 << DP_EBUCKET_BITS][DP_EBUCKET_WAYS];  /* eroute indexes, -1: none */
    unsigned inext, enext;
    struct dp_fallback *fb;
    size_t nfb, capfb;
    struct dp_event ev[DP_EVENTS];
    unsigned nev, lost_events;
    struct iovec iov[DP_IOV];                 /* the thread's DATA being sent */
    int fuse_fd;                              /* where spliced replies go; -1: none */
    int spl_r, spl_w, spl_chan, spl_refused;  /* the thread's pipe, and whose answer it holds */
    char *scratch;                            /* its bytes read from memfds (DP_FAST_MAX) */
    pthread_mutex_t spare_lock;               /* the spares (taken alone: no lock inside) */
    void *spare[DP_SPARES];                   /* stolen buffers free again */
    size_t spare_size[DP_SPARES];             /* their usable bytes */
    int nspare;
    int64_t spare_used;                       /* when one was last put back or taken */
    uint64_t reused_buffers;                  /* stores that gave libfuse a kept one */
    /* counters: loads this node sent fast and got answered fast; LOADs it served fast;
       loads handed back to Python; LOADs answered DP_FALLBACK; fast loads spliced; the same
       for stores: fast, served, refused (their fallbacks are counted with the loads') */
    uint64_t fast_loads, served, fallbacks, refused, spliced;
    uint64_t fast_stores, served_stores, refused_stores, late_stores;
    /* Engine loads' outcomes not yet taken, and the room kept for them: one entry per load
       issued and not yet taken, reserved when it is issued (posting one never allocates). */
    struct dp_loaded *ld;
    size_t nld, ld_reserved, capld;
    uint64_t engine_loads, engine_fallbacks;  /* carried whole; handed back (any reason) */
};

static int64_t dp_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void dp_put32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static uint32_t dp_get32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint16_t dp_get16(const char *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint64_t dp_get64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void dp_wake(int fd)
{
    uint64_t one = 1;
    ssize_t n = write(fd, &one, sizeof(one));
    (void)n;  /* a full eventfd is already readable */
}

/* [dp->lock held] */
static void dp_event(struct ualinkd_dp *dp, int handle, const char *why)
{
    if (dp->nev < DP_EVENTS) {
        dp->ev[dp->nev].handle = handle;
        snprintf(dp->ev[dp->nev].why, sizeof(dp->ev[0].why), "%s", why);
        dp->nev++;
    } else {
        dp->lost_events++;
    }
    dp_wake(dp->notifyfd);
}

static void dp_engine_post(struct ualinkd_dp *dp, uint64_t token, int32_t status);

/* A load Python serves after all, or faults (`expired`); an engine load's outcome is posted
   instead (ualinkd_dp_take_loaded). [dp->lock held] */
static void dp_fall_back(struct ualinkd_dp *dp, const struct dp_pending *p, int expired)
{
    if (p->dest != NULL) {  /* an engine load: its Python side falls back, or faults */
        dp->engine_fallbacks++;
        dp_engine_post(dp, p->token, expired ? -ETIME : DP_FALLBACK);
        return;
    }
    if (dp->nfb == dp->capfb) {
        size_t cap = dp->capfb ? dp->capfb * 2 : 64;
        struct dp_fallback *fb = realloc(dp->fb, cap * sizeof(*fb));
        if (fb == NULL) {
            fuse_reply_err(p->req, EIO);  /* no memory to hand it over: fail it, loudly */
            free(p->block);
            dp->lost_events++;
            return;
        }
        dp->fb = fb;
        dp->capfb = cap;
    }
    dp->fb[dp->nfb].req = p->req;
    dp->fb[dp->nfb].ino = p->ino;
    dp->fb[dp->nfb].size = p->size;
    dp->fb[dp->nfb].off = p->off;
    dp->fb[dp->nfb].fh = p->fh;
    dp->fb[dp->nfb].unique = p->unique;
    dp->fb[dp->nfb].expired = expired;
    dp->fb[dp->nfb].data = p->data;
    dp->fb[dp->nfb].block = p->block;
    dp->nfb++;
    dp->fallbacks++;
    dp_wake(dp->notifyfd);
}

/* The channel cannot be used any more: the thread closes it (dp_reap). [ch->lock held] */
static void dp_break(struct ualinkd_dp *dp, struct dp_channel *ch, const char *why)
{
    if (ch->state != DP_OPEN)
        return;
    ch->state = DP_BROKEN;
    snprintf(ch->why, sizeof(ch->why), "%s", why);
    shutdown(ch->fd, SHUT_RDWR);
    dp_wake(dp->wakefd);
}

/* A channel holds no load, no bytes in or out. [ch->lock held, or the thread stopped] */
static void dp_channel_clear(struct dp_channel *ch)
{
    ch->npend = 0;
    ch->inflight_bytes = 0;
    ch->out_len = ch->in_len = 0;
    ch->want_out = 0;
    __atomic_store_n(&ch->big, 0, __ATOMIC_RELAXED);
    ch->spl_left = 0;
    ch->spl_misses = ch->spl_pause = 0;
    ch->nodirect = 0;
    ch->direct_since = 0;
    ch->lowat_raised = 0;
    __atomic_store_n(&ch->engine, 0, __ATOMIC_RELAXED);
    ch->dr_left = 0;
}

/* Load `p` is no longer pending (answered, expired, or handed to Python). [ch->lock held] */
static void dp_unpend(struct dp_channel *ch, struct dp_pending *p)
{
    p->used = 0;
    ch->npend--;
    ch->inflight_bytes -= p->size;
    if (p->data == NULL && p->size >= DP_SPLICE_MIN)
        __atomic_sub_fetch(&ch->big, 1, __ATOMIC_RELAXED);
    if (p->dest != NULL)
        __atomic_sub_fetch(&ch->engine, 1, __ATOMIC_RELAXED);
}

/* No load of ours goes to channel `c` any more. [dp->lock held] */
static void dp_unroute_channel(struct ualinkd_dp *dp, int c)
{
    for (int a = 0; a < DP_ACCELS; a++)
        if (dp->accel_chan[a] == c)
            dp->accel_chan[a] = -1;
}

/* A store's bytes are no longer needed: a libfuse buffer it stole (`stolen` usable bytes)
   is kept for the next store to give libfuse in its place (DP_SPARES), anything else
   freed. [any thread; takes dp->spare_lock] */
static void dp_block_done(struct ualinkd_dp *dp, void *block, size_t stolen)
{
    if (block != NULL && stolen) {
        pthread_mutex_lock(&dp->spare_lock);
        if (dp->nspare < DP_SPARES) {
            dp->spare[dp->nspare] = block;
            dp->spare_size[dp->nspare++] = stolen;
            dp->spare_used = dp_now();
            block = NULL;
        }
        pthread_mutex_unlock(&dp->spare_lock);
    }
    free(block);
}

/* A kept buffer of at least `size` usable bytes (libfuse reads a request of up to its own
   buffer size into it: the size of the one stolen), or NULL. [takes dp->spare_lock] */
static void *dp_spare(struct ualinkd_dp *dp, size_t size)
{
    void *block = NULL;

    pthread_mutex_lock(&dp->spare_lock);
    for (int i = 0; i < dp->nspare; i++)
        if (dp->spare_size[i] >= size) {
            block = dp->spare[i];
            dp->spare[i] = dp->spare[dp->nspare - 1];
            dp->spare_size[i] = dp->spare_size[dp->nspare - 1];
            dp->nspare--;
            dp->spare_used = dp_now();
            dp->reused_buffers++;
            break;
        }
    pthread_mutex_unlock(&dp->spare_lock);
    return block;
}

/* The kept buffers go (idle since `before`, or the data plane ending: before 0 = all). */
static void dp_spares_free(struct ualinkd_dp *dp, int64_t before)
{
    pthread_mutex_lock(&dp->spare_lock);
    if (before == 0 || dp->spare_used < before) {
        while (dp->nspare > 0)
            free(dp->spare[--dp->nspare]);
    }
    pthread_mutex_unlock(&dp->spare_lock);
}

static char dp_zeros[DP_ZEROS];

/* Queue the bytes of `iov` for the peer, writing what the socket takes now; what it does
   not take is copied (the caller's pieces may be gone once it lets go of its locks).
   [ch->lock held] */
static int dp_sendv(struct ualinkd_dp *dp, struct dp_channel *ch, const struct iovec *iov,
                    int niov)
{
    size_t n = 0, k = 0, rest;
    char why[96];

    if (ch->state != DP_OPEN)
        return -1;
    for (int i = 0; i < niov; i++)
        n += iov[i].iov_len;
    if (ch->out_len == 0) {
        struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)niov };
        ssize_t sent = sendmsg(ch->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (sent == (ssize_t)n)
            return 0;
        if (sent < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                snprintf(why, sizeof(why), "send failed: %s", strerror(errno));
                dp_break(dp, ch, why);
                return -1;
            }
            sent = 0;
        }
        k = (size_t)sent;
    }
    rest = n - k;
    if (ch->out_len + rest > DP_OUT_MAX) {
        dp_break(dp, ch, "the peer does not take its answers (8 MiB queued)");
        return -1;
    }
    if (ch->out_len + rest > ch->out_cap) {
        size_t cap = ch->out_cap ? ch->out_cap : 65536;
        char *out;
        while (cap < ch->out_len + rest)
            cap *= 2;
        out = realloc(ch->out, cap);
        if (out == NULL) {
            dp_break(dp, ch, "out of memory");
            return -1;
        }
        ch->out = out;
        ch->out_cap = cap;
    }
    for (int i = 0; i < niov; i++) {  /* past the k bytes sent, each piece's rest */
        size_t len = iov[i].iov_len;
        if (k >= len) {
            k -= len;
            continue;
        }
        memcpy(ch->out + ch->out_len, (const char *)iov[i].iov_base + k, len - k);
        ch->out_len += len - k;
        k = 0;
    }
    if (!ch->want_out) {
        struct epoll_event ev = { EPOLLIN | EPOLLOUT, { .u32 = (uint32_t)(ch - dp->ch) } };
        ch->want_out = 1;
        epoll_ctl(dp->epfd, EPOLL_CTL_MOD, ch->fd, &ev);
    }
    return 0;
}

static int dp_send(struct ualinkd_dp *dp, struct dp_channel *ch, const char *buf, size_t n)
{
    struct iovec iov = { (void *)buf, n };
    return dp_sendv(dp, ch, &iov, 1);
}

/* The socket has room again. [thread; takes ch->lock] */
static void dp_flush_out(struct ualinkd_dp *dp, struct dp_channel *ch)
{
    pthread_mutex_lock(&ch->lock);
    if (ch->state == DP_OPEN && ch->out_len) {
        ssize_t k = send(ch->fd, ch->out, ch->out_len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
            memmove(ch->out, ch->out + k, ch->out_len - (size_t)k);
            ch->out_len -= (size_t)k;
        } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            char why[96];
            snprintf(why, sizeof(why), "send failed: %s", strerror(errno));
            dp_break(dp, ch, why);
        }
    }
    if (!ch->out_len && ch->out_cap > 65536) {  /* a backlog's memory goes with it */
        free(ch->out);
        ch->out = NULL;
        ch->out_cap = 0;
    }
    if (ch->state == DP_OPEN && !ch->out_len && ch->want_out) {
        struct epoll_event ev = { EPOLLIN, { .u32 = (uint32_t)(ch - dp->ch) } };
        ch->want_out = 0;
        epoll_ctl(dp->epfd, EPOLL_CTL_MOD, ch->fd, &ev);
    }
    pthread_mutex_unlock(&ch->lock);
}

/* The thread drops the channel (dp_break, taking its lock). [thread] */
static void dp_drop(struct ualinkd_dp *dp, struct dp_channel *ch, const char *why)
{
    pthread_mutex_lock(&ch->lock);
    dp_break(dp, ch, why);
    pthread_mutex_unlock(&ch->lock);
}

/* A read of the channel (recv or splice) returned `k`: 0, the peer closed it; else errno
   says why it failed. The channel is dropped. [thread] */
static void dp_read_failed(struct ualinkd_dp *dp, struct dp_channel *ch, ssize_t k)
{
    char why[96];

    snprintf(why, sizeof(why), k == 0 ? "the peer closed it" : "receive failed: %s",
             k == 0 ? "" : strerror(errno));
    dp_drop(dp, ch, why);
}

/* The channel's receive buffer holds at least `need` bytes: 0, or -1 (out of memory, and
   the buffer as it was). [thread] */
static int dp_in_reserve(struct dp_channel *ch, size_t need)
{
    char *in;

    if (need <= ch->in_cap)
        return 0;
    if ((in = realloc(ch->in, need)) == NULL)
        return -1;
    ch->in = in;
    ch->in_cap = need;
    return 0;
}

/* The bucket of NPA byte `at`'s 64 KiB for LOADs from accel `src` at our accel `dst`. */
static int16_t *dp_ebucket(struct ualinkd_dp *dp, uint16_t src, uint16_t dst, uint64_t at)
{
    uint64_t x = (at >> 16) ^ ((uint64_t)src << 48) ^ ((uint64_t)dst << 32);

    x *= 0x9E3779B97F4A7C15ull;
    return dp->ebucket[x >> (64 - DP_EBUCKET_BITS)];
}

/* The current export route that holds NPA byte `at` for src -> dst, or NULL. A bucket's
   entries are hints (a route slot reused, another key hashed there): each is checked.
   [dp->lock held] */
static struct dp_export_route *dp_eroute_find(struct ualinkd_dp *dp, uint16_t src,
                                              uint16_t dst, uint64_t at)
{
    int16_t *b = dp_ebucket(dp, src, dst, at);

    for (int j = 0; j < DP_EBUCKET_WAYS; j++) {
        struct dp_export_route *q;
        if (b[j] < 0)
            continue;
        q = &dp->eroute[b[j]];
        if (q->used && q->gen == dp->gen && q->src == src && q->dst == dst
                && at >= q->npa_start && at - q->npa_start < q->len)
            return q;
    }
    return NULL;
}

/* Route `r` goes first in the bucket of NPA byte `at`. [dp->lock held] */
static void dp_ebucket_put(struct ualinkd_dp *dp, struct dp_export_route *r, uint64_t at)
{
    int16_t *b = dp_ebucket(dp, r->src, r->dst, at);
    int16_t i = (int16_t)(r - dp->eroute);
    int j = 0;

    while (j < DP_EBUCKET_WAYS - 1 && b[j] != i)
        j++;
    for (; j > 0; j--)
        b[j] = b[j - 1];
    b[0] = i;
}

static int dp_serve_files(struct ualinkd_dp *dp, struct dp_channel *ch, uint32_t seq,
                          uint16_t src, uint16_t dst, uint64_t npa, uint32_t length);

/* A LOAD from the peer: DATA with the bytes when an export route covers it, else
   DP_FALLBACK. [thread] */
static void dp_serve(struct ualinkd_dp *dp, struct dp_channel *ch, const char *f)
{
    uint32_t seq = dp_get32(f + 5), length = dp_get32(f + 21);
    uint16_t src = dp_get16(f + 9), dst = dp_get16(f + 11);
    uint64_t npa = dp_get64(f + 13);
    int32_t status = DP_FALLBACK;
    char head[DP_DATA_HEAD];
    struct iovec *iov = dp->iov;
    int niov = 1;

    pthread_mutex_lock(&dp->lock);
    /* A LOAD claims its source accel: only the peer's own accels' routes answer it. Its
       range may span routes (BO chunks): piece by piece, each a route's. */
    if (src < DP_ACCELS && (ch->accels[src >> 3] & (1u << (src & 7))) && length > 0
            && length <= DP_FAST_MAX) {  /* (0 bytes: no route is looked at, Python decides) */
        uint32_t done = 0;
        if (dp_serve_files(dp, ch, seq, src, dst, npa, length)) {
            dp->served++;
            pthread_mutex_unlock(&dp->lock);
            return;
        }
        while (done < length && niov < DP_IOV) {
            uint64_t at = npa + done;
            struct dp_export_route *r = dp_eroute_find(dp, src, dst, at);
            uint32_t k;
            char *piece;
            if (r == NULL)
                break;
            k = r->len - (uint32_t)(at - r->npa_start);
            if (k > length - done)
                k = length - done;
            if (r->mem != NULL) {
                piece = (char *)r->mem + (at - r->npa_start);
            } else if (r->fd < 0) {
                piece = dp_zeros;
                if (k > DP_ZEROS)
                    k = DP_ZEROS;
            } else {
                if (dp->scratch == NULL && (dp->scratch = malloc(DP_FAST_MAX)) == NULL)
                    break;
                piece = dp->scratch + done;
                if (pread(r->fd, piece, k, (off_t)(r->fd_off + (at - r->npa_start)))
                        != (ssize_t)k)
                    break;
            }
            iov[niov].iov_base = piece;
            iov[niov++].iov_len = k;
            done += k;
        }
        if (done == length)
            status = 0;
    }
    if (status == 0) {
        dp->served++;
    } else {
        dp->refused++;
        niov = 1;
        length = 0;
    }
    dp_put32(head, 9 + length);
    head[4] = DP_DATA;
    dp_put32(head + 5, seq);
    dp_put32(head + 9, (uint32_t)status);
    iov[0].iov_base = head;
    iov[0].iov_len = DP_DATA_HEAD;
    /* Sent (or copied) with dp->lock still held: a flush waits for it, so the bytes are
       never read from a chunk the flush's caller then frees. */
    pthread_mutex_lock(&ch->lock);
    dp_sendv(dp, ch, iov, niov);
    pthread_mutex_unlock(&ch->lock);
    pthread_mutex_unlock(&dp->lock);
}

static int dp_late(const struct dp_channel *ch, uint32_t deadline);

/* A STORE from the peer, `len` its frame's length: stored, and DATA status 0 (no bytes)
   sent, when export routes cover all of it with memory (a BO chunk, or its memfd), else
   nothing stored and DP_FALLBACK (the importer stores it through the link: Python decides,
   as it decides every fault). All or nothing, as the exporter's Python serves a STORE
   (UalinkManager.serve_store): routes are checked for the whole range before a byte is
   written. A chunk never written has no memory yet (a zeros route): Python makes it.
   [thread] */
static void dp_serve_store(struct ualinkd_dp *dp, struct dp_channel *ch, const char *f,
                           uint32_t len)
{
    uint32_t seq = dp_get32(f + 5), length = len + 4 - DP_STORE_HEAD;
    uint16_t src = dp_get16(f + 9), dst = dp_get16(f + 11);
    uint64_t npa = dp_get64(f + 13);
    const char *data = f + DP_STORE_HEAD;
    int32_t status = DP_FALLBACK;
    char head[DP_DATA_HEAD];
    struct dp_export_route *pieces[DP_IOV];
    int npieces = 0;

    pthread_mutex_lock(&dp->lock);
    if (dp_late(ch, dp_get32(f + 21))) {  /* its importer gave up: never stored */
        dp->late_stores++;
        dp_wake(dp->notifyfd);  /* (Python logs it) */
        status = -ETIME;
    } else if (src < DP_ACCELS && (ch->accels[src >> 3] & (1u << (src & 7))) && length > 0
            && length <= DP_FAST_MAX) {
        uint32_t done = 0;
        while (done < length && npieces < DP_IOV) {
            struct dp_export_route *r = dp_eroute_find(dp, src, dst, npa + done);
            uint32_t k;
            if (r == NULL || (r->mem == NULL && r->fd < 0))
                break;
            k = r->len - (uint32_t)(npa + done - r->npa_start);
            done += k < length - done ? k : length - done;
            pieces[npieces++] = r;
        }
        if (done == length) {
            status = 0;
            done = 0;
            for (int i = 0; i < npieces && status == 0; i++) {
                struct dp_export_route *r = pieces[i];
                uint64_t at = npa + done - r->npa_start;
                uint32_t k = r->len - (uint32_t)at;
                if (k > length - done)
                    k = length - done;
                if (r->mem != NULL)  /* (a BO chunk: a bytearray, writable) */
                    memcpy((char *)r->mem + at, data + done, k);
                else if (pwrite(r->fd, data + done, k, (off_t)(r->fd_off + at)) != (ssize_t)k)
                    status = -EIO;  /* (a memfd BO of its size: it does not happen) */
                done += k;
            }
        }
    }
    if (status == 0)
        dp->served_stores++;
    else if (status != -ETIME)
        dp->refused_stores++;
    if (status != 0 && status != -ETIME)
        status = DP_FALLBACK;  /* (a failed pwrite: Python's store says what went wrong) */
    dp_put32(head, 9);
    head[4] = DP_DATA;
    dp_put32(head + 5, seq);
    dp_put32(head + 9, (uint32_t)status);
    pthread_mutex_lock(&ch->lock);
    dp_send(dp, ch, head, sizeof(head));
    pthread_mutex_unlock(&ch->lock);
    pthread_mutex_unlock(&dp->lock);
}

static void dp_lowat(struct dp_channel *ch, int n);

/* A STORE's deadline on the peer's link clock, as the link stamps its own
   (session.deadline_for with its margin): a lower bound of the peer's clock now plus the
   wait left (`left_ns`) less the answer's margin; 0 (none) before the peer's first PING.
   So an exporter that gets the STORE after its importer gave up (and faulted it) refuses
   it rather than storing what was reported failed (policy 10). [ch->lock held] */
static uint32_t dp_deadline(const struct dp_channel *ch, int64_t now, int64_t left_ns)
{
    int64_t lower, left_ms = left_ns / 1000000, keep, budget;

    if (ch->peer_at == 0)
        return 0;
    lower = (int64_t)ch->peer_ms + (now - ch->peer_at) / 1000000;
    keep = left_ms / 4 < DP_ANSWER_MARGIN_MS ? left_ms / 4 : DP_ANSWER_MARGIN_MS;
    budget = left_ms - keep;
    lower = (lower + (budget > -1 ? budget : -1)) % DP_CLOCK_MOD;
    return lower ? (uint32_t)lower : (uint32_t)(DP_CLOCK_MOD - 1);
}

/* Whether a request's `deadline` has passed on our link clock for this channel's peer
   (session.expired). */
static int dp_late(const struct dp_channel *ch, uint32_t deadline)
{
    int64_t clock, late;

    if (deadline == 0 || ch->clk_origin == 0)
        return 0;
    clock = ((dp_now() - ch->clk_origin) / 1000000) % DP_CLOCK_MOD;
    late = ((clock - (int64_t)deadline) % DP_CLOCK_MOD + DP_CLOCK_MOD) % DP_CLOCK_MOD;
    return late > 0 && late < DP_CLOCK_MOD / 2;
}

/* The STORE whose head is in front of `in` (its bytes partly received): once the rest is
   all in the socket, received straight into the BO's chunks that export routes give, with
   what `in` holds of it copied there first, and answered (1: consumed). 0: not all there
   yet (the channel is readable once it is); -1: not this way (small, not all memory the
   routes cover: dp_serve_store answers it once it is whole in `in`); -2: the channel
   broke. Under dp->lock from the route lookup to the answer's send, as dp_serve_store:
   no chunk is freed meanwhile. [thread] */
static int dp_store_direct(struct ualinkd_dp *dp, struct dp_channel *ch)
{
    const char *f = ch->in;
    uint32_t len = dp_get32(f), seq = dp_get32(f + 5), length, have, rest, done = 0;
    uint16_t src = dp_get16(f + 9), dst = dp_get16(f + 11);
    uint64_t npa = dp_get64(f + 13);
    struct iovec *iov = dp->iov;
    struct msghdr m = { 0 };
    char head[DP_DATA_HEAD];
    int niov = 0, avail = 0;
    ssize_t k;

    if (ch->nodirect || len <= DP_STORE_HEAD - 4 || len > DP_STORE_HEAD - 4 + DP_FAST_MAX
            || ch->in_len >= 4 + (size_t)len)
        return -1;
    length = len + 4 - DP_STORE_HEAD;
    have = (uint32_t)ch->in_len - DP_STORE_HEAD;
    rest = length - have;
    if (rest < DP_DIRECT_MIN || !ch->tcp || dp_late(ch, dp_get32(f + 21))
            || !(src < DP_ACCELS && (ch->accels[src >> 3] & (1u << (src & 7)))))
        goto indirect;
    if (ioctl(ch->fd, FIONREAD, &avail) != 0 || avail < 0 || (uint32_t)avail < rest) {
        /* Readable once they are all there: TCP grows its receive buffer to hold them, or
           takes a smaller mark (read back), which would never come: `in` then. */
        int lowat = 0;
        socklen_t sl = sizeof(lowat);
        int64_t now = dp_now();
        if (ch->direct_since == 0)
            ch->direct_since = now;
        else if (now - ch->direct_since >= DP_DIRECT_WAIT_NS)
            goto indirect;
        dp_lowat(ch, (int)rest);
        ch->lowat_raised = 1;
        if (getsockopt(ch->fd, SOL_SOCKET, SO_RCVLOWAT, &lowat, &sl) != 0
                || lowat < (int)rest)
            goto indirect;
        return 0;
    }
    ch->direct_since = 0;
    pthread_mutex_lock(&dp->lock);
    while (done < length && niov < DP_IOV) {
        struct dp_export_route *r = dp_eroute_find(dp, src, dst, npa + done);
        uint64_t at;
        uint32_t n;
        if (r == NULL || r->mem == NULL)  /* (a memfd's: pwrite, from `in`) */
            break;
        at = npa + done - r->npa_start;
        n = r->len - (uint32_t)at;
        if (n > length - done)
            n = length - done;
        if (done + n <= have) {  /* (received already) */
            memcpy((char *)r->mem + at, f + DP_STORE_HEAD + done, n);
        } else {
            uint32_t skip = done < have ? have - done : 0;
            if (skip)
                memcpy((char *)r->mem + at, f + DP_STORE_HEAD + done, skip);
            iov[niov].iov_base = (char *)r->mem + at + skip;
            iov[niov++].iov_len = n - skip;
        }
        done += n;
    }
    if (done < length) {  /* (what was copied is stored again, whole, by whoever serves it) */
        pthread_mutex_unlock(&dp->lock);
        goto indirect;
    }
    m.msg_iov = iov;
    m.msg_iovlen = (size_t)niov;
    k = recvmsg(ch->fd, &m, MSG_DONTWAIT);
    if (ch->lowat_raised) {
        ch->lowat_raised = 0;
        dp_lowat(ch, 1);
    }
    if (k != (ssize_t)rest) {  /* (FIONREAD said they were there) */
        pthread_mutex_unlock(&dp->lock);
        dp_drop(dp, ch, k < 0 ? "receive failed" : "a STORE's bytes came short");
        return -2;
    }
    dp->served_stores++;
    dp_put32(head, 9);
    head[4] = DP_DATA;
    dp_put32(head + 5, seq);
    dp_put32(head + 9, 0);
    pthread_mutex_lock(&ch->lock);
    dp_send(dp, ch, head, sizeof(head));
    pthread_mutex_unlock(&ch->lock);
    pthread_mutex_unlock(&dp->lock);
    ch->in_len = 0;
    return 1;
indirect:
    /* (every way out of a wait lowers the mark again: a mark left raised kept the next
       small frames unread until more bytes came, past their deadline) */
    ch->nodirect = 1;
    ch->direct_since = 0;
    if (ch->lowat_raised) {
        ch->lowat_raised = 0;
        dp_lowat(ch, 1);
    }
    return -1;
}

static void dp_engine_answered(struct ualinkd_dp *dp, const struct dp_pending *p,
                               const char *bytes);

/* A DATA from the peer: the FUSE reply of the load it answers, or that load handed to
   Python (any status, any length but the whole answer). [thread] */
static void dp_answered(struct ualinkd_dp *dp, struct dp_channel *ch, const char *f, uint32_t len)
{
    uint32_t seq = dp_get32(f + 5), n = len - 9;
    int32_t status = (int32_t)dp_get32(f + 9);
    struct dp_pending p;

    pthread_mutex_lock(&ch->lock);
    p = ch->pend[seq % DP_INFLIGHT];
    if (!p.used || p.seq != seq) {  /* timed out already (handed to Python) */
        pthread_mutex_unlock(&ch->lock);
        return;
    }
    dp_unpend(ch, &ch->pend[seq % DP_INFLIGHT]);
    pthread_mutex_unlock(&ch->lock);
    if (p.data != NULL) {  /* a store's answer: stored (no bytes), or Python's to do */
        if (status == 0 && n == 0) {
            pthread_mutex_lock(&dp->lock);
            dp->fast_stores++;
            pthread_mutex_unlock(&dp->lock);
            dp_block_done(dp, p.block, p.stolen);
            fuse_reply_write(p.req, p.size);
            return;
        }
        pthread_mutex_lock(&dp->lock);
        dp_fall_back(dp, &p, 0);
        pthread_mutex_unlock(&dp->lock);
        return;
    }
    if (p.dest != NULL) {  /* an engine load's answer, received whole into `in` */
        dp_engine_answered(dp, &p, status == 0 && n == p.size ? f + DP_DATA_HEAD : NULL);
        return;
    }
    if (p.size >= DP_SPLICE_MIN && ch->spl_pause > 0)
        ch->spl_pause--;
    if (status == 0 && n == p.size) {
        /* Counted before the reply goes: a caller that reads the counters once its load
           returned finds it there (counted after, a test saw one load short). */
        pthread_mutex_lock(&dp->lock);
        dp->fast_loads++;
        pthread_mutex_unlock(&dp->lock);
        fuse_reply_buf(p.req, f + DP_DATA_HEAD, n);
        return;
    }
    pthread_mutex_lock(&dp->lock);
    dp_fall_back(dp, &p, 0);
    pthread_mutex_unlock(&dp->lock);
}

/* The thread's pipe goes (it may hold bytes of no reply); the next splice makes another. */
static void dp_pipe_reset(struct ualinkd_dp *dp)
{
    if (dp->spl_r >= 0) {
        close(dp->spl_r);
        close(dp->spl_w);
    }
    dp->spl_r = dp->spl_w = -1;
    dp->spl_chan = -1;
}

/* The pipe, made if need be; 0, or -1 when none can be had (the copy path serves). */
static int dp_pipe(struct ualinkd_dp *dp)
{
    int fds[2];

    if (dp->spl_r >= 0)
        return 0;
    if (dp->spl_refused || pipe2(fds, O_NONBLOCK | O_CLOEXEC) < 0)
        return -1;
    /* DP_PIPE_SIZE past pipe-max-size needs CAP_SYS_RESOURCE; 1 MiB holds a 1 MiB answer
       whose pieces are large (loopback's are), else it goes to memory (dp_splice_more). */
    if (fcntl(fds[1], F_SETPIPE_SZ, DP_PIPE_SIZE) < 0
            && fcntl(fds[1], F_SETPIPE_SZ, DP_FAST_MAX) < 0) {
        close(fds[0]);
        close(fds[1]);
        dp->spl_refused = 1;  /* (over the user's pipe quota: it will not get better) */
        return -1;
    }
    dp->spl_r = fds[0];
    dp->spl_w = fds[1];
    return 0;
}

/* The channel is readable once `n` bytes are in (1: any): while an answer is spliced,
   once it is all there, not at each of its segments (on two CPUs, a wake-up of this thread
   for each, and a splice of each: 1 MiB took longer than on one). [thread] */
static void dp_lowat(struct dp_channel *ch, int n)
{
    setsockopt(ch->fd, SOL_SOCKET, SO_RCVLOWAT, &n, sizeof(n));
}

/* The pipe failed one of the channel's answers (DP_SPLICE_MISSES in a row: a pause). */
static void dp_missed(struct dp_channel *ch)
{
    if (++ch->spl_misses >= DP_SPLICE_MISSES) {
        ch->spl_misses = 0;
        ch->spl_pause = DP_SPLICE_PAUSE;
    }
}

/* Whether the channel's next large answer may be spliced: a pipe and a device to splice
   into, the pipe free, the channel not pausing. Else no read stops at a head. [thread] */
static int dp_may_splice(struct ualinkd_dp *dp, struct dp_channel *ch)
{
    return dp->fuse_fd >= 0 && !dp->spl_refused && ch->spl_pause == 0
        && (dp->spl_chan < 0 || dp->spl_chan == (int)(ch - dp->ch));
}

/* The head of DATA `f` (in_len is its 13 bytes, read alone): if it whole-answers a load of
   ours of DP_SPLICE_MIN or more, its bytes are spliced into the pipe after the FUSE reply's
   header (1), else they are received as any others (0). [thread] */
static int dp_splice_begin(struct ualinkd_dp *dp, struct dp_channel *ch, const char *f)
{
    uint32_t seq = dp_get32(f + 5), n = dp_get32(f) - 9;
    struct fuse_out_header out;
    struct dp_pending *p;
    int ok;

    if (n < DP_SPLICE_MIN || dp_get32(f + 9) != 0 || !dp_may_splice(dp, ch)
            || dp->spl_chan >= 0)
        return 0;
    pthread_mutex_lock(&ch->lock);
    p = &ch->pend[seq % DP_INFLIGHT];
    ok = p->used && p->seq == seq && p->size == n && p->unique != 0;
    out.len = (uint32_t)sizeof(out) + n;
    out.error = 0;
    out.unique = p->unique;
    pthread_mutex_unlock(&ch->lock);
    if (!ok || dp_pipe(dp) != 0)
        return 0;
    if (write(dp->spl_w, &out, sizeof(out)) != (ssize_t)sizeof(out)) {
        dp_pipe_reset(dp);
        return 0;
    }
    dp->spl_chan = (int)(ch - dp->ch);
    ch->spl_seq = seq;
    ch->spl_size = ch->spl_left = n;
    ch->spl_stalls = 0;
    dp_lowat(ch, (int)n);
    return 1;
}

/* The pipe is full (the answer came in more pieces than it has slots): what it holds of
   the answer goes to memory, behind the DATA's head again, and the rest is received there
   (dp_answered replies). 0, or -1 when the channel broke. [thread] */
static int dp_splice_to_memory(struct ualinkd_dp *dp, struct dp_channel *ch)
{
    size_t got = ch->spl_size - ch->spl_left;
    struct fuse_out_header out;
    const char *why = "out of memory";
    char *in;

    dp_missed(ch);
    if (dp_in_reserve(ch, DP_DATA_HEAD + (size_t)ch->spl_size) != 0)
        goto broken;
    in = ch->in;
    dp_put32(in, 9 + ch->spl_size);
    in[4] = DP_DATA;
    dp_put32(in + 5, ch->spl_seq);
    dp_put32(in + 9, 0);
    why = "its pipe read short";
    if (read(dp->spl_r, &out, sizeof(out)) != (ssize_t)sizeof(out)
            || read(dp->spl_r, in + DP_DATA_HEAD, got) != (ssize_t)got)
        goto broken;
    ch->in_len = DP_DATA_HEAD + got;
    ch->spl_left = 0;
    dp->spl_chan = -1;
    return 0;
broken:
    dp_pipe_reset(dp);
    dp_drop(dp, ch, why);
    return -1;
}

/* The whole answer is in the pipe: into /dev/fuse with it, as its load's reply. The load
   handed to Python meanwhile (expired), or a reply the device refused: the bytes are
   dropped with the pipe, and Python answers (the first faults it, the second serves it
   again through the link). [thread] */
static void dp_splice_reply(struct ualinkd_dp *dp, struct dp_channel *ch)
{
    struct dp_pending *slot = &ch->pend[ch->spl_seq % DP_INFLIGHT], p;
    size_t total = sizeof(struct fuse_out_header) + ch->spl_size;
    ssize_t k;
    int err;

    dp->spl_chan = -1;
    pthread_mutex_lock(&ch->lock);
    if (!slot->used || slot->seq != ch->spl_seq) {
        pthread_mutex_unlock(&ch->lock);
        dp_pipe_reset(dp);
        return;
    }
    p = *slot;
    dp_unpend(ch, slot);
    pthread_mutex_unlock(&ch->lock);
    pthread_mutex_lock(&dp->lock);  /* (counted before the reply goes: dp_answered) */
    dp->fast_loads++;
    dp->spliced++;
    pthread_mutex_unlock(&dp->lock);
    k = splice(dp->spl_r, NULL, dp->fuse_fd, NULL, total, 0);
    err = k < 0 ? errno : EIO;
    if (k == (ssize_t)total) {
        ch->spl_misses = 0;
        fuse_reply_none(p.req);  /* (frees it: the reply went) */
        return;
    }
    pthread_mutex_lock(&dp->lock);  /* (it was not carried after all) */
    dp->fast_loads--;
    dp->spliced--;
    pthread_mutex_unlock(&dp->lock);
    dp_pipe_reset(dp);
    if (err == ENOENT) {  /* the kernel has no such request (the connection aborted): */
        fuse_reply_none(p.req);  /* nobody to answer */
        return;
    }
    /* (A device that refused it: the memory path for a while. One that failed it after
       finding the request ended it EIO, and Python's answer finds ENOENT.) */
    dp_missed(ch);
    pthread_mutex_lock(&dp->lock);
    dp_fall_back(dp, &p, 0);
    pthread_mutex_unlock(&dp->lock);
}

/* More of the answer being spliced: 1 when the channel may have more to read, 0 when it
   has nothing now, -1 when it broke. [thread] */
static int dp_splice_more(struct ualinkd_dp *dp, struct dp_channel *ch)
{
    ssize_t k = splice(ch->fd, NULL, dp->spl_w, NULL, ch->spl_left,
                       SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
    int avail = 0;

    if (k > 0) {
        ch->spl_stalls = 0;
        ch->spl_left -= (uint32_t)k;
        if (ch->spl_left == 0) {
            dp_lowat(ch, 1);
            dp_splice_reply(dp, ch);
        }
        return 1;
    }
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        /* Bytes wait, yet none moved: the socket was busy (bytes that came while a splice
           held it wait in its backlog; a sender holds a socketpair's), which passes, or the
           pipe is full (more pieces than slots: 4 KiB ones on a 1 MiB pipe), which does
           not. The pipe cannot say which: a full one is a stall that lasts. */
        if (ioctl(ch->fd, FIONREAD, &avail) == 0 && avail > 0) {
            if (++ch->spl_stalls < DP_SPLICE_STALLS) {
                sched_yield();  /* (on one CPU, the sender holding the socket runs) */
                return 1;
            }
            ch->spl_stalls = 0;
            dp_lowat(ch, 1);
            return dp_splice_to_memory(dp, ch) == 0 ? 1 : -1;
        }
        ch->spl_stalls = 0;
        dp_lowat(ch, (int)ch->spl_left);
        return 0;
    }
    dp_read_failed(dp, ch, k);  /* (before the pipe's close: errno) */
    dp_pipe_reset(dp);  /* (its loads go to Python: dp_reap) */
    ch->spl_left = 0;
    return -1;
}

static int dp_direct_begin(struct ualinkd_dp *dp, struct dp_channel *ch, const char *f);
static int dp_direct_more(struct ualinkd_dp *dp, struct dp_channel *ch);

/* Read what the channel has and act on each whole frame. [thread] */
static void dp_receive(struct ualinkd_dp *dp, struct dp_channel *ch)
{
    for (;;) {
        size_t at = 0, room;
        ssize_t k;
        char why[96];

        if (ch->spl_left) {
            if (dp_splice_more(dp, ch) <= 0)
                return;
            continue;
        }
        if (ch->dr_left) {
            if (dp_direct_more(dp, ch) <= 0)
                return;
            continue;
        }
        if (ch->in_len >= DP_STORE_HEAD && (unsigned char)ch->in[4] == DP_STORE) {
            int d = dp_store_direct(dp, ch);
            if (d == 0 || d == -2)
                return;
            if (d == 1)
                continue;
        }
        /* Room for all of the frame begun (its head was checked when it came). */
        if (ch->in_len >= 5 && dp_in_reserve(ch, 4 + (size_t)dp_get32(ch->in)) != 0) {
            dp_drop(dp, ch, "out of memory");
            return;
        }
        if (ch->in_cap > DP_IN_START)
            ch->in_used = dp_now();
        room = ch->in_cap - ch->in_len;
        /* With a large answer due, no read goes past the frame in front (a head first, on
           its own): an answer's bytes are spliced, not read, once its head says whose. */
        if ((__atomic_load_n(&ch->big, __ATOMIC_RELAXED) > 0 && dp_may_splice(dp, ch))
                || __atomic_load_n(&ch->engine, __ATOMIC_RELAXED) > 0)
            room = (ch->in_len < DP_DATA_HEAD ? DP_DATA_HEAD : 4 + (size_t)dp_get32(ch->in))
                   - ch->in_len;
        k = recv(ch->fd, ch->in + ch->in_len, room, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            dp_read_failed(dp, ch, k);
            return;
        }
        if (k < 0)
            return;
        ch->in_len += (size_t)k;
        while (ch->in_len - at >= 5) {
            const char *f = ch->in + at;
            uint32_t len = dp_get32(f);
            int type = (unsigned char)f[4];
            /* Only LOADs, STOREs and the DATA answering ours come on a data channel, and
               no DATA longer than the longest load we ask, no STORE longer than the
               longest we send. Anything else: the peer is broken. */
            int ok = (type == DP_LOAD && len == DP_LOAD_SIZE - 4)
                  || (type == DP_STORE && len > DP_STORE_HEAD - 4
                      && len <= DP_STORE_HEAD - 4 + DP_FAST_MAX)
                  || (type == DP_DATA && len >= 9 && len <= 9 + DP_FAST_MAX);
            if (!ok) {
                snprintf(why, sizeof(why), "bad frame (type %#x, length %u)", type, len);
                dp_drop(dp, ch, why);
                return;
            }
            if (ch->in_len - at < 4 + (size_t)len) {
                if (type == DP_DATA && at == 0 && ch->in_len == DP_DATA_HEAD
                        && (dp_splice_begin(dp, ch, f) || dp_direct_begin(dp, ch, f)))
                    ch->in_len = 0;  /* (its bytes go to the pipe) */
                break;
            }
            if (type == DP_LOAD)
                dp_serve(dp, ch, f);
            else if (type == DP_STORE)
                dp_serve_store(dp, ch, f, len);
            else
                dp_answered(dp, ch, f, len);
            ch->nodirect = 0;  /* (the frame in front is the next one) */
            at += 4 + len;
        }
        if (at) {
            memmove(ch->in, ch->in + at, ch->in_len - at);
            ch->in_len -= at;
        }
    }
}

/* Loads not answered by their deadline go to Python, to fault. Returns the ms until the
   next deadline (at most DP_IDLE_NS, the thread's idle wake-up). [thread] */
static int dp_expire(struct ualinkd_dp *dp, int64_t now)
{
    int64_t next = now + DP_IDLE_NS;

    if (dp->nspare)  /* (read unlocked: a hint; dp_spares_free looks again) */
        dp_spares_free(dp, now - DP_IDLE_NS);
    for (int c = 0; c < DP_CHANNELS; c++) {
        struct dp_channel *ch = &dp->ch[c];
        if (ch->state == DP_OPEN && ch->direct_since) {  /* (a STORE's bytes waited for) */
            if (now - ch->direct_since >= DP_DIRECT_WAIT_NS)
                dp_receive(dp, ch);  /* (they go through `in` now) */
            else if (ch->direct_since + DP_DIRECT_WAIT_NS < next)
                next = ch->direct_since + DP_DIRECT_WAIT_NS;
        }
        if (ch->state == DP_OPEN && ch->in_len == 0 && ch->in_cap > DP_IN_START
                && now - ch->in_used >= DP_IDLE_NS) {
            char *in = realloc(ch->in, DP_IN_START);  /* (idle: a 1 MiB answer's room goes) */
            if (in != NULL) {
                ch->in = in;
                ch->in_cap = DP_IN_START;
            }
        }
        if (ch->state == DP_FREE || ch->npend == 0)
            continue;
        pthread_mutex_lock(&dp->lock);
        pthread_mutex_lock(&ch->lock);
        for (int i = 0; i < DP_INFLIGHT; i++) {
            struct dp_pending *p = &ch->pend[i];
            if (!p->used)
                continue;
            if (now - p->started >= dp->timeout_ns) {
                if (ch->dr_left && ch->dr_seq == p->seq && p->dest != NULL)
                    ch->dr_dest = NULL;  /* (its destination is Python's again: the rest
                                            of its answer is dropped as it comes) */
                dp_unpend(ch, p);
                dp_fall_back(dp, p, 1);
            } else if (p->started + dp->timeout_ns < next) {
                next = p->started + dp->timeout_ns;
            }
        }
        pthread_mutex_unlock(&ch->lock);
        pthread_mutex_unlock(&dp->lock);
    }
    return (int)((next - now + 999999) / 1000000);
}

/* A broken or closed channel: its loads go to Python, its fd is closed; a closed one's
   slot is free again. [thread] */
static void dp_reap(struct ualinkd_dp *dp)
{
    for (int c = 0; c < DP_CHANNELS; c++) {
        struct dp_channel *ch = &dp->ch[c];
        int handle = (int)(ch->gen * DP_CHANNELS + c);
        if (ch->state != DP_BROKEN && ch->state != DP_CLOSING)
            continue;
        pthread_mutex_lock(&dp->lock);
        pthread_mutex_lock(&ch->lock);
        if (ch->fd >= 0) {
            epoll_ctl(dp->epfd, EPOLL_CTL_DEL, ch->fd, NULL);
            close(ch->fd);
            ch->fd = -1;
            if (ch->state == DP_BROKEN)
                dp_event(dp, handle, ch->why);
        }
        for (int i = 0; i < DP_INFLIGHT; i++) {
            if (ch->pend[i].used) {
                ch->pend[i].used = 0;
                dp_fall_back(dp, &ch->pend[i], 0);
            }
        }
        if (dp->spl_chan == c)
            dp_pipe_reset(dp);  /* (half an answer of this channel's) */
        dp_channel_clear(ch);
        free(ch->out);  /* (up to DP_OUT_MAX, for a slot that may stay free) */
        ch->out = NULL;
        ch->out_cap = 0;
        free(ch->in);  /* (grown to a whole 1 MiB DATA, maybe) */
        ch->in = NULL;
        ch->in_cap = 0;
        if (ch->state == DP_CLOSING) {
            ch->state = DP_FREE;
            ch->gen++;
        }
        pthread_mutex_unlock(&ch->lock);
        pthread_mutex_unlock(&dp->lock);
    }
}

static void *dp_main(void *arg)
{
    struct ualinkd_dp *dp = arg;
    struct epoll_event evs[16];
    int wait_ms = (int)(DP_IDLE_NS / 1000000);

    while (!dp->stop) {
        int n = epoll_wait(dp->epfd, evs, 16, wait_ms);
        for (int i = 0; i < n; i++) {
            uint32_t c = evs[i].data.u32;
            if (c == UINT32_MAX) {
                uint64_t v;
                ssize_t k = read(dp->wakefd, &v, sizeof(v));
                (void)k;
                continue;
            }
            if (dp->ch[c].state != DP_OPEN)
                continue;
            if (evs[i].events & EPOLLOUT)
                dp_flush_out(dp, &dp->ch[c]);
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                dp_receive(dp, &dp->ch[c]);
        }
        dp_reap(dp);
        wait_ms = dp_expire(dp, dp_now());
    }
    return NULL;
}

/* -- called from Python (the trio thread) -------------------------------------------------- */

static struct ualinkd_dp *ualinkd_dp_new(void)
{
    struct ualinkd_dp *dp = calloc(1, sizeof(*dp));
    if (dp == NULL)
        return NULL;
    pthread_mutex_init(&dp->lock, NULL);
    pthread_mutex_init(&dp->spare_lock, NULL);
    for (int c = 0; c < DP_CHANNELS; c++) {
        pthread_mutex_init(&dp->ch[c].lock, NULL);
        dp->ch[c].fd = -1;
    }
    for (int a = 0; a < DP_ACCELS; a++)
        dp->accel_chan[a] = -1;
    memset(dp->ebucket, 0xff, sizeof(dp->ebucket));  /* -1: empty */
    dp->epfd = dp->wakefd = dp->notifyfd = -1;
    dp->fuse_fd = dp->spl_r = dp->spl_w = dp->spl_chan = -1;
    dp->timeout_ns = DP_TIMEOUT_NS;
    return dp;
}

/* Start the thread; it splices large answers into `fuse_fd` (the session's /dev/fuse; -1:
   it copies them). Returns the eventfd Python waits on for loads handed back and events,
   or -errno. */
static int ualinkd_dp_start(struct ualinkd_dp *dp, int fuse_fd)
{
    struct epoll_event ev = { EPOLLIN, { .u32 = UINT32_MAX } };
    int err;

    if (dp->running)
        return dp->notifyfd;
    dp->fuse_fd = fuse_fd;
    dp->spl_refused = 0;
    dp->epfd = epoll_create1(EPOLL_CLOEXEC);
    dp->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    dp->notifyfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (dp->epfd < 0 || dp->wakefd < 0 || dp->notifyfd < 0
            || epoll_ctl(dp->epfd, EPOLL_CTL_ADD, dp->wakefd, &ev) < 0)
        goto fail;
    dp->stop = 0;
    err = pthread_create(&dp->thread, NULL, dp_main, dp);
    if (err) {
        errno = err;
        goto fail;
    }
    dp->running = 1;
    return dp->notifyfd;
fail:
    err = errno;
    if (dp->epfd >= 0) close(dp->epfd);
    if (dp->wakefd >= 0) close(dp->wakefd);
    if (dp->notifyfd >= 0) close(dp->notifyfd);
    dp->epfd = dp->wakefd = dp->notifyfd = -1;
    return -err;
}

/* Stop the thread; every channel closed, its loads answered `err` (the session is ending).
   The routes go. */
static void ualinkd_dp_stop(struct ualinkd_dp *dp, int err)
{
    if (!dp->running)
        return;
    dp->stop = 1;
    dp_wake(dp->wakefd);
    pthread_join(dp->thread, NULL);
    dp->running = 0;
    for (int c = 0; c < DP_CHANNELS; c++) {
        struct dp_channel *ch = &dp->ch[c];
        for (int i = 0; i < DP_INFLIGHT; i++)
            if (ch->pend[i].used && ch->pend[i].dest != NULL) {
                ch->pend[i].used = 0;
                pthread_mutex_lock(&dp->lock);
                dp_engine_post(dp, ch->pend[i].token, -err);
                pthread_mutex_unlock(&dp->lock);
            } else if (ch->pend[i].used) {
                ch->pend[i].used = 0;
                fuse_reply_err(ch->pend[i].req, err);
                free(ch->pend[i].block);
                ch->pend[i].data = ch->pend[i].block = NULL;
            }
        if (ch->fd >= 0)
            close(ch->fd);
        ch->fd = -1;
        dp_channel_clear(ch);
        if (ch->state != DP_FREE)
            ch->gen++;
        ch->state = DP_FREE;
    }
    for (size_t i = 0; i < dp->nfb; i++) {
        fuse_reply_err(dp->fb[i].req, err);
        free(dp->fb[i].block);
    }
    dp->nfb = 0;
    for (int a = 0; a < DP_ACCELS; a++)
        dp->accel_chan[a] = -1;
    dp->gen++;
    dp_pipe_reset(dp);
    dp->fuse_fd = -1;
    close(dp->epfd);
    close(dp->wakefd);
    close(dp->notifyfd);
    dp->epfd = dp->wakefd = dp->notifyfd = -1;
}

static void ualinkd_dp_free(struct ualinkd_dp *dp)
{
    if (dp == NULL)
        return;
    ualinkd_dp_stop(dp, EINTR);
    for (int c = 0; c < DP_CHANNELS; c++) {
        free(dp->ch[c].out);
        free(dp->ch[c].in);
    }
    free(dp->fb);
    free(dp->ld);
    free(dp->scratch);
    dp_spares_free(dp, 0);
    free(dp);
}

/* A data channel to a peer whose accels are `accels`: takes `fd`. Returns its handle, or
   -errno (fd closed). */
static int ualinkd_dp_open(struct ualinkd_dp *dp, int fd, const uint16_t *accels, int naccels)
{
    struct epoll_event ev = { EPOLLIN, { 0 } };
    struct dp_channel *ch = NULL;
    int c, err = EBUSY, flags;

    pthread_mutex_lock(&dp->lock);
    if (!dp->running)
        goto fail;
    for (c = 0; c < DP_CHANNELS; c++)
        if (dp->ch[c].state == DP_FREE) {
            ch = &dp->ch[c];
            break;
        }
    if (ch == NULL)
        goto fail;
    err = ENOMEM;
    if (ch->in == NULL) {
        if ((ch->in = malloc(DP_IN_START)) == NULL)
            goto fail;
        ch->in_cap = DP_IN_START;
    }
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        err = errno;
        goto fail;
    }
    pthread_mutex_lock(&ch->lock);
    memset(ch->accels, 0, sizeof(ch->accels));
    for (int i = 0; i < naccels; i++)
        if (accels[i] < DP_ACCELS) {
            ch->accels[accels[i] >> 3] |= (uint8_t)(1u << (accels[i] & 7));
            dp->accel_chan[accels[i]] = (int16_t)c;
        }
    ch->fd = fd;
    ch->state = DP_OPEN;
    dp_channel_clear(ch);
    ch->clk_origin = ch->peer_at = 0;
    ch->peer_ms = 0;
    {
        int proto = 0;
        socklen_t sl = sizeof(proto);
        ch->tcp = getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &sl) == 0
            && proto == IPPROTO_TCP;
    }
    ch->why[0] = 0;
    ev.data.u32 = (uint32_t)c;
    if (epoll_ctl(dp->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        err = errno;
        ch->state = DP_FREE;
        ch->fd = -1;
        dp_unroute_channel(dp, c);
        pthread_mutex_unlock(&ch->lock);
        goto fail;
    }
    pthread_mutex_unlock(&ch->lock);
    pthread_mutex_unlock(&dp->lock);
    return (int)(ch->gen * DP_CHANNELS + c);
fail:
    pthread_mutex_unlock(&dp->lock);
    close(fd);
    return -err;
}

/* The channel's link went down: the thread closes it; its loads go to Python. */
static void ualinkd_dp_close(struct ualinkd_dp *dp, int handle)
{
    int c = handle % DP_CHANNELS;
    struct dp_channel *ch = &dp->ch[c];

    if (handle < 0)
        return;
    pthread_mutex_lock(&dp->lock);
    if (ch->state != DP_FREE && ch->gen * DP_CHANNELS + c == (uint32_t)handle) {
        dp_unroute_channel(dp, c);
        pthread_mutex_lock(&ch->lock);
        if (ch->state == DP_OPEN && ch->fd >= 0)
            shutdown(ch->fd, SHUT_RDWR);
        ch->state = DP_CLOSING;
        pthread_mutex_unlock(&ch->lock);
        dp_wake(dp->wakefd);
    }
    pthread_mutex_unlock(&dp->lock);
}

/* A load's deadline: the link's (its ack_timeout), so that one carried here faults when
   one on the link would. */
static void ualinkd_dp_set_timeout(struct ualinkd_dp *dp, int64_t ns)
{
    pthread_mutex_lock(&dp->lock);
    dp->timeout_ns = ns > 0 ? ns : 1;
    pthread_mutex_unlock(&dp->lock);
}

/* The link's clocks for channel `handle` (fabric/session.py): our link clock's zero, and
   the peer's last PING (peer_at 0: none yet), all CLOCK_MONOTONIC ns. */
static void ualinkd_dp_set_clock(struct ualinkd_dp *dp, int handle, int64_t origin,
                                 uint32_t peer_ms, int64_t peer_at)
{
    int c = handle % DP_CHANNELS;
    struct dp_channel *ch = &dp->ch[c];

    if (handle < 0)
        return;
    pthread_mutex_lock(&dp->lock);
    if (ch->state != DP_FREE && ch->gen * DP_CHANNELS + c == (uint32_t)handle) {
        pthread_mutex_lock(&ch->lock);
        ch->clk_origin = origin ? origin : 1;
        ch->peer_ms = peer_ms;
        ch->peer_at = peer_at;
        pthread_mutex_unlock(&ch->lock);
    }
    pthread_mutex_unlock(&dp->lock);
}

/* Every route goes (a translation changed somewhere). Returns once no LOAD is being copied
   through an old one. */
static void ualinkd_dp_flush(struct ualinkd_dp *dp)
{
    pthread_mutex_lock(&dp->lock);
    dp->gen++;
    pthread_mutex_unlock(&dp->lock);
}

/* File `fh` was released: its routes go (FUSE may give its number to a later open). */
static void ualinkd_dp_forget_file(struct ualinkd_dp *dp, uint64_t fh)
{
    pthread_mutex_lock(&dp->lock);
    for (unsigned i = 0; i < DP_IMPORT_ROUTES; i++)
        if (dp->iroute[i].fh == fh)
            dp->iroute[i].used = 0;
    pthread_mutex_unlock(&dp->lock);
}

/* Reads (perm DP_READ) or writes (DP_WRITE) of render-node file `fh` in [va_start,
   va_end) are loads or stores of NPA `npa_start` onwards at accel `dst`, issued by accel
   `src`. A route of the same mapping learns the other permission when Python served that
   access too. */
static void ualinkd_dp_route_import(struct ualinkd_dp *dp, uint64_t fh, uint64_t va_start,
                                    uint64_t va_end, uint64_t npa_start, uint16_t src,
                                    uint16_t dst, int perm)
{
    struct dp_import_route *r = NULL;

    pthread_mutex_lock(&dp->lock);
    for (unsigned i = 0; i < DP_IMPORT_ROUTES; i++) {
        struct dp_import_route *q = &dp->iroute[i];
        if (q->used && q->fh == fh && q->va_start == va_start) {
            r = q;
            break;
        }
    }
    if (r == NULL)
        r = &dp->iroute[dp->inext++ % DP_IMPORT_ROUTES];
    else if (r->gen == dp->gen && r->va_end == va_end && r->npa_start == npa_start
             && r->src == src && r->dst == dst)
        perm |= r->perm;  /* (the same mapping, still current) */
    r->perm = perm;
    r->fh = fh;
    r->va_start = va_start;
    r->va_end = va_end;
    r->npa_start = npa_start;
    r->src = src;
    r->dst = dst;
    r->gen = dp->gen;
    r->used = 1;
    pthread_mutex_unlock(&dp->lock);
}

/* LOADs from accel `src` of NPA [npa_start, npa_start + len) at our accel `dst` read the
   `len` bytes at `mem` (a BO chunk), or in file `fd` from `fd_off` (a BO's memfd) when mem
   is NULL, or zeros when fd is -1 too (a chunk never written): valid until the next flush. */
static void ualinkd_dp_route_export(struct ualinkd_dp *dp, uint16_t src, uint16_t dst,
                                    uint64_t npa_start, const char *mem, int fd,
                                    uint64_t fd_off, uint32_t len)
{
    struct dp_export_route *r = NULL;

    pthread_mutex_lock(&dp->lock);
    r = dp_eroute_find(dp, src, dst, npa_start);
    if (r == NULL || r->npa_start != npa_start)
        r = &dp->eroute[dp->enext++ % DP_EXPORT_ROUTES];
    r->src = src;
    r->dst = dst;
    r->npa_start = npa_start;
    r->mem = mem;
    r->fd = fd;
    r->fd_off = fd_off;
    r->len = len;
    r->gen = dp->gen;
    r->used = 1;
    dp_ebucket_put(dp, r, npa_start);
    if (len > 0 && (npa_start + len - 1) >> 16 != npa_start >> 16)
        dp_ebucket_put(dp, r, npa_start + len - 1);
    pthread_mutex_unlock(&dp->lock);
}

/* The fast paths' first step (trio thread): the import route of file `fh` that covers
   [off, off + size) with permission `perm` (DP_READ for a load, DP_WRITE for a store), its
   peer's open channel and the next pending slot of it. 0 with that channel's lock held (the
   caller sends its frame, then fills the slot or gives it up, and unlocks); -1 when the
   access is Python's (no such route or channel, too big, or the channel's window full). */
static int dp_reserve(struct ualinkd_dp *dp, unsigned perm, uint64_t fh, uint64_t off,
                      size_t size, struct dp_channel **chp, struct dp_pending **pp,
                      uint64_t *npa, uint16_t *src, uint16_t *dst, uint32_t *seq)
{
    struct dp_import_route *r = NULL;
    struct dp_channel *ch;
    int c;

    if (!dp->running || size == 0 || size > DP_FAST_MAX)
        return -1;
    pthread_mutex_lock(&dp->lock);
    for (unsigned i = 0; i < DP_IMPORT_ROUTES; i++) {
        struct dp_import_route *q = &dp->iroute[i];
        if (q->used && (q->perm & perm) && q->gen == dp->gen && q->fh == fh
                && off >= q->va_start && off < q->va_end && size <= q->va_end - off) {
            r = q;
            break;
        }
    }
    if (r == NULL || (c = dp->accel_chan[r->dst]) < 0 || dp->ch[c].state != DP_OPEN) {
        pthread_mutex_unlock(&dp->lock);
        return -1;
    }
    *npa = r->npa_start + (off - r->va_start);
    *src = r->src;
    *dst = r->dst;
    ch = &dp->ch[c];
    pthread_mutex_lock(&ch->lock);
    pthread_mutex_unlock(&dp->lock);
    *seq = ch->next_seq;
    *pp = &ch->pend[*seq % DP_INFLIGHT];
    if (ch->npend >= DP_INFLIGHT || (*pp)->used
            || ch->inflight_bytes + size > DP_INFLIGHT_BYTES) {
        pthread_mutex_unlock(&ch->lock);
        return -1;
    }
    (*pp)->dest = NULL;  /* (a FUSE request's: an engine load's slot before, maybe) */
    *chp = ch;
    return 0;
}

/* The fast paths' last step, once their frame went out on `ch` (dp_reserve's slot `p`,
   sequence `seq`): the slot now waits for the answer to request `req`, and `ch`'s lock,
   held since dp_reserve, is released. */
static void dp_commit(struct ualinkd_dp *dp, struct dp_channel *ch, struct dp_pending *p,
                      fuse_req_t req, fuse_ino_t ino, size_t size, uint64_t off, uint64_t fh,
                      uint64_t unique, uint32_t seq)
{
    ch->next_seq = seq + 1;
    p->req = req;
    p->ino = ino;
    p->size = (uint32_t)size;
    p->off = off;
    p->fh = fh;
    p->unique = unique;
    p->seq = seq;
    p->started = dp_now();
    p->used = 1;
    ch->npend++;
    ch->inflight_bytes += (uint32_t)size;
    if (dp->timeout_ns < DP_IDLE_NS)
        dp_wake(dp->wakefd);  /* (the thread may sleep DP_IDLE_NS: past this one's deadline) */
    pthread_mutex_unlock(&ch->lock);
}

/* A LOAD frame of [npa, npa + size) at accel `dst`, issued by our accel `src` (fabric/wire.py
   Load). It carries no deadline: the importer's own timeout ends its wait (dp_expire). */
static void dp_load_frame(char f[DP_LOAD_SIZE], uint32_t seq, uint16_t src, uint16_t dst,
                          uint64_t npa, uint32_t size)
{
    dp_put32(f, DP_LOAD_SIZE - 4);
    f[4] = DP_LOAD;
    dp_put32(f + 5, seq);
    memcpy(f + 9, &src, 2);
    memcpy(f + 11, &dst, 2);
    memcpy(f + 13, &npa, 8);
    dp_put32(f + 21, size);
    dp_put32(f + 25, 0);
}

/* The read callback's fast path (trio thread, inside fuse_session_process_buf): 0 when the
   load went out as a LOAD (the thread answers `req`), -1 when Python must serve it. */
static int dp_try_load(struct ualinkd_dp *dp, fuse_req_t req, fuse_ino_t ino, size_t size,
                       uint64_t off, uint64_t fh, uint64_t unique)
{
    struct dp_channel *ch;
    struct dp_pending *p;
    char f[DP_LOAD_SIZE];
    uint64_t npa;
    uint16_t src, dst;
    uint32_t seq;

    if (dp_reserve(dp, DP_READ, fh, off, size, &ch, &p, &npa, &src, &dst, &seq) != 0)
        return -1;
    p->data = p->block = NULL;  /* (a store's, handed on with it, in a slot used before) */
    dp_load_frame(f, seq, src, dst, npa, (uint32_t)size);
    /* (counted before the LOAD goes: its answer's head must not be read with its bytes) */
    if (size >= DP_SPLICE_MIN)
        __atomic_add_fetch(&ch->big, 1, __ATOMIC_RELAXED);
    if (dp_send(dp, ch, f, sizeof(f)) != 0) {
        if (size >= DP_SPLICE_MIN)
            __atomic_sub_fetch(&ch->big, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&ch->lock);
        return -1;
    }
    dp_commit(dp, ch, p, req, ino, size, off, fh, unique, seq);
    return 0;
}

/* The write callback's fast path (trio thread, inside fuse_session_process_buf): 0 when
   the store of `buf` went out as a STORE (the thread answers `req`: the count, once the
   exporter stored it all), -1 when Python must serve it. Its bytes are kept until the
   answer: an exporter that refuses it (no route there) or a channel that goes down hands
   the store to Python, which stores them through the link and decides any fault (policy
   10: one STORE is stored whole or not at all, as the link's). Ordering: the channel
   carries this file's loads and stores in the order they came, and the exporter's thread
   applies them in that order, with one exception no issuer of ours can see: a large LOAD
   answered by sendfile (dp_serve_files) hands the BO's pages to the socket by reference, so
   until the importer has read its answer, a STORE applied after it shows in it. Every
   issuer here waits for a load's answer (copied out before it completes) before its next
   access; one that pipelines a STORE behind a LOAD of the same bytes must not rely on it.
   The bytes are kept without a copy: `in` is the buffer libfuse received the request into
   (its struct fuse_buf), and the store takes that buffer over (its mem set to NULL, so the
   session's next receive allocates another: libfuse's fuse_session_receive_buf does when
   mem is NULL). A copy of 1 MiB was an eighth of a carried store's time. A small store is
   copied (DP_STEAL_MIN). */
static int dp_try_store(struct ualinkd_dp *dp, fuse_req_t req, fuse_ino_t ino, const char *buf,
                        size_t size, uint64_t off, uint64_t fh, uint64_t unique,
                        struct fuse_buf *in)
{
    struct dp_channel *ch;
    struct dp_pending *p;
    char f[DP_STORE_HEAD];
    struct iovec iov[2];
    uint64_t npa;
    uint16_t src, dst;
    uint32_t seq;
    int steal;

    steal = size >= DP_STEAL_MIN && in != NULL && in->mem != NULL && !(in->flags & FUSE_BUF_IS_FD)
        && buf >= (const char *)in->mem && buf + size <= (const char *)in->mem + in->size;
    if (dp_reserve(dp, DP_WRITE, fh, off, size, &ch, &p, &npa, &src, &dst, &seq) != 0)
        return -1;
    dp_put32(f, (uint32_t)(DP_STORE_HEAD - 4 + size));
    f[4] = DP_STORE;
    dp_put32(f + 5, seq);
    memcpy(f + 9, &src, 2);
    memcpy(f + 11, &dst, 2);
    memcpy(f + 13, &npa, 8);
    dp_put32(f + 21, dp_deadline(ch, dp_now(), dp->timeout_ns));
    iov[0].iov_base = f;
    iov[0].iov_len = sizeof(f);
    iov[1].iov_base = (void *)buf;
    iov[1].iov_len = size;
    p->stolen = 0;
    if (steal) {
        p->block = in->mem;
        p->data = (char *)buf;
        p->stolen = malloc_usable_size(in->mem);
    } else if ((p->block = p->data = malloc(size)) != NULL) {
        memcpy(p->data, buf, size);
    } else {
        pthread_mutex_unlock(&ch->lock);
        return -1;
    }
    if (dp_sendv(dp, ch, iov, 2) != 0) {
        if (!steal)
            free(p->block);
        p->data = p->block = NULL;
        pthread_mutex_unlock(&ch->lock);
        return -1;
    }
    if (steal)  /* (the store's now; libfuse allocates another if no spare is kept) */
        in->mem = dp_spare(dp, p->stolen);
    dp_commit(dp, ch, p, req, ino, size, off, fh, unique, seq);
    return 0;
}

/* Loads handed back to Python since the last call (at most `max`). */
static int ualinkd_dp_take_fallbacks(struct ualinkd_dp *dp, struct dp_fallback *out, int max)
{
    int n;
    uint64_t v;
    ssize_t k = read(dp->notifyfd, &v, sizeof(v));

    (void)k;
    pthread_mutex_lock(&dp->lock);
    n = (int)(dp->nfb < (size_t)max ? dp->nfb : (size_t)max);
    memcpy(out, dp->fb, (size_t)n * sizeof(*out));
    memmove(dp->fb, dp->fb + n, (dp->nfb - (size_t)n) * sizeof(*out));
    dp->nfb -= (size_t)n;
    if (dp->nfb || dp->nev)
        dp_wake(dp->notifyfd);
    pthread_mutex_unlock(&dp->lock);
    return n;
}

/* A channel that broke since the last call: its handle and why (1), or nothing (0). */
static int ualinkd_dp_take_event(struct ualinkd_dp *dp, int *handle, char *why, size_t size)
{
    int got = 0;

    pthread_mutex_lock(&dp->lock);
    if (dp->nev) {
        *handle = dp->ev[0].handle;
        snprintf(why, size, "%s", dp->ev[0].why);
        memmove(dp->ev, dp->ev + 1, (dp->nev - 1) * sizeof(dp->ev[0]));
        dp->nev--;
        got = 1;
    }
    pthread_mutex_unlock(&dp->lock);
    return got;
}

/* fast loads, LOADs served, loads handed to Python, LOADs answered DP_FALLBACK, fast loads
   whose answer was spliced; fast stores, STOREs served, STOREs answered DP_FALLBACK, STOREs
   refused late; stores that gave libfuse a kept buffer, the buffers kept now. */
static void ualinkd_dp_stats(struct ualinkd_dp *dp, uint64_t *out)
{
    pthread_mutex_lock(&dp->lock);
    out[0] = dp->fast_loads;
    out[1] = dp->served;
    out[2] = dp->fallbacks;
    out[3] = dp->refused;
    out[4] = dp->spliced;
    out[5] = dp->fast_stores;
    out[6] = dp->served_stores;
    out[7] = dp->refused_stores;
    out[8] = dp->late_stores;
    pthread_mutex_unlock(&dp->lock);
    pthread_mutex_lock(&dp->spare_lock);
    out[9] = dp->reused_buffers;
    out[10] = (uint64_t)dp->nspare;
    pthread_mutex_unlock(&dp->spare_lock);
}

/* -- the GPU engine's remote loads (gpu_engine.py's remote copies) ---------------------------
 *
 * An SDMA copy from imported memory loads it in DP_FAST_MAX pieces: each a LOAD on the
 * exporter's channel (ualinkd_dp_load_into), whose DATA the thread receives straight into
 * the piece's destination (a buffer Python keeps alive until the load's outcome is posted:
 * ualinkd_dp_take_loaded), and posts as done. What the FUSE path hands back to Python, this
 * posts as DP_FALLBACK (no route at the exporter, a partial answer, a channel that went
 * down: Python loads that piece through the link) or -ETIME (no answer within the link's
 * deadline: Python faults it as the link does). Once an outcome is posted the thread never
 * touches the destination again: an answer still coming for a load that expired is dropped
 * as it comes (dr_dest NULL). */

/* Record an engine load's outcome (its room was reserved when it was issued), without
   waking Python. [dp->lock held] */
static void dp_engine_record(struct ualinkd_dp *dp, uint64_t token, int32_t status)
{
    if (dp->nld < dp->capld) {  /* (always: ualinkd_dp_load_into reserved it) */
        dp->ld[dp->nld].token = token;
        dp->ld[dp->nld].status = status;
        dp->nld++;
    } else {
        dp->lost_events++;
    }
}

/* Post an engine load's outcome: recorded, Python woken. [dp->lock held] */
static void dp_engine_post(struct ualinkd_dp *dp, uint64_t token, int32_t status)
{
    dp_engine_record(dp, token, status);
    if (dp->notifyfd >= 0)
        dp_wake(dp->notifyfd);
}

/* An engine load loaded whole: counted and recorded under dp->lock, Python woken once it
   is released. (Woken under it, the trio thread, on the same CPU, preempted this thread
   still holding it, then blocked in its first call that takes it, ualinkd_dp_stats: two
   more context switches per 1 MiB piece of an SDMA copy.) The notify fd is closed only
   once this thread was joined (ualinkd_dp_stop). [thread] */
static void dp_engine_loaded(struct ualinkd_dp *dp, uint64_t token)
{
    pthread_mutex_lock(&dp->lock);
    dp->engine_loads++;
    dp_engine_record(dp, token, 0);
    pthread_mutex_unlock(&dp->lock);
    if (dp->notifyfd >= 0)
        dp_wake(dp->notifyfd);
}

/* An engine load answered by a DATA received into `in`: its `bytes` (NULL: not a whole
   answer, Python's to load) copied to its destination. Its slot is free already: nobody
   else posts it. [thread] */
static void dp_engine_answered(struct ualinkd_dp *dp, const struct dp_pending *p,
                               const char *bytes)
{
    if (bytes != NULL) {
        memcpy(p->dest, bytes, p->size);
        dp_engine_loaded(dp, p->token);
        return;
    }
    pthread_mutex_lock(&dp->lock);
    dp_fall_back(dp, p, 0);
    pthread_mutex_unlock(&dp->lock);
}

/* The head of DATA `f` (read alone: an engine load is pending) whole-answers an engine load
   of ours: its bytes are received straight into the load's destination (1), not through
   `in` and a copy (a 1 MiB piece: one copy of the bytes on this side, where the link's
   path made three). Else 0: it is received as any other frame. [thread] */
static int dp_direct_begin(struct ualinkd_dp *dp, struct dp_channel *ch, const char *f)
{
    uint32_t seq = dp_get32(f + 5), n = dp_get32(f) - 9;
    struct dp_pending *p;
    int ok;

    (void)dp;
    if (n == 0 || dp_get32(f + 9) != 0)
        return 0;
    pthread_mutex_lock(&ch->lock);
    p = &ch->pend[seq % DP_INFLIGHT];
    ok = p->used && p->seq == seq && p->dest != NULL && p->size == n;
    if (ok) {
        ch->dr_dest = p->dest;
        ch->dr_seq = seq;
        ch->dr_size = ch->dr_left = n;
    }
    pthread_mutex_unlock(&ch->lock);
    if (ok && ch->tcp)
        dp_lowat(ch, (int)n);  /* (woken once it is all there, not at each segment) */
    return ok;
}

/* More of the answer received straight into its destination: 1 when the channel may have
   more to read, 0 when it has nothing now, -1 when it broke (its load goes back to Python
   with the channel's others: dp_reap). [thread] */
static int dp_direct_more(struct ualinkd_dp *dp, struct dp_channel *ch)
{
    size_t want = ch->dr_left;
    char *to;
    ssize_t k;

    if (ch->dr_dest != NULL) {
        to = ch->dr_dest + (ch->dr_size - ch->dr_left);
    } else {  /* (its load expired: dropped, through `in`, at least DP_IN_START big) */
        to = ch->in;
        if (want > ch->in_cap)
            want = ch->in_cap;
    }
    k = recv(ch->fd, to, want, MSG_DONTWAIT);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        ch->dr_left = 0;
        dp_read_failed(dp, ch, k);
        return -1;
    }
    if (k < 0) {
        if (ch->tcp)
            dp_lowat(ch, (int)ch->dr_left);
        return 0;
    }
    ch->dr_left -= (uint32_t)k;
    if (ch->dr_left)
        return 1;
    if (ch->tcp)
        dp_lowat(ch, 1);
    if (ch->dr_dest != NULL) {
        struct dp_pending *slot = &ch->pend[ch->dr_seq % DP_INFLIGHT], p;
        pthread_mutex_lock(&ch->lock);
        p = *slot;
        if (slot->used && slot->seq == ch->dr_seq && slot->dest == ch->dr_dest)
            dp_unpend(ch, slot);
        else
            p.dest = NULL;  /* (cannot be: only this thread ends it meanwhile) */
        pthread_mutex_unlock(&ch->lock);
        if (p.dest != NULL)
            dp_engine_loaded(dp, p.token);
    }
    return 1;
}

/* An engine load (trio thread): 0 when a LOAD of [npa, npa + size) at accel `dst`, issued
   by our accel `src`, went out on dst's channel, its bytes to land at `dest` (which must
   stay valid until `token`'s outcome is taken: ualinkd_dp_take_loaded); -1 when it did not
   (no open channel to dst, too big, the channel's window full, no memory): the caller
   loads it through the link. */
static int ualinkd_dp_load_into(struct ualinkd_dp *dp, uint16_t src, uint16_t dst,
                                uint64_t npa, char *dest, uint32_t size, uint64_t token)
{
    struct dp_channel *ch;
    struct dp_pending *p;
    char f[DP_LOAD_SIZE];
    uint32_t seq;
    int c;

    if (!dp->running || size == 0 || size > DP_FAST_MAX || dst >= DP_ACCELS || dest == NULL)
        return -1;
    pthread_mutex_lock(&dp->lock);
    if (dp->ld_reserved == dp->capld) {
        size_t cap = dp->capld ? dp->capld * 2 : 64;
        struct dp_loaded *ld = realloc(dp->ld, cap * sizeof(*ld));
        if (ld == NULL) {
            pthread_mutex_unlock(&dp->lock);
            return -1;
        }
        dp->ld = ld;
        dp->capld = cap;
    }
    if ((c = dp->accel_chan[dst]) < 0 || dp->ch[c].state != DP_OPEN) {
        pthread_mutex_unlock(&dp->lock);
        return -1;
    }
    ch = &dp->ch[c];
    pthread_mutex_lock(&ch->lock);
    seq = ch->next_seq;
    p = &ch->pend[seq % DP_INFLIGHT];
    if (ch->npend >= DP_INFLIGHT || p->used || ch->inflight_bytes + size > DP_INFLIGHT_BYTES) {
        pthread_mutex_unlock(&ch->lock);
        pthread_mutex_unlock(&dp->lock);
        return -1;
    }
    dp_load_frame(f, seq, src, dst, npa, size);
    /* (counted before the LOAD goes: its answer's head must be read alone) */
    __atomic_add_fetch(&ch->engine, 1, __ATOMIC_RELAXED);
    if (size >= DP_SPLICE_MIN)  /* (dp_unpend's count: a load without `data`) */
        __atomic_add_fetch(&ch->big, 1, __ATOMIC_RELAXED);
    if (dp_send(dp, ch, f, sizeof(f)) != 0) {
        __atomic_sub_fetch(&ch->engine, 1, __ATOMIC_RELAXED);
        if (size >= DP_SPLICE_MIN)
            __atomic_sub_fetch(&ch->big, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&ch->lock);
        pthread_mutex_unlock(&dp->lock);
        return -1;
    }
    dp->ld_reserved++;
    pthread_mutex_unlock(&dp->lock);
    p->data = p->block = NULL;
    p->dest = dest;
    p->token = token;
    dp_commit(dp, ch, p, NULL, 0, size, 0, 0, 0, seq);
    return 0;
}

/* Engine loads' outcomes posted since the last call (at most `max`). */
static int ualinkd_dp_take_loaded(struct ualinkd_dp *dp, struct dp_loaded *out, int max)
{
    int n;

    pthread_mutex_lock(&dp->lock);
    n = (int)(dp->nld < (size_t)max ? dp->nld : (size_t)max);
    memcpy(out, dp->ld, (size_t)n * sizeof(*out));
    memmove(dp->ld, dp->ld + n, (dp->nld - (size_t)n) * sizeof(*out));
    dp->nld -= (size_t)n;
    dp->ld_reserved -= (size_t)n;
    if (dp->nld && dp->notifyfd >= 0)
        dp_wake(dp->notifyfd);
    pthread_mutex_unlock(&dp->lock);
    return n;
}

/* Engine loads carried whole; engine loads handed back (fallbacks, expiries). */
static void ualinkd_dp_engine_stats(struct ualinkd_dp *dp, uint64_t *out)
{
    pthread_mutex_lock(&dp->lock);
    out[0] = dp->engine_loads;
    out[1] = dp->engine_fallbacks;
    pthread_mutex_unlock(&dp->lock);
}

/* A large LOAD whose routes are (some of them) a BO's memfd, answered without copying those
   bytes here: sendfile(2) hands the memfd's pages to the socket (the receiver's copy is the
   only one), where dp_serve reads them into `scratch` and sends that (two copies, the
   exporter's half of a 1 MiB piece's cost). Whatever the socket does not take now is read
   and queued (dp_sendv), as dp_serve queues it. 1 when it answered the LOAD (or broke the
   channel trying), 0 when it is not one (dp_serve answers it). [thread; dp->lock held, so
   the routes' memory stays while it is read] */
#define DP_SENDFILE_MIN (64 * 1024)
static int dp_serve_files(struct ualinkd_dp *dp, struct dp_channel *ch, uint32_t seq,
                          uint16_t src, uint16_t dst, uint64_t npa, uint32_t length)
{
    struct dp_export_route *r[DP_IOV];
    uint64_t off[DP_IOV];
    uint32_t k[DP_IOV], done = 0, pos = 0;
    int n = 0, files = 0, i, niov = 0;
    char head[DP_DATA_HEAD], why[96];
    size_t hsent = 0, used = 0;
    ssize_t got;

    if (length < DP_SENDFILE_MIN || !ch->tcp)
        return 0;
    while (done < length) {
        struct dp_export_route *q = dp_eroute_find(dp, src, dst, npa + done);
        uint32_t kk;
        if (q == NULL || n == DP_IOV - 1)
            return 0;
        off[n] = npa + done - q->npa_start;
        kk = q->len - (uint32_t)off[n];
        if (kk > length - done)
            kk = length - done;
        if (q->mem == NULL && q->fd < 0 && kk > DP_ZEROS)
            return 0;
        done += kk;
        if (q->mem == NULL && q->fd >= 0) {
            files++;
            /* (the BO's next chunk in the same memfd, where the last one ends: one piece,
               one sendfile for a whole LOAD of a BO's memfd rather than one per chunk) */
            if (n > 0 && r[n - 1]->mem == NULL && r[n - 1]->fd == q->fd
                    && r[n - 1]->fd_off + off[n - 1] + k[n - 1] == q->fd_off + off[n]) {
                k[n - 1] += kk;
                continue;
            }
        }
        r[n] = q;
        k[n++] = kk;
    }
    if (!files || (dp->scratch == NULL && (dp->scratch = malloc(DP_FAST_MAX)) == NULL))
        return 0;
    dp_put32(head, 9 + length);
    head[4] = DP_DATA;
    dp_put32(head + 5, seq);
    dp_put32(head + 9, 0);
    pthread_mutex_lock(&ch->lock);
    if (ch->state != DP_OPEN || ch->out_len) {  /* (frames queued ahead: dp_serve queues) */
        pthread_mutex_unlock(&ch->lock);
        return 0;
    }
    got = send(ch->fd, head, sizeof(head), MSG_DONTWAIT | MSG_NOSIGNAL | MSG_MORE);
    hsent = got > 0 ? (size_t)got : 0;
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        goto failed;
    /* Piece by piece while the socket takes them whole; i, pos: where it stopped. */
    for (i = 0; hsent == sizeof(head) && i < n; i++) {
        for (pos = 0; pos < k[i]; pos += (uint32_t)got) {
            if (r[i]->mem == NULL && r[i]->fd >= 0) {
                off_t at = (off_t)(r[i]->fd_off + off[i] + pos);
                got = sendfile(ch->fd, r[i]->fd, &at, k[i] - pos);
            } else {
                got = send(ch->fd, (r[i]->mem != NULL ? r[i]->mem + off[i] : dp_zeros) + pos,
                           k[i] - pos, MSG_DONTWAIT | MSG_NOSIGNAL
                           | (i + 1 < n ? MSG_MORE : 0));
            }
            if (got <= 0)
                break;
        }
        if (pos < k[i]) {
            if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
                goto failed;
            if (got == 0 && r[i]->mem == NULL && r[i]->fd >= 0)
                goto failed;  /* (the memfd is shorter than its route: cannot be) */
            break;
        }
    }
    if (hsent == sizeof(head) && i == n) {
        pthread_mutex_unlock(&ch->lock);
        return 1;
    }
    /* The rest, queued: the head's, then piece i from pos and every one after it. */
    if (hsent < sizeof(head)) {
        dp->iov[niov].iov_base = head + hsent;
        dp->iov[niov++].iov_len = sizeof(head) - hsent;
        i = 0;
        pos = 0;
    }
    for (; i < n; i++, pos = 0) {
        char *piece;
        if (r[i]->mem != NULL) {
            piece = (char *)r[i]->mem + off[i] + pos;
        } else if (r[i]->fd < 0) {
            piece = dp_zeros + pos;
        } else {
            piece = dp->scratch + used;
            if (pread(r[i]->fd, piece, k[i] - pos, (off_t)(r[i]->fd_off + off[i] + pos))
                    != (ssize_t)(k[i] - pos)) {
                errno = EIO;
                goto failed;
            }
            used += k[i] - pos;
        }
        dp->iov[niov].iov_base = piece;
        dp->iov[niov++].iov_len = k[i] - pos;
    }
    dp_sendv(dp, ch, dp->iov, niov);
    pthread_mutex_unlock(&ch->lock);
    return 1;
failed:
    snprintf(why, sizeof(why), "send failed: %s", strerror(errno));
    dp_break(dp, ch, why);
    pthread_mutex_unlock(&ch->lock);
    return 1;
}
