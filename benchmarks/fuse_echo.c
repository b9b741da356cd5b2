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

#include "fuse_one_file.h"

/* Restricted ioctl: the kernel sent _IOC_SIZE(cmd) bytes in if the cmd has
 * the WRITE bit and wants _IOC_SIZE(cmd) back if it has READ. */
static void echo_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
		       struct fuse_file_info *fi, unsigned flags,
		       const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
	static char out[1 << 14];	/* _IOC_SIZE is 14 bits */

	(void)cmd; (void)arg; (void)fi;
	if (ino != ONE_FILE_INO || (flags & FUSE_IOCTL_UNRESTRICTED)) {
		fuse_reply_err(req, ino != ONE_FILE_INO ? ENOTTY : ENOSYS);
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
	ONE_FILE_OPS,
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
	one_file.name = "dev";
	if (fuse_opt_add_arg(&args, "-ofsname=fuse_echo,subtype=echo"))
		goto out_args;
	se = fuse_session_new(&args, &echo_ops, sizeof(echo_ops), NULL);
	if (se)
		ret = one_file_serve(se, opts.mountpoint);
out_args:
	free(opts.mountpoint);
	fuse_opt_free_args(&args);
	return ret;
}
