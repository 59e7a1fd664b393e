/* What a sender pays per GB of 4,096-byte payload to hand it to the
 * kernel by TCP, by UDP GSO and by an AF_XDP socket in copy mode, without
 * our code: one side of a run of deploy/xdp-paths, which joins two
 * network namespaces by a veth (MTU 9000, one queue) and runs `recv MODE`
 * in one and `send MODE` in the other.
 *
 *   tcp       write(2)s of 61,440 bytes on a connected TCP socket, as RPC
 *             over TCP sends; the receiver recv(2)s them.
 *   udp-gso   one UDP GSO sendmsg(2) of 15 datagrams of 4,124 bytes, each
 *             a 24-byte header, the 4,096-byte payload from where it lies
 *             and a 4-byte trailer: 45 iovecs, as the roce provider sends.
 *             The receiver has UDP_GRO on, as the provider's has.
 *   xsk       the same datagrams built by the sender in an AF_XDP
 *             socket's UMEM (headers from a template, the payload copied
 *             from where it lies) and sent in copy mode: a veth has no
 *             zero copy, so the kernel copies each frame into an skb. A
 *             4,166-byte frame spans two 4,096-byte chunks, hence
 *             XDP_USE_SG and two descriptors a frame. 64 frames per
 *             sendto(2) kick; the kernel sends at most 32 descriptors a
 *             kick by default. The receiver's veth runs
 *             deploy/xdp-paths-kern.c, which redirects every frame to an
 *             AF_XDP socket (copy mode again: into its UMEM); the
 *             receiver sleeps in poll(2) when its ring is empty.
 *   xsk-spin  the same with a send budget of 256 descriptors a kick
 *             (XDP_MAX_TX_SKB_BUDGET, new in 2025; an older kernel keeps
 *             32 and the sender says so) and 128 frames a kick, and a
 *             receiver that spins on its ring: the cheapest AF_XDP sender
 *             of the variants tried.
 *
 * The payload is read in order from a 64 MiB region, more than the
 * caches hold, as a server's registered memory would be. `send xsk
 * --nocopy` (by hand; the script does not use it) leaves the payload copy
 * out, to see what that copy costs the sender.
 *
 * The sender's figure is its process CPU clock over the run. On a veth
 * the receiving half's kernel work (the receive up to the socket; for
 * xsk the XDP program and the copy into the receiver's UMEM) runs in
 * softirq on the sending core, mostly inside the send call, so it counts
 * there unless the kernel keeps softirq time apart
 * (CONFIG_IRQ_TIME_ACCOUNTING; deploy/xdp-paths warns). The receiver's
 * figure is its CPU clock from its first data to its last: what it pays
 * to take the data off its socket or ring.
 *
 * Each side prints one line, `send|recv pkts=N bytes=N secs=S cpu=S`
 * (pkts: datagrams, or 4,096-byte units for TCP; bytes: payload only).
 * The receiver prints `ready` once it can take data and stops on SIGTERM
 * once its queue is empty. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <errno.h>
#include <getopt.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* Newer than some distributions' headers. */
#ifndef SOL_XDP
#define SOL_XDP 283
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif
#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif
#ifndef XDP_MAX_TX_SKB_BUDGET
#define XDP_MAX_TX_SKB_BUDGET 9
#endif

#define PORT 4791
#define HEAD 24
#define PAYLOAD 4096
#define TRAILER 4
#define SEG (HEAD + PAYLOAD + TRAILER) /* 4,124: one datagram */
#define PACKETS 15                     /* datagrams per GSO send */
#define TCP_WRITE 61440
#define HDRS (14 + 20 + 8) /* Ethernet, IPv4, UDP */
#define FRAME (HDRS + SEG) /* 4,166 */
#define CHUNK 4096
#define FRAME_CHUNKS ((FRAME + CHUNK - 1) / CHUNK)
#define WINDOW (64u << 20)

static struct {
    const char *ifname, *dst, *src, *dmac, *bpf;
    int core, nocopy;
    double secs;
} opt = {.core = -1, .secs = 1.5};
static volatile sig_atomic_t stop;
static char *region; /* the sender's payload source */

static void die(const char *what)
{
    fprintf(stderr, "xdp-paths: %s: %s\n", what, strerror(errno));
    exit(1);
}

