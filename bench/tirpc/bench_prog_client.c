/*
 * The libtirpc client driver of the bench program (bench_prog.x): runs one
 * workload through the rpcgen -M client stubs over TCP and prints one JSON
 * line on stdout. No rpcbind: it connects straight to HOST:PORT.
 *
 *   bench_prog_client --port P [--host A] MODE [options]
 *
 *   lat    --proc null|echo|sink|source --size N
 *          (--iterations K | --seconds S) [--warmup W]
 *          one call outstanding; per-call latency from CLOCK_MONOTONIC,
 *          percentiles by nearest rank over the measured calls (K calls, or
 *          as many as fit in S seconds when --seconds is given)
 *   rate   --depth D --seconds S       D threads, one CLIENT each, NULL calls
 *   read   --size N --depth D --seconds S    SOURCE(N) calls
 *   write  --size N --depth D --seconds S    SINK(N bytes) calls
 *   verify --size N    NULL, ECHO, SINK and SOURCE of N pattern bytes checked
 *                      byte for byte, SOURCE(BENCH_MAXDATA + 1) refused;
 *                      exits 1 on any mismatch
 *
 * Options of every mode except verify:
 *   --samples FILE  writes the latency of every measured call, in
 *                   nanoseconds, as native-endian u64 values (the bench
 *                   builds its HdrHistogram from them)
 *   --check         lat with echo/source, read: hashes every reply's bytes
 *                   (FNV-1a 64) and reports the first reply's hash and how
 *                   many replies hashed differently ("check" object); the
 *                   caller compares the hash with the pattern's
 *
 * Sizes take a k or m suffix (KiB, MiB). Every workload reports the
 * client's own CPU time (getrusage RUSAGE_SELF, all threads); the server's
 * is measured by whoever started it. Errors go to stderr, exit status 1;
 * usage errors exit 2. Built by bench/build.rs.
 */
#include "bench_prog.h"
#include "bench_prog_pattern.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* libtirpc caps TCP record buffers at 256 KiB; see the server. */
#define XPRT_BUFSIZE (1u << 20)
/* A guard against a hung server only; never a statement about speed. */
#define CALL_TIMEOUT_S 300

enum mode { MODE_LAT, MODE_RATE, MODE_READ, MODE_WRITE, MODE_VERIFY };
enum proc { PROC_NULL, PROC_ECHO, PROC_SINK, PROC_SOURCE };

static const char *const proc_names[] = { "null", "echo", "sink", "source" };
static const char *const mode_names[] = { "lat", "rate", "read", "write",
					  "verify" };

struct options {
	enum mode mode;
	enum proc proc;
	struct sockaddr_in server;
	uint64_t size;
	uint64_t iterations;
	uint64_t warmup;
	unsigned depth;
	double seconds;
	int have_seconds;
	int check;
	const char *samples;
};

static void usage(void)
{
	fprintf(stderr,
		"usage: bench_prog_client --port P [--host IPV4] MODE [options]\n"
		"  lat    --proc null|echo|sink|source --size N (--iterations K | --seconds S) [--warmup W]\n"
		"  rate   --depth D --seconds S\n"
		"  read   --size N --depth D --seconds S\n"
		"  write  --size N --depth D --seconds S\n"
		"  verify --size N\n"
		"  (lat, rate, read, write also take --samples FILE and --check)\n");
	exit(2);
}

static void die(const char *what)
{
	fprintf(stderr, "bench_prog_client: %s\n", what);
	exit(1);
}

static uint64_t parse_u64(const char *s, int allow_suffix)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || s[0] == '-')
		usage();
	if (allow_suffix && (*end == 'k' || *end == 'K')) {
		v *= 1024;
		end++;
	} else if (allow_suffix && (*end == 'm' || *end == 'M')) {
		v *= 1024 * 1024;
		end++;
	}
	if (*end != '\0')
		usage();
	return v;
}

