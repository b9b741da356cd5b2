/* The GPU engines' doorbell watch (ualinkd/gpu_engine.py): a poll of the doorbell slots a
 * daemon thread maps from the doorbell BOs' memfds, without the GIL and without a system
 * call per look, so that a doorbell rung after a quiet spell is seen within about one
 * interval while an idle node pays one timer wake-up per interval (a few microseconds).
 *
 * ualinkd_doorbell_wait: every `interval_ns`, and every `slow_interval_ns` once it has
 * waited `slow_after_ns`, compare each of the n 8-byte slots with its last value (`last`);
 * return the index of the first that differs. Return -1 as soon as *stop is nonzero or
 * *generation differs from `generation0` (the watched set changed: the caller builds the
 * new one), -2 after `timeout_ns` (< 0: none). */
static int ualinkd_doorbell_wait(const uint64_t *const *slots, const uint64_t *last, int n,
                                 int64_t interval_ns, int64_t slow_after_ns,
                                 int64_t slow_interval_ns, int64_t timeout_ns,
                                 const volatile int *stop, const volatile uint64_t *generation,
                                 uint64_t generation0)
{
	struct timespec ts = {(time_t)(interval_ns / 1000000000), (long)(interval_ns % 1000000000)};
	int64_t waited = 0;
	int slow = 0;

	for (;;) {
		if (*stop || *generation != generation0)
			return -1;
		for (int i = 0; i < n; i++)
			if (__atomic_load_n(slots[i], __ATOMIC_ACQUIRE) != last[i])
				return i;
		if (timeout_ns >= 0 && waited >= timeout_ns)
			return -2;
		if (!slow && waited >= slow_after_ns) {
			slow = 1;
			interval_ns = slow_interval_ns;
			ts.tv_sec = (time_t)(interval_ns / 1000000000);
			ts.tv_nsec = (long)(interval_ns % 1000000000);
		}
		nanosleep(&ts, NULL);
		waited += interval_ns;
	}
}