static void fail(const char *fmt, ...)
{
    va_list a;
    va_start(a, fmt);
    fputs("xdp-paths: ", stderr);
    vfprintf(stderr, fmt, a);
    fputc('\n', stderr);
    va_end(a);
    exit(1);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Both sides are single-threaded, so the process clock is the thread's. */
static double cpu(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void report(const char *side, uint64_t pkts, uint64_t bytes, double secs, double cpus)
{
    printf("%s pkts=%llu bytes=%llu secs=%.6f cpu=%.6f\n", side, (unsigned long long)pkts,
           (unsigned long long)bytes, secs, cpus);
    fflush(stdout);
}

static void ready(void)
{
    puts("ready");
    fflush(stdout);
}

static const char *payload(uint64_t n)
{
    return region + (n * PAYLOAD) % WINDOW;
}

/* The receiver's account: from its first data to its last, so neither the
 * wait for the sender nor the wait for SIGTERM counts. Its CPU clock is a
 * system call, so it is read at most every 5 ms; that drops no more than
 * 5 ms at the end. */
struct tally {
    uint64_t pkts, bytes;
    double t0, c0, t1, c1, read_at;
};

static void got(struct tally *r, uint64_t pkts, uint64_t bytes)
{
    double t = now();
    if (!r->bytes) {
        r->t0 = r->read_at = t;
        r->c0 = r->c1 = cpu();
    } else if (t - r->read_at > 0.005) {
        r->read_at = t;
        r->c1 = cpu();
    }
    r->t1 = t;
    r->pkts += pkts;
    r->bytes += bytes;
}

static void tally_report(struct tally *r)
{
    report("recv", r->pkts, r->bytes, r->t1 - r->t0, r->c1 - r->c0);
}

/* The same fixed socket buffers for TCP and UDP, so neither depends on
 * autotuning within a 1.5 s run. */
static void buffers(int fd, int which)
{
    int big = 8 << 20;
    if (setsockopt(fd, SOL_SOCKET, which, &big, sizeof big)) die("socket buffer");
}

/* A receive timeout, so a blocked receiver sees SIGTERM however it lands. */
static void rcvtimeo(int fd)
{
    struct timeval tv = {0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static struct sockaddr_in peer(const char *ip)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(PORT)};
    if (ip && inet_pton(AF_INET, ip, &a.sin_addr) != 1) fail("bad address %s", ip);
    return a;
}

/* ---- TCP ---- */

static void tcp_send(void)
{
    struct sockaddr_in a = peer(opt.dst);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    buffers(fd, SO_SNDBUFFORCE);
    if (connect(fd, (void *)&a, sizeof a)) die("connect");
    uint64_t bytes = 0;
    double c0 = cpu(), t0 = now();
    for (uint64_t n = 0; !stop; n++) {
        if ((n & 15) == 0 && now() - t0 >= opt.secs) break;
        ssize_t w = write(fd, region + n * TCP_WRITE % WINDOW, TCP_WRITE);
        if (w < 0 && errno != EINTR) die("write");
        if (w > 0) bytes += w;
    }
    report("send", bytes / PAYLOAD, bytes, now() - t0, cpu() - c0);
    close(fd);
}

static void tcp_recv(void)
{
    struct sockaddr_in a = peer(NULL);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1, fd;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    buffers(l, SO_RCVBUFFORCE); /* the accepted socket inherits it */
    rcvtimeo(l);
    if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) die("tcp listen");
    ready();
    while ((fd = accept(l, NULL, NULL)) < 0)
        if (stop) fail("no connection");
    rcvtimeo(fd);
    char *buf = malloc(1 << 18);
    struct tally t = {0};
    for (;;) {
        ssize_t r = recv(fd, buf, 1 << 18, 0);
        if (r > 0) got(&t, 0, r);
        else if (r == 0 || (errno != EAGAIN && errno != EINTR)) break;
        else if (stop) break;
    }
    t.pkts = t.bytes / PAYLOAD;
    tally_report(&t);
}

/* ---- UDP GSO ---- */

static void udp_send(void)
{
    struct sockaddr_in a = peer(opt.dst);
    int fd = socket(AF_INET, SOCK_DGRAM, 0), seg = SEG;
    buffers(fd, SO_SNDBUFFORCE);
    if (connect(fd, (void *)&a, sizeof a)) die("connect");
    if (setsockopt(fd, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg)) die("UDP_SEGMENT");
    char head[PACKETS][HEAD] = {{0}}, trailer[TRAILER] = {0};
    struct iovec iov[3 * PACKETS];
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = 3 * PACKETS};
    uint64_t seq = 0;
    double c0 = cpu(), t0 = now();
    for (uint64_t n = 0; !stop; n++) {
        if ((n & 15) == 0 && now() - t0 >= opt.secs) break;
        for (int k = 0; k < PACKETS; k++) {
            uint64_t s = seq + k;
            memcpy(head[k], &s, sizeof s);
            iov[3 * k] = (struct iovec){head[k], HEAD};
            iov[3 * k + 1] = (struct iovec){(void *)payload(s), PAYLOAD};
            iov[3 * k + 2] = (struct iovec){trailer, TRAILER};
        }
        if (sendmsg(fd, &m, 0) < 0) {
            /* A full device queue, or an early ICMP error: send again. */
            if (errno == ENOBUFS || errno == EAGAIN || errno == EINTR || errno == ECONNREFUSED) continue;
            die("sendmsg");
        }
        seq += PACKETS;
    }
    report("send", seq, seq * PAYLOAD, now() - t0, cpu() - c0);
}