static void parse_args(int argc, char **argv, struct options *o)
{
	int have_port = 0, have_mode = 0;

	memset(o, 0, sizeof(*o));
	o->server.sin_family = AF_INET;
	o->server.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	o->iterations = 1000;
	o->warmup = 100;
	o->depth = 1;
	o->seconds = 1.0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!have_mode && a[0] != '-') {
			size_t m;

			for (m = 0; m < sizeof(mode_names) / sizeof(*mode_names); m++)
				if (strcmp(a, mode_names[m]) == 0)
					break;
			if (m == sizeof(mode_names) / sizeof(*mode_names))
				usage();
			o->mode = (enum mode)m;
			have_mode = 1;
			continue;
		}
		if (strcmp(a, "--check") == 0) {
			o->check = 1;
			continue;
		}
		if (v == NULL)
			usage();
		i++;
		if (strcmp(a, "--port") == 0) {
			uint64_t p = parse_u64(v, 0);

			if (p == 0 || p > 65535)
				usage();
			o->server.sin_port = htons((uint16_t)p);
			have_port = 1;
		} else if (strcmp(a, "--host") == 0) {
			if (inet_pton(AF_INET, v, &o->server.sin_addr) != 1)
				usage();
		} else if (strcmp(a, "--proc") == 0) {
			size_t p;

			for (p = 0; p < sizeof(proc_names) / sizeof(*proc_names); p++)
				if (strcmp(v, proc_names[p]) == 0)
					break;
			if (p == sizeof(proc_names) / sizeof(*proc_names))
				usage();
			o->proc = (enum proc)p;
		} else if (strcmp(a, "--size") == 0) {
			o->size = parse_u64(v, 1);
		} else if (strcmp(a, "--iterations") == 0) {
			o->iterations = parse_u64(v, 0);
		} else if (strcmp(a, "--warmup") == 0) {
			o->warmup = parse_u64(v, 0);
		} else if (strcmp(a, "--depth") == 0) {
			uint64_t d = parse_u64(v, 0);

			if (d == 0 || d > 1024)
				usage();
			o->depth = (unsigned)d;
		} else if (strcmp(a, "--seconds") == 0) {
			char *end;

			o->seconds = strtod(v, &end);
			if (end == v || *end != '\0' || !(o->seconds > 0.0))
				usage();
			o->have_seconds = 1;
		} else if (strcmp(a, "--samples") == 0) {
			o->samples = v;
		} else {
			usage();
		}
	}
	if (!have_port || !have_mode)
		usage();
	if (o->size > BENCH_MAXDATA) {
		fprintf(stderr, "bench_prog_client: --size is at most %u\n",
			BENCH_MAXDATA);
		exit(2);
	}
	if (o->mode == MODE_LAT && o->iterations == 0 && !o->have_seconds)
		usage();
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

struct cpu {
	double user_s;
	double sys_s;
};

static struct cpu cpu_now(void)
{
	struct rusage ru;
	struct cpu c;

	getrusage(RUSAGE_SELF, &ru);
	c.user_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6;
	c.sys_s = (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
	return c;
}

static void print_cpu(struct cpu before, struct cpu after)
{
	double user = after.user_s - before.user_s;
	double sys = after.sys_s - before.sys_s;

	printf("\"client_user_s\":%.6f,\"client_sys_s\":%.6f,\"client_cpu_s\":%.6f",
	       user, sys, user + sys);
}

/* One TCP connection with TCP_NODELAY, wrapped in a CLIENT. */
static CLIENT *connect_client(const struct sockaddr_in *server)
{
	struct netbuf addr;
	struct timeval timeout = { CALL_TIMEOUT_S, 0 };
	CLIENT *cl;
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0)
		die("socket failed");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (const struct sockaddr *)server, sizeof(*server)) < 0) {
		fprintf(stderr, "bench_prog_client: connect: %s\n", strerror(errno));
		exit(1);
	}
	addr.buf = (void *)server;
	addr.len = addr.maxlen = sizeof(*server);
	cl = clnt_vc_create(fd, &addr, BENCH_PROG, BENCH_VERS, XPRT_BUFSIZE,
			    XPRT_BUFSIZE);
	if (cl == NULL) {
		clnt_pcreateerror("bench_prog_client");
		exit(1);
	}
	clnt_control(cl, CLSET_FD_CLOSE, NULL);
	clnt_control(cl, CLSET_TIMEOUT, (char *)&timeout);
	return cl;
}

static void check_call(enum clnt_stat st, CLIENT *cl, const char *what)
{
	if (st != RPC_SUCCESS) {
		fprintf(stderr, "bench_prog_client: %s: %s\n", what,
			clnt_sperror(cl, ""));
		exit(1);
	}
}

/*
 * Buffers one caller reuses for every call: the argument (pattern bytes)
 * and a result buffer large enough for any bench_data, which xdr_bytes
 * decodes into instead of allocating (it checks the length against
 * BENCH_MAXDATA before copying).
 */
struct call_buffers {
	bench_data arg;
	char *result;
};

