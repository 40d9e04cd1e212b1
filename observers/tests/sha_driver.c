/* Test driver for the observers' SHA-256: prints, for the file named on the
 * command line, the digest by the default path (SHA extensions when the CPU
 * has them), by portable C, and by the default path fed in uneven pieces, as
 * one JSON line; the test compares them with Python's hashlib.  The hex
 * encoding is the observers' own (obs_sha256_hex), so hashlib checks it too. */
#include <stdio.h>
#include <stdlib.h>

#include "sha256.h"

int main(int argc, char **argv)
{
	static const size_t pieces[] = { 1, 3, 63, 64, 65, 127, 4096, 7 };
	struct obs_sha256 s;
	uint8_t d[32];
	char a[65], p[65], c[65];
	unsigned char *buf;
	size_t len, off, k = 0;
	long size;
	FILE *f;
	int accel;

	if (argc != 2 || !(f = fopen(argv[1], "rb")))
		return 2;
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, 0, SEEK_SET);
	len = (size_t)size;
	buf = malloc(len ? len : 1);
	if (!buf || fread(buf, 1, len, f) != len)
		return 2;
	fclose(f);
	accel = obs_sha256_accelerated();
	obs_sha256(buf, len, d);
	obs_sha256_hex(d, a);
	obs_sha256_force_portable(1);
	obs_sha256(buf, len, d);
	obs_sha256_hex(d, p);
	obs_sha256_force_portable(0);
	obs_sha256_init(&s);
	for (off = 0; off < len; k++) {
		size_t n = pieces[k % (sizeof(pieces) / sizeof(pieces[0]))];

		if (n > len - off)
			n = len - off;
		obs_sha256_update(&s, buf + off, n);
		off += n;
	}
	obs_sha256_final(&s, d);
	obs_sha256_hex(d, c);
	printf("{\"accelerated\":%d,\"default\":\"%s\",\"portable\":\"%s\",\"pieces\":\"%s\"}\n", accel, a, p, c);
	free(buf);
	return 0;
}