static void udp_recv(void)
{
    struct sockaddr_in a = peer(NULL);
    int fd = socket(AF_INET, SOCK_DGRAM, 0), one = 1;
    buffers(fd, SO_RCVBUFFORCE);
    if (setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one)) die("UDP_GRO");
    if (bind(fd, (void *)&a, sizeof a)) die("udp bind");
    rcvtimeo(fd);
    ready();
    char *buf = malloc(1 << 17), cbuf[CMSG_SPACE(sizeof(int))];
    struct tally t = {0};
    for (;;) {
        struct iovec iov = {buf, 1 << 17};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
        int drain = stop; /* once stopped, take what is queued and go */
        ssize_t r = recvmsg(fd, &m, drain ? MSG_DONTWAIT : 0);
        if (r < 0) {
            if (errno != EAGAIN && errno != EINTR) die("recvmsg");
            if (drain) break;
            continue;
        }
        /* With UDP_GRO one read may hold many datagrams of gso_size. */
        int size = r;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
            if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) memcpy(&size, CMSG_DATA(c), sizeof size);
        if (size == SEG) got(&t, r / SEG, r / SEG * PAYLOAD);
    }
    tally_report(&t);
}

/* ---- AF_XDP ---- */

struct ring {
    uint32_t *prod, *cons, mask, size;
    void *descs;
};

struct xsk {
    int fd;
    char *umem;
    uint32_t chunks;
    struct ring fill, comp, rx, tx;
};

static void map_ring(int fd, const struct xdp_ring_offset *o, off_t pgoff, uint32_t n, size_t esz, struct ring *r)
{
    char *p = mmap(NULL, o->desc + n * esz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, pgoff);
    if (p == MAP_FAILED) die("mmap ring");
    r->prod = (uint32_t *)(p + o->producer);
    r->cons = (uint32_t *)(p + o->consumer);
    r->descs = p + o->desc;
    r->size = n;
    r->mask = n - 1;
}

/* An AF_XDP socket with a UMEM of `chunks` 4,096-byte chunks, fill and
 * completion rings as large, and an RX or a TX ring of `ring` entries,
 * bound to queue 0 of ifindex. */
