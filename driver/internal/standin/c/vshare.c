/*
 * vshare.c - memory shared with other processes by a 64-bit token, the way
 * AscendCL shares it (aclrtMemExportToShareableHandle,
 * aclrtMemSetPidToShareableHandle, aclrtMemImportFromShareableHandle):
 * the exporter turns a handle into a number, names the processes that may
 * import it, and any of them turns the number back into a handle of its
 * own over the same memory.
 *
 * How a number finds the memory. Every token has a listening Unix socket
 * in the abstract namespace, named
 *
 *     "\0vmstandin:<vendor>:<uid>:<token as 16 hex digits>"
 *
 * and a thread of the exporting library that answers it. An importer
 * connects (SOCK_SEQPACKET), sends a request, and the exporter's thread
 * reads the importer's process ID from the kernel (SO_PEERCRED: the
 * importer cannot lie about it), checks it against the token's allow-list
 * and either refuses or sends a descriptor of the allocation's memfd
 * (SCM_RIGHTS). The importer hands that descriptor to vdev_import, which
 * checks that it is a sealed memfd of this vendor's stand-in and makes a
 * handle holding a duplicate of it, exactly as a CUDA import of a POSIX
 * descriptor does.
 *
 * Why this way: abstract sockets are no files, so nothing is ever left in
 * /dev/shm or $TMPDIR, even when a process dies (the kernel removes the
 * name with its last descriptor); the allow-list stays with the exporter,
 * who alone can change it; and the memory needs no name of its own, since
 * a descriptor travels only to a process that was allowed. Revoking a token
 * (the exporter frees its handle) closes the socket: later imports find no
 * one to answer (an unknown token), while importers keep the memory through
 * their own descriptors, so the memory goes when the last process frees
 * it. Sockets of the abstract namespace are per network namespace and are
 * open to any process of it; the uid in the name keeps two users' tokens
 * apart, and the allow-list does the rest.
 *
 * The socket is this library's, so a second stand-in instance in the same
 * process imports like another process (with this process's ID), as the
 * CUDA front-end's instances share descriptors; a token this very library
 * exported is refused, as AscendCL refuses an import in the exporting
 * process.
 *
 * Lock: shares guards `tokens` and every token's allow-list. It is taken
 * before the books (an export holds it across vdev_export), never under
 * them, and never across a wait for another process.
 */
#define _GNU_SOURCE
#include "vdev.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* The messages of the protocol, one datagram each way. */
enum {
	SHARE_MAGIC = 0x564d5354, /* "VMST" */
	SHARE_VERSION = 1,
	SHARE_OK = 0,         /* the reply carries the memory's descriptor */
	SHARE_NOT_ALLOWED = 1 /* the importer is not on the allow-list */
};

struct share_request {
	uint32_t magic, version;
};

struct share_reply {
	uint32_t magic;
	int32_t status;
};

/* How long either side waits for the other before giving up. */
enum { SHARE_TIMEOUT_MS = 10000 };

/* A token this library exported. fd is a descriptor of the memory, owned;
 * listen_fd is the socket that names the token; the thread answers it
 * until stop_fd is signalled. pids (npids of cap) is the allow-list,
 * guarded by shares; validate false lets any process import. */
struct token {
	uint64_t token;
	uint64_t handle;
	int fd, listen_fd, stop_fd;
	pthread_t thread;
	bool validate;
	int32_t *pids;
	size_t npids, cap;
};

static pthread_mutex_t shares = PTHREAD_MUTEX_INITIALIZER;
static struct vec tokens; /* struct token *, in the order exported */

size_t vdev_tokens(void)
{
	pthread_mutex_lock(&shares);
	size_t n = tokens.n;
	pthread_mutex_unlock(&shares);
	return n;
}

/* token_find returns the index of token tok in `tokens` (tokens.n: none).
 * shares held. */
static size_t token_find(uint64_t tok)
{
	for (size_t i = 0; i < tokens.n; i++)
		if (((const struct token *)tokens.at[i])->token == tok)
			return i;
	return tokens.n;
}

/* token_address fills *a with the socket name of tok and returns its
 * length. */
static socklen_t token_address(uint64_t tok, struct sockaddr_un *a)
{
	memset(a, 0, sizeof *a);
	a->sun_family = AF_UNIX;
	int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "vmstandin:%s:%u:%016llx", vdev_vendor(),
			 (unsigned)getuid(), (unsigned long long)tok);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* fresh_token is a random nonzero number. */
