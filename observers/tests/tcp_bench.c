/* Raw loopback TCP baseline for the provider bench: two processes, one
 * connection from <src> to <dst>, the sender send()s <total> bytes in
 * <msg>-byte calls from a buffer, the receiver recv()s them (MSG_WAITALL)
 * into a buffer and answers one byte at the end; the time is the sender's,
 * connection set-up excluded (as the provider bench's warm-up WR does).
 * Both sides cycle through a <span>-byte buffer, message after message, as
 * the provider bench does through its registered memory (same footprint).
 *   tcp_bench <src ip> <dst ip> <msg bytes> <total bytes> <span bytes>
 * Prints one JSON line. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"

int main(int argc, char **argv)
{
	struct sockaddr_in dst = { .sin_family = AF_INET }, src = { .sin_family = AF_INET };
	socklen_t sl = sizeof(dst);
	uint64_t msg, total, left, span, off;
	int lfd, fd, one = 1, status;
	uint8_t *buf, ack = 1;
	double t0, dt;
	pid_t pid;

	if (argc != 6)
		return fprintf(stderr, "usage: %s <src ip> <dst ip> <msg> <total> <span>\n", argv[0]), 2;
	if (bench_sizes(argv + 3, &msg, &total, &span) || inet_pton(AF_INET, argv[1], &src.sin_addr) != 1 ||
	    inet_pton(AF_INET, argv[2], &dst.sin_addr) != 1)
		return fprintf(stderr, "bad arguments\n"), 2;
	span -= span % msg;
	buf = aligned_alloc(4096, span);
	if (!buf)
		DIE("aligned_alloc");
	memset(buf, 0x3c, span);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&dst, sizeof(dst)) || listen(lfd, 1) ||
	    getsockname(lfd, (struct sockaddr *)&dst, &sl))
		DIE("listen");
	pid = fork();
	if (pid < 0)
		DIE("fork");
	if (pid == 0) {
		fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			DIE("accept");
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		for (left = total, off = 0; left;) {
			size_t n = left < msg ? (size_t)left : (size_t)msg;
			ssize_t r = recv(fd, buf + off, n, MSG_WAITALL);

			if (r <= 0)
				DIE("recv");
			left -= (uint64_t)r;
			off = (off + msg) % span;
		}
		if (send(fd, &ack, 1, 0) != 1)
			DIE("send ack");
		close(fd);
		_exit(0);
	}
	close(lfd);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&src, sizeof(src)) ||
	    connect(fd, (struct sockaddr *)&dst, sizeof(dst)))
		DIE("connect");
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	t0 = now();
	for (left = total, off = 0; left;) {
		size_t n = left < msg ? (size_t)left : (size_t)msg;
		ssize_t r = send(fd, buf + off, n, MSG_NOSIGNAL);

		if (r <= 0)
			DIE("send");
		left -= (uint64_t)r;
		off = (off + msg) % span;
	}
	if (recv(fd, &ack, 1, MSG_WAITALL) != 1)
		DIE("recv ack");
	dt = now() - t0;
	close(fd);
	waitpid(pid, &status, 0);
	bench_report("tcp", msg, total, span, dt);
	free(buf);
	return status == 0 ? 0 : 3;
}