static void xsk_open(struct xsk *x, int ifindex, uint32_t chunks, uint32_t ring, int rx, uint16_t flags, int budget)
{
    x->fd = socket(AF_XDP, SOCK_RAW, 0);
    if (x->fd < 0) die("AF_XDP socket");
    x->chunks = chunks;
    x->umem = mmap(NULL, (size_t)chunks * CHUNK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (x->umem == MAP_FAILED) die("mmap UMEM");
    struct xdp_umem_reg reg = {.addr = (uintptr_t)x->umem, .len = (uint64_t)chunks * CHUNK, .chunk_size = CHUNK};
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_REG, &reg, sizeof reg)) die("XDP_UMEM_REG");
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_FILL_RING, &chunks, sizeof chunks)) die("XDP_UMEM_FILL_RING");
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_COMPLETION_RING, &chunks, sizeof chunks)) die("XDP_UMEM_COMPLETION_RING");
    if (setsockopt(x->fd, SOL_XDP, rx ? XDP_RX_RING : XDP_TX_RING, &ring, sizeof ring)) die("XDP ring");
    struct xdp_mmap_offsets off;
    socklen_t len = sizeof off;
    if (getsockopt(x->fd, SOL_XDP, XDP_MMAP_OFFSETS, &off, &len)) die("XDP_MMAP_OFFSETS");
    map_ring(x->fd, &off.fr, XDP_UMEM_PGOFF_FILL_RING, chunks, sizeof(uint64_t), &x->fill);
    map_ring(x->fd, &off.cr, XDP_UMEM_PGOFF_COMPLETION_RING, chunks, sizeof(uint64_t), &x->comp);
    if (rx) map_ring(x->fd, &off.rx, XDP_PGOFF_RX_RING, ring, sizeof(struct xdp_desc), &x->rx);
    else map_ring(x->fd, &off.tx, XDP_PGOFF_TX_RING, ring, sizeof(struct xdp_desc), &x->tx);
    if (budget && setsockopt(x->fd, SOL_XDP, XDP_MAX_TX_SKB_BUDGET, &budget, sizeof budget))
        fprintf(stderr, "xdp-paths: XDP_MAX_TX_SKB_BUDGET: %s; the kernel's default budget instead\n", strerror(errno));
    struct sockaddr_xdp sa = {.sxdp_family = AF_XDP, .sxdp_ifindex = ifindex, .sxdp_queue_id = 0, .sxdp_flags = flags};
    if (bind(x->fd, (void *)&sa, sizeof sa)) die("bind AF_XDP");
}

static uint16_t ip_checksum(const void *p, int len)
{
    const uint16_t *w = p;
    uint32_t s = 0;
    for (; len > 1; len -= 2) s += *w++;
    while (s >> 16) s = (s & 0xffff) + (s >> 16);
    return ~s;
}

static void mac(const char *s, uint8_t *m)
{
    unsigned v[6];
    if (!s || sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) fail("bad MAC %s", s ? s : "(none)");
    for (int i = 0; i < 6; i++) m[i] = v[i];
}

/* Writes len bytes at offset off of a frame laid over chunks at[]. */
static void put(char *umem, const uint64_t *at, size_t off, const void *src, size_t len)
{
    while (len) {
        size_t o = off % CHUNK, n = CHUNK - o < len ? CHUNK - o : len;
        memcpy(umem + at[off / CHUNK] + o, src, n);
        off += n;
        src = (const char *)src + n;
        len -= n;
    }
}

