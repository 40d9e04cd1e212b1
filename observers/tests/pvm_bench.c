/* Raw process_vm_readv baseline for the provider bench: two processes, the
 * child holds a <span>-byte buffer, the parent copies <total> bytes out of it
 * in <msg>-byte process_vm_readv calls into its own buffer of the same size,
 * cycling through both as the provider bench does through its registered
 * memory.  What the provider's single-copy path costs beyond this is its
 * protocol (a request, the grant, the end of the copy, the acknowledgement).
 *   pvm_bench <msg bytes> <total bytes> <span bytes>
 * Prints one JSON line. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"

/* The child: fill its buffer, say where it is, wait until the parent is done. */
static void hold(uint8_t *buf, uint64_t span, int wfd, int rfd)
{
	uintptr_t addr = (uintptr_t)buf;
	char done;

	memset(buf, 0x3c, span);
	if (write(wfd, &addr, sizeof(addr)) != (ssize_t)sizeof(addr))
		DIE("write address");
	if (read(rfd, &done, 1) < 0)
		DIE("read end");
	_exit(0);
}

int main(int argc, char **argv)
{
	uint64_t msg, total, span, left, off;
	int up[2], down[2], status;
	uintptr_t remote;
	uint8_t *buf;
	double t0, dt;
	pid_t pid;

	if (argc != 4)
		return fprintf(stderr, "usage: %s <msg> <total> <span>\n", argv[0]), 2;
	if (bench_sizes(argv + 1, &msg, &total, &span))
		return fprintf(stderr, "bad arguments\n"), 2;
	span -= span % msg;
	buf = aligned_alloc(4096, span);
	if (!buf || pipe(up) || pipe(down))
		DIE("setup");
	pid = fork();
	if (pid < 0)
		DIE("fork");
	if (pid == 0)
		hold(buf, span, up[1], down[0]);
	memset(buf, 0, span);
	if (read(up[0], &remote, sizeof(remote)) != (ssize_t)sizeof(remote))
		DIE("read address");
	t0 = now();
	for (left = total, off = 0; left;) {
		size_t n = left < msg ? (size_t)left : (size_t)msg;
		struct iovec l = { buf + off, n }, r = { (void *)(remote + off), n };
		ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);

		if (got <= 0)
			DIE("process_vm_readv");
		left -= (uint64_t)got;
		off = (off + msg) % span;
	}
	dt = now() - t0;
	if (write(down[1], "x", 1) != 1)
		DIE("write end");
	waitpid(pid, &status, 0);
	bench_report("process_vm_readv", msg, total, span, dt);
	free(buf);
	return status == 0 ? 0 : 3;
}