static void buffers_init(struct call_buffers *b, uint64_t size, int want_result)
{
	b->arg.bench_data_len = (u_int)size;
	b->arg.bench_data_val = malloc(size ? size : 1);
	b->result = want_result ? malloc(BENCH_MAXDATA) : NULL;
	if (b->arg.bench_data_val == NULL || (want_result && b->result == NULL))
		die("out of memory");
	bench_pattern_fill((unsigned char *)b->arg.bench_data_val, size, 0);
}

static void buffers_free(struct call_buffers *b)
{
	free(b->arg.bench_data_val);
	free(b->result);
}

/* One call of PROC with SIZE bytes; returns its status. */
static enum clnt_stat call_once(CLIENT *cl, enum proc proc,
				struct call_buffers *b, uint64_t size)
{
	bench_data res;
	u_int count = (u_int)size;
	enum clnt_stat st;

	res.bench_data_len = 0;
	res.bench_data_val = b->result;
	switch (proc) {
	case PROC_NULL:
		return bench_null_1(NULL, NULL, cl);
	case PROC_ECHO:
		st = bench_echo_1(&b->arg, &res, cl);
		break;
	case PROC_SINK:
		return bench_sink_1(&b->arg, NULL, cl);
	case PROC_SOURCE:
		st = bench_source_1(&count, &res, cl);
		break;
	default:
		abort();
	}
	if (st == RPC_SUCCESS && res.bench_data_len != size) {
		fprintf(stderr, "bench_prog_client: %s returned %u bytes, not %llu\n",
			proc_names[proc], res.bench_data_len,
			(unsigned long long)size);
		exit(1);
	}
	return st;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile; q in units of 1/10000. */
static uint64_t percentile(const uint64_t *sorted, uint64_t n, uint64_t q)
{
	uint64_t rank = (q * n + 9999) / 10000;

	return sorted[rank ? rank - 1 : 0];
}

/* Latencies of one caller's measured calls; grows by doubling. */
struct samples {
	uint64_t *ns;
	uint64_t len;
	uint64_t cap;
};

static void samples_push(struct samples *s, uint64_t ns)
{
	if (s->len == s->cap) {
		uint64_t cap = s->cap ? s->cap * 2 : 65536;
		uint64_t *p = realloc(s->ns, cap * sizeof(*p));

		if (p == NULL)
			die("out of memory for latency samples");
		s->ns = p;
		s->cap = cap;
	}
	s->ns[s->len++] = ns;
}

/* Appends the samples to FILE (created/truncated by the first writer). */
static void samples_write(const char *path, const struct samples *s,
			  int truncate)
{
	FILE *f;

	if (path == NULL)
		return;
	f = fopen(path, truncate ? "wb" : "ab");
	if (f == NULL || (s->len &&
			  fwrite(s->ns, sizeof(*s->ns), s->len, f) != s->len) ||
	    fclose(f) != 0) {
		fprintf(stderr, "bench_prog_client: cannot write %s: %s\n", path,
			strerror(errno));
		exit(1);
	}
}

/* FNV-1a, 64 bits: the reply hash of --check (same in bench/src). */
static uint64_t fnv1a64(const unsigned char *p, size_t len)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

/* The --check state of one caller. */
struct check {
	uint64_t first;
	uint64_t replies;
	uint64_t differing;
};

static void check_reply(struct check *c, const struct call_buffers *b,
			uint64_t size)
{
	uint64_t h = fnv1a64((const unsigned char *)b->result, size);

	if (c->replies == 0)
		c->first = h;
	else if (h != c->first)
		c->differing++;
	c->replies++;
}

static void print_check(const struct options *o, const struct check *c)
{
	if (o->check)
		printf(",\"check\":{\"first_fnv1a64\":%llu,\"replies\":%llu,"
		       "\"differing\":%llu}",
		       (unsigned long long)c->first,
		       (unsigned long long)c->replies,
		       (unsigned long long)c->differing);
}

static void run_lat(const struct options *o)
{
	CLIENT *cl = connect_client(&o->server);
	struct call_buffers b;
	struct samples smp = { NULL, 0, 0 };
	struct check chk = { 0, 0, 0 };
	int has_data = o->proc == PROC_ECHO || o->proc == PROC_SOURCE;
	uint64_t total = 0, start, end, deadline, n, t1;
	struct cpu c0, c1;

	buffers_init(&b, o->size, has_data);
	for (uint64_t i = 0; i < o->warmup; i++)
		check_call(call_once(cl, o->proc, &b, o->size), cl, "warm-up call");
	c0 = cpu_now();
	start = now_ns();
	deadline = o->have_seconds ? start + (uint64_t)(o->seconds * 1e9) : 0;
	/* With --seconds, the clock read that ends one call decides the next. */
	t1 = start;
	for (uint64_t i = 0; o->have_seconds ? t1 < deadline : i < o->iterations;
	     i++) {
		uint64_t t0 = now_ns();

		check_call(call_once(cl, o->proc, &b, o->size), cl, "call");
		t1 = now_ns();
		samples_push(&smp, t1 - t0);
		total += t1 - t0;
		if (o->check && has_data)
			check_reply(&chk, &b, o->size);
	}
	end = now_ns();
	c1 = cpu_now();
	n = smp.len;
	samples_write(o->samples, &smp, 1);
	qsort(smp.ns, n, sizeof(*smp.ns), cmp_u64);
	printf("{\"workload\":\"lat\",\"proc\":\"%s\",\"size\":%llu,"
	       "\"count\":%llu,\"seconds\":%.9f,\"min_ns\":%llu,\"mean_ns\":%llu,"
	       "\"p50_ns\":%llu,\"p90_ns\":%llu,\"p99_ns\":%llu,"
	       "\"p999_ns\":%llu,\"max_ns\":%llu,",
	       proc_names[o->proc], (unsigned long long)o->size,
	       (unsigned long long)n, (double)(end - start) / 1e9,
	       (unsigned long long)smp.ns[0],
	       (unsigned long long)(total / n),
	       (unsigned long long)percentile(smp.ns, n, 5000),
	       (unsigned long long)percentile(smp.ns, n, 9000),
	       (unsigned long long)percentile(smp.ns, n, 9900),
	       (unsigned long long)percentile(smp.ns, n, 9990),
	       (unsigned long long)smp.ns[n - 1]);
	print_cpu(c0, c1);
	print_check(o, &chk);
	printf("}\n");
	buffers_free(&b);
	free(smp.ns);
	clnt_destroy(cl);
}

/* Shared by the threads of a timed workload. */
struct timed_run {
	const struct options *o;
	enum proc proc;
	uint64_t size;
	pthread_barrier_t connected;
	atomic_int stop;
};

struct worker {
	struct timed_run *run;
	pthread_t thread;
	uint64_t calls;
	struct samples samples;
	struct check check;
};

static void *worker_main(void *p)
{
	struct worker *w = p;
	struct timed_run *r = w->run;
	CLIENT *cl = connect_client(&r->o->server);
	struct call_buffers b;

	buffers_init(&b, r->size, r->proc == PROC_SOURCE || r->proc == PROC_ECHO);
	pthread_barrier_wait(&r->connected);
	while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
		uint64_t t0 = r->o->samples ? now_ns() : 0;

		check_call(call_once(cl, r->proc, &b, r->size), cl, "call");
		if (r->o->samples)
			samples_push(&w->samples, now_ns() - t0);
		if (r->o->check && r->proc == PROC_SOURCE)
			check_reply(&w->check, &b, r->size);
		w->calls++;
	}
	buffers_free(&b);
	clnt_destroy(cl);
	return NULL;
}

