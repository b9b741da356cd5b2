/* SPDX-License-Identifier: MIT */
/*
 * A 32-bit (i386) caller of one ioctl, without libc (this machine has no 32-bit one):
 * open(PATH, O_RDWR), ioctl(fd, CMD, buf), and the exit status is the errno (0: success).
 * Built by tests/integration/test_fuse_tree.py with gcc -m32 -nostdlib -static -DPATH=..
 * -DCMD=..; the kernel's FUSE marks its ioctl FUSE_IOCTL_COMPAT.
 */
static long sys3(long nr, long a, long b, long c)
{
	long ret;

	__asm__ volatile("int $0x80" : "=a"(ret) : "a"(nr), "b"(a), "c"(b), "d"(c) : "memory");
	return ret;
}

static char buf[64];

void _start(void)
{
	/* O_LARGEFILE: a render node's size is the GPU VA space, beyond 2 GiB */
	long fd = sys3(5 /* open */, (long)PATH, 2 /* O_RDWR */ | 0x8000 /* O_LARGEFILE */, 0);
	long ret = fd < 0 ? fd : sys3(54 /* ioctl */, fd, (long)CMD, (long)buf);

	sys3(1 /* exit */, ret < 0 ? -ret : 0, 0, 0);
	for (;;)
		;
}