static void xsk_send(int spin)
{
    int ifindex = if_nametoindex(opt.ifname);
    if (!ifindex) die(opt.ifname);

    uint8_t tmpl[HDRS] = {0};
    struct ethhdr *eth = (void *)tmpl;
    struct ifreq ifr = {0};
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", opt.ifname);
    if (ioctl(s, SIOCGIFHWADDR, &ifr)) die("SIOCGIFHWADDR");
    close(s);
    memcpy(eth->h_source, ifr.ifr_hwaddr.sa_data, ETH_ALEN);
    mac(opt.dmac, eth->h_dest);
    eth->h_proto = htons(ETH_P_IP);
    struct iphdr *ip = (void *)(tmpl + 14);
    ip->version = 4;
    ip->ihl = 5;
    ip->ttl = 64;
    ip->protocol = IPPROTO_UDP;
    ip->tot_len = htons(FRAME - 14);
    ip->frag_off = htons(0x4000); /* don't fragment */
    ip->saddr = peer(opt.src).sin_addr.s_addr;
    ip->daddr = peer(opt.dst).sin_addr.s_addr;
    ip->check = ip_checksum(ip, 20);
    struct udphdr *udp = (void *)(tmpl + 34);
    udp->source = udp->dest = htons(PORT);
    udp->len = htons(8 + SEG); /* checksum 0: none, allowed over IPv4 */

    /* 2,048 TX descriptors, 8,192 chunks: the ring never waits for chunks. */
    struct xsk x;
    xsk_open(&x, ifindex, 8192, 2048, 0, XDP_COPY | XDP_USE_SG, spin ? 256 : 0);
    uint32_t batch = spin ? 128 : 64;
    uint64_t *free_chunks = malloc(x.chunks * sizeof *free_chunks), *completions = x.comp.descs;
    uint32_t nfree = 0;
    for (uint32_t i = 0; i < x.chunks; i++) free_chunks[nfree++] = (uint64_t)i * CHUNK;
    struct xdp_desc *tx = x.tx.descs;
    uint32_t prod = *x.tx.prod;
    uint64_t frames = 0, posted = 0, completed = 0, kicks = 0;
    char head[HEAD] = {0}, trailer[TRAILER] = {0};
    double c0 = cpu(), t0 = now(), t_end = 0;
    for (;;) {
        uint32_t cp = __atomic_load_n(x.comp.prod, __ATOMIC_ACQUIRE), cc = *x.comp.cons;
        for (; cc != cp; cc++, completed++) free_chunks[nfree++] = completions[cc & x.comp.mask];
        __atomic_store_n(x.comp.cons, cc, __ATOMIC_RELEASE);
        if (t_end) {
            /* Copy mode completes within sendto(2); this is a backstop. */
            if (completed == posted || now() - t_end > 1.0) break;
            sendto(x.fd, NULL, 0, MSG_DONTWAIT, NULL, 0);
            continue;
        }
        uint32_t room = x.tx.size - (prod - __atomic_load_n(x.tx.cons, __ATOMIC_ACQUIRE));
        for (uint32_t n = 0; n < batch && nfree >= FRAME_CHUNKS && room >= FRAME_CHUNKS; n++) {
            uint64_t at[FRAME_CHUNKS];
            for (int d = 0; d < FRAME_CHUNKS; d++) at[d] = free_chunks[--nfree];
            memcpy(head, &frames, sizeof frames);
            put(x.umem, at, 0, tmpl, HDRS);
            put(x.umem, at, HDRS, head, HEAD);
            if (!opt.nocopy) put(x.umem, at, HDRS + HEAD, payload(frames), PAYLOAD);
            put(x.umem, at, HDRS + HEAD + PAYLOAD, trailer, TRAILER);
            for (int d = 0; d < FRAME_CHUNKS; d++, prod++) {
                uint32_t len = d < FRAME_CHUNKS - 1 ? CHUNK : FRAME - CHUNK * (FRAME_CHUNKS - 1);
                tx[prod & x.tx.mask] = (struct xdp_desc){
                    .addr = at[d], .len = len, .options = d < FRAME_CHUNKS - 1 ? XDP_PKT_CONTD : 0};
            }
            room -= FRAME_CHUNKS;
            posted += FRAME_CHUNKS;
            frames++;
        }
        __atomic_store_n(x.tx.prod, prod, __ATOMIC_RELEASE);
        /* In copy mode the kernel sends only inside this call. EAGAIN: the
         * budget ran out with descriptors left, sent at the next kick. */
        if (sendto(x.fd, NULL, 0, MSG_DONTWAIT, NULL, 0) < 0 && errno != EAGAIN && errno != EBUSY &&
            errno != ENOBUFS && errno != EINTR)
            die("sendto");
        if ((++kicks & 7) == 0 && now() - t0 >= opt.secs) t_end = now();
        if (stop && !t_end) t_end = now();
    }
    report("send", frames, frames * PAYLOAD, t_end - t0, cpu() - c0);
}

static int bpf_warnings(enum libbpf_print_level level, const char *fmt, va_list a)
{
    return level == LIBBPF_WARN ? vfprintf(stderr, fmt, a) : 0;
}