static uint64_t fresh_token(void)
{
	static uint64_t counter;
	uint64_t t = 0;
	if (getrandom(&t, sizeof t, GRND_NONBLOCK) != (ssize_t)sizeof t) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		t = ((uint64_t)ts.tv_nsec << 20) ^ ((uint64_t)getpid() << 40) ^ ++counter ^ (uint64_t)ts.tv_sec;
	}
	return t ? t : 1;
}

static void set_timeouts(int fd)
{
	struct timeval tv = {.tv_sec = SHARE_TIMEOUT_MS / 1000, .tv_usec = SHARE_TIMEOUT_MS % 1000 * 1000};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* listen_on makes the socket that names tok: its descriptor, or -errno. */
static int listen_on(uint64_t tok)
{
	struct sockaddr_un a;
	socklen_t len = token_address(tok, &a);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&a, len) < 0 || listen(fd, 16) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

/* allowed says whether pid may import t. */
static bool allowed(const struct token *t, pid_t pid)
{
	pthread_mutex_lock(&shares);
	bool ok = !t->validate;
	for (size_t i = 0; i < t->npids && !ok; i++)
		ok = t->pids[i] == pid;
	pthread_mutex_unlock(&shares);
	return ok;
}

/* answer serves one importer on connection c. Signals never end a process
 * here (MSG_NOSIGNAL): the importer may be gone. */
static void answer(struct token *t, int c)
{
	struct share_request req;
	struct ucred cred;
	socklen_t clen = sizeof cred;
	ssize_t n;

	set_timeouts(c);
	do
		n = recv(c, &req, sizeof req, 0);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof req || req.magic != SHARE_MAGIC || req.version != SHARE_VERSION)
		return;
	if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0)
		return;

	struct share_reply rep = {.magic = SHARE_MAGIC, .status = SHARE_OK};
	if (!allowed(t, cred.pid))
		rep.status = SHARE_NOT_ALLOWED;
	struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
	if (rep.status == SHARE_OK) {
		memset(&ctl, 0, sizeof ctl);
		msg.msg_control = ctl.buf;
		msg.msg_controllen = sizeof ctl.buf;
		struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &t->fd, sizeof(int));
	}
	do
		n = sendmsg(c, &msg, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
}

/* serve answers t's socket until t is revoked. */
static void *serve(void *arg)
{
	struct token *t = arg;
	struct pollfd p[2] = {{.fd = t->listen_fd, .events = POLLIN}, {.fd = t->stop_fd, .events = POLLIN}};
	for (;;) {
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents)
			break;
		if (p[0].revents & POLLIN) {
			int c = accept4(t->listen_fd, NULL, NULL, SOCK_CLOEXEC);
			if (c >= 0) {
				answer(t, c);
				close(c);
			}
		}
	}
	return NULL;
}

static void token_free(struct token *t)
{
	if (t->listen_fd >= 0)
		close(t->listen_fd);
	if (t->stop_fd >= 0)
		close(t->stop_fd);
	if (t->fd >= 0)
		close(t->fd);
	free(t->pids);
	free(t);
}

vdev_status vdev_token_export(uint64_t handle, bool validate_pids, uint64_t *out)
{
	if (!vdev_initialized())
		return VDEV_NOT_INITIALIZED;
	pthread_mutex_lock(&shares);
	vdev_status st = VDEV_ALREADY;
	struct token *t = NULL;
	for (size_t i = 0; i < tokens.n; i++)
		if (((const struct token *)tokens.at[i])->handle == handle)
			goto out;
	st = VDEV_OOM;
	t = calloc(1, sizeof *t);
	if (!t)
		goto out;
	t->handle = handle;
	t->validate = validate_pids;
	t->listen_fd = t->stop_fd = -1;
	st = vdev_export(handle, &t->fd);
	if (st != VDEV_OK) {
		t->fd = -1;
		goto out;
	}
	st = VDEV_OS;
	for (int tries = 0; tries < 16 && t->listen_fd < 0; tries++) {
		uint64_t tok = fresh_token();
		if (token_find(tok) < tokens.n)
			continue;
		int fd = listen_on(tok);
		if (fd >= 0) {
			t->token = tok;
			t->listen_fd = fd;
		} else if (fd != -EADDRINUSE) {
			st = fd == -EMFILE || fd == -ENFILE || fd == -ENOMEM ? VDEV_OOM : VDEV_OS;
			goto out;
		}
	}
	if (t->listen_fd < 0)
		goto out;
	t->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (t->stop_fd < 0)
		goto out;
	if (!vec_push(&tokens, t)) {
		st = VDEV_OOM;
		goto out;
	}
	if (pthread_create(&t->thread, NULL, serve, t)) {
		tokens.n--;
		goto out;
	}
	*out = t->token;
	t = NULL;
	st = VDEV_OK;
out:
	if (t)
		token_free(t);
	pthread_mutex_unlock(&shares);
	return st;
}

