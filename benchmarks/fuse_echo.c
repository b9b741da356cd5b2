/* SPDX-License-Identifier: MIT */
/*
 * fuse_echo <mountpoint> [-f] [-d] [-o opts]
 *
 * The floor under ualinkd's ioctl latency: a minimal libfuse3 low-level
 * server whose only file, <mountpoint>/dev (a regular file, 0666, opened
 * direct_io), answers every restricted ioctl by echoing the caller's bytes
 * back (a read-only ioctl gets zeros).  Single-threaded, always in the
 * foreground (-f is accepted for habit's sake); SIGINT/SIGTERM/SIGHUP end the
 * loop and unmount.  Time it with ioctl_latency against <mountpoint>/dev.
 */
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <signal.h>
#include <fuse_lowlevel.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEV_INO 2
#define DEV_NAME "dev"
#define TIMEOUT 1e6	/* nothing changes: let the kernel cache all metadata */

static int echo_stat(fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	st->st_uid = getuid();
	st->st_gid = getgid();
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else if (ino == DEV_INO) {
		/* S_IFREG: an S_IFCHR entry would be opened as a real device. */
		st->st_mode = S_IFREG | 0666;
		st->st_nlink = 1;
	} else {
		return -1;
	}
	return 0;
}

static void echo_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fuse_entry_param e;

	if (parent != FUSE_ROOT_ID || strcmp(name, DEV_NAME)) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	memset(&e, 0, sizeof(e));
	e.ino = DEV_INO;
	e.attr_timeout = TIMEOUT;
	e.entry_timeout = TIMEOUT;
	echo_stat(DEV_INO, &e.attr);
	fuse_reply_entry(req, &e);
}

static void echo_getattr(fuse_req_t req, fuse_ino_t ino,
			 struct fuse_file_info *fi)
{
	struct stat st;

	(void)fi;
	if (echo_stat(ino, &st))
		fuse_reply_err(req, ENOENT);
	else
		fuse_reply_attr(req, &st, TIMEOUT);
}

static void echo_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
			 off_t off, struct fuse_file_info *fi)
{
	static const char *const names[] = { ".", "..", DEV_NAME };
	static const fuse_ino_t inos[] = { FUSE_ROOT_ID, FUSE_ROOT_ID, DEV_INO };
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

		echo_stat(inos[off], &st);
		n = fuse_add_direntry(req, buf + used, sizeof(buf) - used,
				      names[off], &st, off + 1);
		if (used + n > size || n > sizeof(buf) - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
}

static void echo_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino != DEV_INO) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	fi->direct_io = 1;
	fuse_reply_open(req, fi);
}

/* Restricted ioctl: the kernel sent _IOC_SIZE(cmd) bytes in if the cmd has
 * the WRITE bit and wants _IOC_SIZE(cmd) back if it has READ. */
static void echo_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
		       struct fuse_file_info *fi, unsigned flags,
		       const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	static char out[1 << 14];	/* _IOC_SIZE is 14 bits */

	(void)cmd; (void)arg; (void)fi;
	if (ino != DEV_INO || (flags & FUSE_IOCTL_UNRESTRICTED)) {
		fuse_reply_err(req, ino != DEV_INO ? ENOTTY : ENOSYS);
		return;
	}
	if (out_bufsz <= in_bufsz) {
		fuse_reply_ioctl(req, 0, in_buf, out_bufsz);
		return;
	}
	if (out_bufsz > sizeof(out))
		out_bufsz = sizeof(out);
	if (in_bufsz)
		memcpy(out, in_buf, in_bufsz);
	memset(out + in_bufsz, 0, out_bufsz - in_bufsz);
	fuse_reply_ioctl(req, 0, out, out_bufsz);
}

static const struct fuse_lowlevel_ops echo_ops = {
	.lookup = echo_lookup,
	.getattr = echo_getattr,
	.readdir = echo_readdir,
	.open = echo_open,
	.ioctl = echo_ioctl,
};

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts opts;
	struct fuse_session *se;
	int ret = 1;

	if (fuse_parse_cmdline(&args, &opts) != 0)
		return 1;
	if (opts.show_help || !opts.mountpoint) {
		fprintf(stderr, "usage: %s <mountpoint> [-f] [-d] [-o opts]\n", argv[0]);
		fuse_lowlevel_help();
		goto out_args;
	}
	if (fuse_opt_add_arg(&args, "-ofsname=fuse_echo,subtype=echo"))
		goto out_args;
	se = fuse_session_new(&args, &echo_ops, sizeof(echo_ops), NULL);
	if (!se)
		goto out_args;
	/* A shell starts background jobs with SIGINT ignored, and libfuse only
	 * takes over signals left at SIG_DFL: reset it so `kill -INT` from a
	 * benchmark script unmounts too. */
	signal(SIGINT, SIG_DFL);
	if (fuse_set_signal_handlers(se) != 0)
		goto out_session;
	if (fuse_session_mount(se, opts.mountpoint) != 0)
		goto out_signals;

	ret = fuse_session_loop(se) < 0;	/* single-threaded on purpose */

	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_args:
	free(opts.mountpoint);
	fuse_opt_free_args(&args);
	return ret;
}