static void xsk_recv(int spin)
{
    int ifindex = if_nametoindex(opt.ifname);
    if (!ifindex) die(opt.ifname);
    libbpf_set_print(bpf_warnings);
    struct bpf_object *obj = bpf_object__open_file(opt.bpf, NULL);
    if (!obj) die(opt.bpf ? opt.bpf : "no --bpf object");
    if (bpf_object__load(obj)) die("loading the XDP program");
    struct bpf_program *prog = bpf_object__find_program_by_name(obj, "xsk_redirect");
    int map = bpf_object__find_map_fd_by_name(obj, "xsks");
    if (!prog || map < 0) fail("%s: no xsk_redirect or xsks", opt.bpf);

    /* 8,192 RX descriptors and 16,384 chunks, all in the fill ring: a
     * receiver behind by a few milliseconds loses nothing. */
    struct xsk x;
    xsk_open(&x, ifindex, 16384, 8192, 1, XDP_COPY | XDP_USE_SG, 0);
    uint64_t *fill = x.fill.descs;
    uint32_t fprod = 0;
    for (uint32_t i = 0; i < x.chunks; i++) fill[fprod++ & x.fill.mask] = (uint64_t)i * CHUNK;
    __atomic_store_n(x.fill.prod, fprod, __ATOMIC_RELEASE);
    int key = 0;
    if (bpf_map_update_elem(map, &key, &x.fd, 0)) die("XSKMAP update");
    int err = bpf_xdp_attach(ifindex, bpf_program__fd(prog), XDP_FLAGS_DRV_MODE, NULL);
    if (err) fail("attaching XDP to %s: %s", opt.ifname, strerror(-err));
    ready();

    struct xdp_desc *rx = x.rx.descs;
    struct tally t = {0};
    uint32_t cons = *x.rx.cons, frame_len = 0;
    for (;;) {
        uint32_t prod = __atomic_load_n(x.rx.prod, __ATOMIC_ACQUIRE);
        if (prod == cons) {
            if (stop) break; /* stopped and drained */
            if (!spin) poll(&(struct pollfd){.fd = x.fd, .events = POLLIN}, 1, 100);
            continue;
        }
        uint64_t frames = 0;
        for (; cons != prod; cons++) {
            struct xdp_desc *d = &rx[cons & x.rx.mask];
            frame_len += d->len;
            if (!(d->options & XDP_PKT_CONTD)) {
                frames += frame_len == FRAME; /* anything else is not ours */
                frame_len = 0;
            }
            fill[fprod++ & x.fill.mask] = d->addr & ~(uint64_t)(CHUNK - 1);
        }
        __atomic_store_n(x.rx.cons, cons, __ATOMIC_RELEASE);
        __atomic_store_n(x.fill.prod, fprod, __ATOMIC_RELEASE);
        if (frames) got(&t, frames, frames * PAYLOAD);
    }
    bpf_xdp_detach(ifindex, XDP_FLAGS_DRV_MODE, NULL);
    tally_report(&t);
}

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static void pin(int core)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(core, &s);
    if (sched_setaffinity(0, sizeof s, &s)) die("pinning to the core");
}

int main(int argc, char **argv)
{
    static const struct option longs[] = {
        {"if", 1, 0, 'i'},   {"core", 1, 0, 'c'}, {"secs", 1, 0, 's'},   {"dst", 1, 0, 'd'},
        {"src", 1, 0, 'a'},  {"dmac", 1, 0, 'm'}, {"bpf", 1, 0, 'b'},    {"nocopy", 0, 0, 'n'},
        {0, 0, 0, 0}};
    const char *usage = "usage: xdp-paths send|recv tcp|udp-gso|xsk|xsk-spin --if IF [--core N]\n"
                        "  send: --dst IP [--secs S]; xsk: --src IP --dmac MAC [--nocopy]\n"
                        "  recv xsk*: --bpf xdp-paths-kern.o\n";
    if (argc < 3) return fputs(usage, stderr), 2;
    const char *side = argv[1], *mode = argv[2];
    int c;
    optind = 3;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) switch (c) {
        case 'i': opt.ifname = optarg; break;
        case 'c': opt.core = atoi(optarg); break;
        case 's': opt.secs = atof(optarg); break;
        case 'd': opt.dst = optarg; break;
        case 'a': opt.src = optarg; break;
        case 'm': opt.dmac = optarg; break;
        case 'b': opt.bpf = optarg; break;
        case 'n': opt.nocopy = 1; break;
        default: return fputs(usage, stderr), 2;
        }
    int send = !strcmp(side, "send");
    if ((!send && strcmp(side, "recv")) || !opt.ifname || (send && !opt.dst)) return fputs(usage, stderr), 2;
    if (send && !strncmp(mode, "xsk", 3) && (!opt.src || !opt.dmac)) return fputs(usage, stderr), 2;

    /* No SA_RESTART: a blocked call returns EINTR and the loop looks at stop. */
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (opt.core >= 0) pin(opt.core);
    if (send) {
        region = mmap(NULL, WINDOW + TCP_WRITE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED) die("mmap");
        memset(region, 0xa5, WINDOW + TCP_WRITE); /* touched, as registered memory is */
    }
    if (!strcmp(mode, "tcp")) send ? tcp_send() : tcp_recv();
    else if (!strcmp(mode, "udp-gso")) send ? udp_send() : udp_recv();
    else if (!strcmp(mode, "xsk") || !strcmp(mode, "xsk-spin")) {
        int spin = !strcmp(mode, "xsk-spin");
        send ? xsk_send(spin) : xsk_recv(spin);
    } else return fputs(usage, stderr), 2;
    return 0;
}
