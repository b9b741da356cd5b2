/* The namespace of the C FUSE floors (fuse_echo.c, fuse_relay.c): a root directory holding
 * one regular file, `one_file.name` of `one_file.size` bytes (0666), opened direct_io, its
 * metadata never changing (the kernel caches all of it).  The program sets `one_file`
 * before its session starts and puts these callbacks in its fuse_lowlevel_ops
 * (ONE_FILE_OPS); it adds its own for the file's contents. */
#ifndef UALINK_BENCH_FUSE_ONE_FILE_H
#define UALINK_BENCH_FUSE_ONE_FILE_H

#include <errno.h>
#include <fuse_lowlevel.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ONE_FILE_INO 2
#define ONE_FILE_TIMEOUT 1e6	/* nothing changes: let the kernel cache all metadata */

static struct {
	const char *name;
	off_t size;
} one_file;

static int one_file_stat(fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = getuid();
	st->st_gid = getgid();
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else if (ino == ONE_FILE_INO) {
		/* S_IFREG: an S_IFCHR entry would be opened as a real device. */
		st->st_mode = S_IFREG | 0666;
		st->st_nlink = 1;
		st->st_size = one_file.size;
	} else {
		return -1;
	}
	return 0;
}

static void one_file_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;

	if (parent != FUSE_ROOT_ID || strcmp(name, one_file.name)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	memset(&e, 0, sizeof(e));
	e.ino = ONE_FILE_INO;
	e.attr_timeout = ONE_FILE_TIMEOUT;
	e.entry_timeout = ONE_FILE_TIMEOUT;
	one_file_stat(ONE_FILE_INO, &e.attr);
	fuse_reply_entry(req, &e);
}

static void one_file_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct stat st;

	(void)fi;
	if (one_file_stat(ino, &st))
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_attr(req, &st, ONE_FILE_TIMEOUT);
}

static void one_file_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
			     struct fuse_file_info *fi)
{
	const char *const names[] = { ".", "..", one_file.name };
	static const fuse_ino_t inos[] = { FUSE_ROOT_ID, FUSE_ROOT_ID, ONE_FILE_INO };
	char buf[256];
	size_t used = 0;
	struct stat st;

	(void)fi;
	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	for (; off < 3; off++) {
		size_t n;

		one_file_stat(inos[off], &st);
		n = fuse_add_direntry(req, buf + used, sizeof(buf) - used,
				      names[off], &st, off + 1);
		if (used + n > size || n > sizeof(buf) - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
}

static void one_file_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino != ONE_FILE_INO) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	fi->direct_io = 1;
	fuse_reply_open(req, fi);
}

/* Mount `se` at `mountpoint` and serve it, single-threaded on purpose, until a signal
 * ends the loop; then unmount and destroy it: 0, or 1 when it failed.  A shell starts
 * background jobs with SIGINT ignored, and libfuse only takes over signals left at
 * SIG_DFL: it is reset so that `kill -INT` from a benchmark script unmounts too. */
static int one_file_serve(struct fuse_session *se, const char *mountpoint)
{
	int ret = 1;

	signal(SIGINT, SIG_DFL);
	if (fuse_set_signal_handlers(se) != 0)
		goto out_session;
	if (fuse_session_mount(se, mountpoint) != 0)
		goto out_signals;
	ret = fuse_session_loop(se) < 0;
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
	return ret;
}

#define ONE_FILE_OPS \
	.lookup = one_file_lookup, \
	.getattr = one_file_getattr, \
	.readdir = one_file_readdir, \
	.open = one_file_open

#endif
