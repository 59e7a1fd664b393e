/*
 * The libtirpc server of the bench program (bench_prog.x): the procedures
 * and a main that serves them over TCP on 127.0.0.1:PORT.
 *
 *   bench_prog_server PORT        PORT 0 picks a free port
 *
 * Prints "ready <port>" on stdout once listening. Nothing is registered
 * with rpcbind (svc_register with protocol 0), so several servers can run
 * at once and none of them disturbs a registration made by rpcrdmad.
 * SIGTERM or SIGINT: stops serving and exits 0.
 *
 * One thread serves every connection from the usual svc_getreq_poll loop:
 * libtirpc's status quo for a user-level server. Built by bench/build.rs.
 */
#define _GNU_SOURCE /* ppoll */
#include "bench_prog.h"
#include "bench_prog_pattern.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The dispatch routine rpcgen -m generates into bench_prog_svc.c. */
void bench_prog_1(struct svc_req *rqstp, SVCXPRT *transp);

/* libtirpc's table of descriptors svc_getreq_poll serves (<rpc/svc.h>). */
extern struct pollfd *svc_pollfd;
extern int svc_max_pollfd;

/*
 * libtirpc caps TCP record buffers at 256 KiB; asking for more gets the
 * cap. Larger messages travel as several record fragments.
 */
#define XPRT_BUFSIZE (1u << 20)

/* Every SOURCE reply points into this buffer, filled once at start. */
static char *source_bytes;

static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig)
{
	(void)sig;
	stop_requested = 1;
}

bool_t bench_null_1_svc(void *argp, void *result, struct svc_req *rqstp)
{
	(void)argp;
	(void)result;
	(void)rqstp;
	return TRUE;
}

bool_t bench_echo_1_svc(bench_data *argp, bench_data *result,
			struct svc_req *rqstp)
{
	(void)rqstp;
	/*
	 * The reply borrows the decoded argument: the dispatcher sends the
	 * reply before it frees the arguments, and freeresult frees nothing.
	 */
	*result = *argp;
	return TRUE;
}

bool_t bench_sink_1_svc(bench_data *argp, void *result, struct svc_req *rqstp)
{
	(void)argp;
	(void)result;
	(void)rqstp;
	return TRUE;
}

bool_t bench_source_1_svc(u_int *argp, bench_data *result,
			  struct svc_req *rqstp)
{
	if (*argp > BENCH_MAXDATA) {
		/* Outside the program's range: GARBAGE_ARGS, as documented. */
		svcerr_decode(rqstp->rq_xprt);
		return FALSE;
	}
	result->bench_data_len = *argp;
	result->bench_data_val = source_bytes;
	return TRUE;
}

int bench_prog_1_freeresult(SVCXPRT *transp, xdrproc_t xdr_result,
			    caddr_t result)
{
	/* Results borrow the argument or the static SOURCE buffer. */
	(void)transp;
	(void)xdr_result;
	(void)result;
	return 1;
}

static int parse_port(const char *s, unsigned short *port)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v > 65535)
		return -1;
	*port = (unsigned short)v;
	return 0;
}

static int listen_loopback(unsigned short port, unsigned short *bound)
{
	struct sockaddr_in sin;
	socklen_t len = sizeof(sin);
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0) {
		perror("bench_prog_server: socket");
		return -1;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	/* Accepted sockets inherit TCP_NODELAY from the listener on Linux. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons(port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		fprintf(stderr, "bench_prog_server: bind 127.0.0.1:%u: %s\n",
			port, strerror(errno));
		close(fd);
		return -1;
	}
	if (listen(fd, 128) < 0) {
		perror("bench_prog_server: listen");
		close(fd);
		return -1;
	}
	if (getsockname(fd, (struct sockaddr *)&sin, &len) < 0) {
		perror("bench_prog_server: getsockname");
		close(fd);
		return -1;
	}
	*bound = ntohs(sin.sin_port);
	return fd;
}

/*
 * svc_run, but it returns when SIGTERM or SIGINT arrives: the signals are
 * blocked except inside ppoll, so none can slip in between the flag test
 * and the wait.
 */
static int serve_until_signal(void)
{
	sigset_t blocked, during_poll;
	struct sigaction sa;
	struct pollfd *fds = NULL;
	int cap = 0;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigemptyset(&blocked);
	sigaddset(&blocked, SIGTERM);
	sigaddset(&blocked, SIGINT);
	sigprocmask(SIG_BLOCK, &blocked, &during_poll);
	sigdelset(&during_poll, SIGTERM);
	sigdelset(&during_poll, SIGINT);

	while (!stop_requested) {
		int n = svc_max_pollfd;
		int ready;

		if (n > cap) {
			struct pollfd *grown = realloc(fds, (size_t)n * sizeof(*fds));

			if (grown == NULL) {
				perror("bench_prog_server: realloc");
				free(fds);
				return -1;
			}
			fds = grown;
			cap = n;
		}
		for (int i = 0; i < n; i++) {
			fds[i].fd = svc_pollfd[i].fd;
			fds[i].events = svc_pollfd[i].events;
			fds[i].revents = 0;
		}
		ready = ppoll(fds, (nfds_t)n, NULL, &during_poll);
		if (ready < 0) {
			if (errno == EINTR)
				continue;
			perror("bench_prog_server: ppoll");
			free(fds);
			return -1;
		}
		if (ready > 0)
			svc_getreq_poll(fds, ready);
	}
	free(fds);
	return 0;
}

int main(int argc, char **argv)
{
	unsigned short port, bound;
	SVCXPRT *xprt;
	int fd;

	if (argc != 2 || parse_port(argv[1], &port) != 0) {
		fprintf(stderr, "usage: bench_prog_server PORT   (0: any free port)\n");
		return 2;
	}
	/* A client that goes away mid-reply must not kill the server. */
	signal(SIGPIPE, SIG_IGN);

	source_bytes = malloc(BENCH_MAXDATA > 0 ? BENCH_MAXDATA : 1);
	if (source_bytes == NULL) {
		perror("bench_prog_server: malloc");
		return 1;
	}
	bench_pattern_fill((unsigned char *)source_bytes, BENCH_MAXDATA, 0);

	fd = listen_loopback(port, &bound);
	if (fd < 0)
		return 1;
	xprt = svc_vc_create(fd, XPRT_BUFSIZE, XPRT_BUFSIZE);
	if (xprt == NULL) {
		fprintf(stderr, "bench_prog_server: svc_vc_create failed\n");
		return 1;
	}
	/* Protocol 0: dispatch locally, tell no portmapper. */
	if (!svc_register(xprt, BENCH_PROG, BENCH_VERS, bench_prog_1, 0)) {
		fprintf(stderr, "bench_prog_server: svc_register failed\n");
		return 1;
	}
	printf("ready %u\n", bound);
	fflush(stdout);

	if (serve_until_signal() != 0)
		return 1;
	/*
	 * No svc_unregister: it would also pmap_unset the program at the
	 * local rpcbind, dropping a registration that belongs to rpcrdmad.
	 */
	svc_destroy(xprt);
	free(source_bytes);
	return 0;
}
