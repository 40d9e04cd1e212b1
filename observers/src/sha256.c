/* SHA-256 (FIPS 180-4): portable C and the x86 SHA-extensions path.
 *
 * The SHA-extensions compression follows Intel's published sequence (the
 * message schedule in four rotating registers); the tests check both paths
 * against Python's hashlib on random inputs of every length class. */
#include "sha256.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define OBS_SHA_X86 1
#endif

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
	0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
	0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
	0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
	0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void compress_portable(uint32_t h[8], const uint8_t *p, size_t blocks)
{
	uint32_t w[64], a, b, c, d, e, f, g, k, t1, t2;
	int i;

	for (; blocks; blocks--, p += 64) {
		for (i = 0; i < 16; i++)
			w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
			       (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
		for (i = 16; i < 64; i++) {
			uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
			uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);

			w[i] = w[i - 16] + s0 + w[i - 7] + s1;
		}
		a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
		for (i = 0; i < 64; i++) {
			t1 = k + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
			t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
			k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
		}
		h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
	}
}

#ifdef OBS_SHA_X86
__attribute__((target("sha,sse4.1,ssse3"))) static void compress_shani(uint32_t h[8], const uint8_t *p,
								       size_t blocks)
{
	const __m128i swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
	__m128i st0, st1, tmp, msg, m[4], abef, cdgh;
	int i;

	tmp = _mm_loadu_si128((const __m128i *)&h[0]);
	st1 = _mm_loadu_si128((const __m128i *)&h[4]);
	tmp = _mm_shuffle_epi32(tmp, 0xB1);       /* CDAB */
	st1 = _mm_shuffle_epi32(st1, 0x1B);       /* EFGH */
	st0 = _mm_alignr_epi8(tmp, st1, 8);       /* ABEF */
	st1 = _mm_blend_epi16(st1, tmp, 0xF0);    /* CDGH */
	for (; blocks; blocks--, p += 64) {
		abef = st0;
		cdgh = st1;
		/* 16 groups of 4 rounds; m[] holds the next 16 schedule words. */
		for (i = 0; i < 16; i++) {
			if (i < 4)
				m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), swap);
			msg = _mm_add_epi32(m[i & 3], _mm_loadu_si128((const __m128i *)&K[4 * i]));
			st1 = _mm_sha256rnds2_epu32(st1, st0, msg);
			if (i >= 3 && i < 15) {
				tmp = _mm_alignr_epi8(m[i & 3], m[(i + 3) & 3], 4);
				m[(i + 1) & 3] = _mm_add_epi32(m[(i + 1) & 3], tmp);
				m[(i + 1) & 3] = _mm_sha256msg2_epu32(m[(i + 1) & 3], m[i & 3]);
			}
			msg = _mm_shuffle_epi32(msg, 0x0E);
			st0 = _mm_sha256rnds2_epu32(st0, st1, msg);
			if (i >= 1 && i < 13)
				m[(i + 3) & 3] = _mm_sha256msg1_epu32(m[(i + 3) & 3], m[i & 3]);
		}
		st0 = _mm_add_epi32(st0, abef);
		st1 = _mm_add_epi32(st1, cdgh);
	}
	tmp = _mm_shuffle_epi32(st0, 0x1B);       /* FEBA */
	st1 = _mm_shuffle_epi32(st1, 0xB1);       /* DCHG */
	st0 = _mm_blend_epi16(tmp, st1, 0xF0);    /* DCBA */
	st1 = _mm_alignr_epi8(st1, tmp, 8);       /* ABEF */
	_mm_storeu_si128((__m128i *)&h[0], st0);
	_mm_storeu_si128((__m128i *)&h[4], st1);
}

static int cpu_has_shani(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSE4_1) || !(c & bit_SSSE3))
		return 0;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return 0;
	return (b >> 29) & 1; /* CPUID.(EAX=7,ECX=0):EBX.SHA[bit 29] */
}
#endif

/* -1 = not probed yet; written once, racing writers store the same value. */
static int accel = -1;
static int portable_forced;

int obs_sha256_accelerated(void)
{
	int a = __atomic_load_n(&accel, __ATOMIC_RELAXED);

	if (a < 0) {
#ifdef OBS_SHA_X86
		a = cpu_has_shani();
#else
		a = 0;
#endif
		__atomic_store_n(&accel, a, __ATOMIC_RELAXED);
	}
	return a && !portable_forced;
}

void obs_sha256_force_portable(int on)
{
	portable_forced = on;
}

static void compress(uint32_t h[8], const uint8_t *p, size_t blocks)
{
#ifdef OBS_SHA_X86
	if (obs_sha256_accelerated()) {
		compress_shani(h, p, blocks);
		return;
	}
#endif
	compress_portable(h, p, blocks);
}

void obs_sha256_init(struct obs_sha256 *s)
{
	static const uint32_t iv[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };

	memcpy(s->h, iv, sizeof(iv));
	s->total = 0;
	s->used = 0;
}

void obs_sha256_update(struct obs_sha256 *s, const void *data, size_t len)
{
	const uint8_t *p = data;

	s->total += len;
	if (s->used) {
		size_t take = 64 - s->used < len ? 64 - s->used : len;

		memcpy(s->buf + s->used, p, take);
		s->used += take;
		p += take;
		len -= take;
		if (s->used < 64)
			return;
		compress(s->h, s->buf, 1);
		s->used = 0;
	}
	if (len >= 64) {
		compress(s->h, p, len / 64);
		p += len & ~(size_t)63;
		len &= 63;
	}
	if (len) {
		memcpy(s->buf, p, len);
		s->used = len;
	}
}

void obs_sha256_final(struct obs_sha256 *s, uint8_t out[32])
{
	uint64_t bits = s->total * 8;
	int i;

	s->buf[s->used++] = 0x80;
	if (s->used > 56) {
		memset(s->buf + s->used, 0, 64 - s->used);
		compress(s->h, s->buf, 1);
		s->used = 0;
	}
	memset(s->buf + s->used, 0, 56 - s->used);
	for (i = 0; i < 8; i++)
		s->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
	compress(s->h, s->buf, 1);
	for (i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(s->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)s->h[i];
	}
}

void obs_sha256(const void *data, size_t len, uint8_t out[32])
{
	struct obs_sha256 s;

	obs_sha256_init(&s);
	obs_sha256_update(&s, data, len);
	obs_sha256_final(&s, out);
}

void obs_sha256_hex(const uint8_t d[32], char out[65])
{
	static const char digits[] = "0123456789abcdef";
	int i;

	for (i = 0; i < 32; i++) {
		out[2 * i] = digits[d[i] >> 4];
		out[2 * i + 1] = digits[d[i] & 15];
	}
	out[64] = '\0';
}