static void run_timed(const struct options *o)
{
	struct timed_run r;
	struct worker *w = calloc(o->depth, sizeof(*w));
	struct timespec pause;
	uint64_t calls = 0, bytes, start, end;
	struct cpu c0, c1;
	struct check chk = { 0, 0, 0 };
	double secs;

	if (w == NULL)
		die("out of memory");
	r.o = o;
	r.proc = o->mode == MODE_RATE ? PROC_NULL :
		 o->mode == MODE_READ ? PROC_SOURCE : PROC_SINK;
	r.size = o->mode == MODE_RATE ? 0 : o->size;
	atomic_init(&r.stop, 0);
	pthread_barrier_init(&r.connected, NULL, o->depth + 1);
	for (unsigned i = 0; i < o->depth; i++) {
		w[i].run = &r;
		if (pthread_create(&w[i].thread, NULL, worker_main, &w[i]) != 0)
			die("pthread_create failed");
	}
	pthread_barrier_wait(&r.connected);
	c0 = cpu_now();
	start = now_ns();
	pause.tv_sec = (time_t)o->seconds;
	pause.tv_nsec = (long)((o->seconds - (double)pause.tv_sec) * 1e9);
	while (nanosleep(&pause, &pause) != 0 && errno == EINTR)
		;
	atomic_store(&r.stop, 1);
	for (unsigned i = 0; i < o->depth; i++) {
		pthread_join(w[i].thread, NULL);
		calls += w[i].calls;
	}
	for (unsigned i = 0; i < o->depth; i++) {
		const struct check *c = &w[i].check;

		samples_write(o->samples, &w[i].samples, i == 0);
		free(w[i].samples.ns);
		if (c->replies == 0)
			continue;
		if (chk.replies == 0)
			chk.first = c->first;
		/* A caller whose first reply was off counts all its replies. */
		chk.differing += c->first == chk.first ? c->differing : c->replies;
		chk.replies += c->replies;
	}
	end = now_ns();
	c1 = cpu_now();
	secs = (double)(end - start) / 1e9;
	bytes = calls * r.size;
	printf("{\"workload\":\"%s\",\"depth\":%u,\"size\":%llu,\"seconds\":%.9f,"
	       "\"calls\":%llu,\"bytes\":%llu,\"calls_per_s\":%.3f,"
	       "\"mb_per_s\":%.3f,",
	       mode_names[o->mode], o->depth, (unsigned long long)r.size, secs,
	       (unsigned long long)calls, (unsigned long long)bytes,
	       (double)calls / secs, (double)bytes / 1e6 / secs);
	print_cpu(c0, c1);
	print_check(o, &chk);
	printf("}\n");
	pthread_barrier_destroy(&r.connected);
	free(w);
}

