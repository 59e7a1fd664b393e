/*
 * The bench program's SOURCE byte pattern (docs/PROTOCOL.md, "Bench
 * program"): byte i of a SOURCE result is (i * 31 + 7) mod 256. The Rust
 * service produces the same bytes; the client's verify mode also uses the
 * pattern as ECHO and SINK payload.
 */
#ifndef BENCH_PROG_PATTERN_H
#define BENCH_PROG_PATTERN_H

#include <stddef.h>

static inline unsigned char bench_pattern_byte(size_t i)
{
	return (unsigned char)((i * 31u + 7u) & 0xffu);
}

/* Fills buf[0..len) with pattern bytes start..start+len. */
static inline void bench_pattern_fill(unsigned char *buf, size_t len,
				      size_t start)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = bench_pattern_byte(start + i);
}

/* Index of the first byte of buf[0..len) off the pattern, or len. */
static inline size_t bench_pattern_mismatch(const unsigned char *buf,
					    size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (buf[i] != bench_pattern_byte(i))
			return i;
	return len;
}

#endif
