/* The kernel's per-byte cost of the two paths roce and RPC over TCP take
 * on loopback, without our code: what a sender pays to move 60 KB
 *
 *   tcp      write(2) of 61,440 bytes on a connected TCP socket;
 *   gso45    one UDP GSO send of 15 packets laid out as roce sends a
 *            payload from where it lies: per packet a 12-byte header, the
 *            4,096-byte payload and a 4-byte trailer, 45 iovecs;
 *   gso1     the same bytes in one iovec.
 *
 * A thread on the receiving core drains the socket (UDP with UDP_GRO, as
 * the roce provider's), so the sender pays what a roce or TCP server
 * pays. Prints the sender's CPU seconds per GB and the rate, per mode.
 * Run by deploy/kernel-paths; see docs/BENCHMARKS.md. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define SOL_UDP_ 17
#define UDP_SEGMENT_ 103
#define UDP_GRO_ 104
#define PACKETS 15
#define PAYLOAD 4096
#define HEAD 12
#define TRAILER 4

static int rx_fd;
static volatile int stop;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int core) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(core, &s);
    sched_setaffinity(0, sizeof s, &s);
}

static double thread_cpu(void) {
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

static void *drain(void *core) {
    pin(*(int *)core);
    char *b = malloc(1 << 20);
    while (!stop)
        recv(rx_fd, b, 1 << 20, MSG_DONTWAIT);
    free(b);
    return NULL;
}

static int run(const char *mode, int port, int send_core, int recv_core, double secs) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int tcp = strcmp(mode, "tcp") == 0, one = 1, s;
    if (tcp) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (void *)&a, sizeof a) || listen(l, 1)) return perror("tcp listen"), 1;
        s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (void *)&a, sizeof a)) return perror("tcp connect"), 1;
        rx_fd = accept(l, NULL, NULL);
        close(l);
    } else {
        int big = 4 << 20, seg = HEAD + PAYLOAD + TRAILER;
        rx_fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (bind(rx_fd, (void *)&a, sizeof a)) return perror("udp bind"), 1;
        setsockopt(rx_fd, SOL_UDP_, UDP_GRO_, &one, sizeof one);
        setsockopt(rx_fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
        s = socket(AF_INET, SOCK_DGRAM, 0);
        setsockopt(s, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big);
        if (setsockopt(s, SOL_UDP_, UDP_SEGMENT_, &seg, sizeof seg)) return perror("UDP_SEGMENT"), 1;
        if (connect(s, (void *)&a, sizeof a)) return perror("udp connect"), 1;
    }
    /* 4 MiB of payload, touched, as registered memory is. */
    size_t area = 4 << 20;
    char *src = mmap(NULL, area, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(src, 1, area);
    char head[HEAD] = {0}, trailer[TRAILER] = {0};
    stop = 0;
    pthread_t t;
    pthread_create(&t, NULL, drain, &recv_core);
    pin(send_core);
    double c0 = thread_cpu(), t0 = now();
    long bytes = 0;
    for (long n = 0; now() - t0 < secs; n++) {
        long w;
        if (tcp) {
            w = write(s, src + (n % 64) * 61440, 61440);
        } else {
            struct iovec iov[3 * PACKETS];
            size_t len = PACKETS * (HEAD + PAYLOAD + TRAILER);
            char *base = src + (n % 60) * 65536;
            for (int k = 0; k < PACKETS; k++) {
                iov[3 * k] = (struct iovec){head, HEAD};
                iov[3 * k + 1] = (struct iovec){base + (size_t)k * PAYLOAD, PAYLOAD};
                iov[3 * k + 2] = (struct iovec){trailer, TRAILER};
            }
            struct iovec whole = {base, len};
            int gso1 = strcmp(mode, "gso1") == 0;
            struct msghdr m = {.msg_iov = gso1 ? &whole : iov, .msg_iovlen = gso1 ? 1 : 3 * PACKETS};
            w = sendmsg(s, &m, 0);
        }
        if (w > 0) bytes += w;
    }
    double el = now() - t0, cpu = thread_cpu() - c0;
    stop = 1;
    pthread_join(t, NULL);
    printf("%-6s %6.2f GB/s  sender %.3f s/GB\n", mode, bytes / 1e9 / el, cpu / (bytes / 1e9));
    close(s);
    close(rx_fd);
    munmap(src, area);
    return 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    int send_core = argc > 2 ? atoi(argv[2]) : 0, recv_core = argc > 3 ? atoi(argv[3]) : 1;
    const char *only = argc > 4 ? argv[4] : NULL; /* one mode, e.g. under perf */
    const char *modes[] = {"tcp", "gso45", "gso1"};
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 3; i++)
            if ((!only || strcmp(only, modes[i]) == 0) &&
                run(modes[i], 47900 + r * 3 + i, send_core, recv_core, 1.0))
                return 1;
    return 0;
}