vdev_status vdev_token_allow(uint64_t token, const int32_t *pids, size_t n)
{
	pthread_mutex_lock(&shares);
	vdev_status st = VDEV_INVALID;
	size_t i = token_find(token);
	if (i < tokens.n) {
		struct token *t = tokens.at[i];
		st = VDEV_OK;
		if (t->npids + n > t->cap) {
			size_t cap = t->npids + n + 8;
			int32_t *p = realloc(t->pids, cap * sizeof *p);
			if (p) {
				t->pids = p;
				t->cap = cap;
			} else {
				st = VDEV_OOM;
			}
		}
		if (st == VDEV_OK) {
			memcpy(&t->pids[t->npids], pids, n * sizeof *pids);
			t->npids += n;
		}
	}
	pthread_mutex_unlock(&shares);
	return st;
}

vdev_status vdev_token_revoke(uint64_t token)
{
	pthread_mutex_lock(&shares);
	size_t i = token_find(token);
	struct token *t = NULL;
	if (i < tokens.n) {
		t = tokens.at[i];
		vec_cut(&tokens, i, i + 1);
	}
	pthread_mutex_unlock(&shares);
	if (!t)
		return VDEV_INVALID;
	uint64_t one = 1;
	while (write(t->stop_fd, &one, sizeof one) < 0 && errno == EINTR)
		;
	pthread_join(t->thread, NULL);
	token_free(t);
	return VDEV_OK;
}

/* receive reads the exporter's reply on s: the descriptor it carries in
 * *fd (-1 when none), and the status. */
static vdev_status receive(int s, int *fd)
{
	struct share_reply rep;
	struct iovec iov = {.iov_base = &rep, .iov_len = sizeof rep};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl.buf};
	ssize_t n;

	*fd = -1;
	do
		n = recvmsg(s, &msg, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	for (struct cmsghdr *cm = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL; cm; cm = CMSG_NXTHDR(&msg, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && cm->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(fd, CMSG_DATA(cm), sizeof(int));
	/* A token revoked while the importer waited closes the connection
	 * unanswered: as unknown as a token never exported. */
	if (n <= 0)
		return n == 0 || errno == ECONNRESET ? VDEV_INVALID : VDEV_OS;
	if (n != (ssize_t)sizeof rep || rep.magic != SHARE_MAGIC)
		return VDEV_INVALID;
	if (rep.status == SHARE_NOT_ALLOWED)
		return VDEV_NOT_PERMITTED;
	return rep.status == SHARE_OK && *fd >= 0 ? VDEV_OK : VDEV_INVALID;
}

vdev_status vdev_token_import(uint64_t token, uint64_t *handle)
{
	if (!vdev_initialized())
		return VDEV_NOT_INITIALIZED;
	if (vdev_config()->novmm)
		return VDEV_NOT_SUPPORTED;
	if (token == 0)
		return VDEV_INVALID;
	pthread_mutex_lock(&shares);
	bool own = token_find(token) < tokens.n;
	pthread_mutex_unlock(&shares);
	if (own)
		return VDEV_NOT_SUPPORTED;

	struct sockaddr_un a;
	socklen_t len = token_address(token, &a);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return errno == EMFILE || errno == ENFILE ? VDEV_OOM : VDEV_OS;
	set_timeouts(s);
	vdev_status st = VDEV_INVALID; /* nobody answers: no such token */
	int fd = -1;
	int rc;
	do
		rc = connect(s, (struct sockaddr *)&a, len);
	while (rc < 0 && errno == EINTR);
	if (rc < 0) {
		if (errno != ECONNREFUSED && errno != ENOENT)
			st = VDEV_OS;
		goto out;
	}
	struct share_request req = {.magic = SHARE_MAGIC, .version = SHARE_VERSION};
	ssize_t n;
	do
		n = send(s, &req, sizeof req, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n != (ssize_t)sizeof req)
		goto out;
	st = receive(s, &fd);
	if (st == VDEV_OK)
		st = vdev_import(fd, handle);
out:
	if (fd >= 0)
		close(fd);
	close(s);
	return st;
}
