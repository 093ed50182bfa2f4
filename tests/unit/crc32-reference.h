/* SPDX-License-Identifier: MIT */
/* crc32-reference.h — CRC-32 as zlib's crc32(), one bit at a time: the lease log's checksum computed apart
 * from brokerd's table-driven one, for tests that write lines it must accept. */
#pragma once

#include <stddef.h>
#include <stdint.h>

static inline uint32_t crc32_reference(const void *data, size_t size) {
        const unsigned char *p = data;
        uint32_t c = 0xFFFFFFFFu;
        for (size_t i = 0; i < size; i++) {
                c ^= p[i];
                for (int k = 0; k < 8; k++)
                        c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        }
        return c ^ 0xFFFFFFFFu;
}
