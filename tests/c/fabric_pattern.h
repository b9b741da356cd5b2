/*
 * The bytes of the two-node fabric tests (tests/integration/test_fabric_sdma.py): the
 * exporter (`fabric_sdma export`) fills its BO with pattern seed 1 and checks what an
 * importer stored there against seed 2; the importers (fabric_sdma import, rocr_fabric)
 * compare and store with the same function, so both sides agree by construction.
 */
#ifndef FABRIC_PATTERN_H
#define FABRIC_PATTERN_H
#include <stddef.h>
#include <stdint.h>

static inline void pattern(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed * 2654435761u + 7;

	for (size_t i = 0; i < n; i++) {
		x = x * 1103515245u + 12345u;
		p[i] = (uint8_t)(x >> 16);
	}
}

#endif