static void verify_fail(const char *what, size_t at)
{
	fprintf(stderr, "bench_prog_client: verify: %s: first wrong byte at %zu\n",
		what, at);
	exit(1);
}

/* Results decoded the ordinary way: xdr allocates, clnt_freeres frees. */
static void run_verify(const struct options *o)
{
	CLIENT *cl = connect_client(&o->server);
	struct call_buffers b;
	bench_data res;
	u_int count = (u_int)o->size;
	u_int too_big = BENCH_MAXDATA + 1u;
	size_t at;
	enum clnt_stat st;

	buffers_init(&b, o->size, 0);
	check_call(bench_null_1(NULL, NULL, cl), cl, "verify: NULL");

	memset(&res, 0, sizeof(res));
	check_call(bench_echo_1(&b.arg, &res, cl), cl, "verify: ECHO");
	if (res.bench_data_len != o->size)
		verify_fail("ECHO length", res.bench_data_len);
	at = bench_pattern_mismatch((unsigned char *)res.bench_data_val, o->size);
	if (at != o->size)
		verify_fail("ECHO bytes", at);
	clnt_freeres(cl, (xdrproc_t)xdr_bench_data, (caddr_t)&res);

	check_call(bench_sink_1(&b.arg, NULL, cl), cl, "verify: SINK");

	memset(&res, 0, sizeof(res));
	check_call(bench_source_1(&count, &res, cl), cl, "verify: SOURCE");
	if (res.bench_data_len != o->size)
		verify_fail("SOURCE length", res.bench_data_len);
	at = bench_pattern_mismatch((unsigned char *)res.bench_data_val, o->size);
	if (at != o->size)
		verify_fail("SOURCE bytes", at);
	clnt_freeres(cl, (xdrproc_t)xdr_bench_data, (caddr_t)&res);

	memset(&res, 0, sizeof(res));
	st = bench_source_1(&too_big, &res, cl);
	if (st != RPC_CANTDECODEARGS) {
		fprintf(stderr,
			"bench_prog_client: verify: SOURCE(%u) answered %s, not GARBAGE_ARGS\n",
			too_big, clnt_sperrno(st));
		exit(1);
	}

	/* The connection still serves after the refusal. */
	check_call(bench_null_1(NULL, NULL, cl), cl, "verify: NULL after refusal");
	printf("{\"workload\":\"verify\",\"size\":%llu,\"ok\":true}\n",
	       (unsigned long long)o->size);
	buffers_free(&b);
	clnt_destroy(cl);
}

int main(int argc, char **argv)
{
	struct options o;

	parse_args(argc, argv, &o);
	signal(SIGPIPE, SIG_IGN);
	switch (o.mode) {
	case MODE_LAT:
		run_lat(&o);
		break;
	case MODE_VERIFY:
		run_verify(&o);
		break;
	case MODE_RATE:
	case MODE_READ:
	case MODE_WRITE:
		run_timed(&o);
		break;
	}
	return fflush(stdout) == 0 ? 0 : 1;
}
