// The pages under the CPU backend's tensors. Its arenas are private anonymous memory: a page
// the process never wrote is not resident and reads as zeros, so untouched memory (a word
// embedding's unused rows, with their gradients and moments) costs no resident memory.
#pragma once

#include <cstddef>

namespace hone::cpu_pages {

// Zeroes bytes [begin, end) without making resident a page that is not.
void zero_bytes(char* begin, char* end);

// Makes the pages under [begin, begin + bytes) resident and writable before a product that
// reads them (one that adds to its output) does. Read first, a page that is not resident
// maps the kernel's shared zero page, and the write after it replaces that mapping, which
// costs a TLB shootdown on every other core running the process: about 15 us a page in a
// VM, over a second in the first step of a bert-base run on 2 cores. Writing first costs
// only the page's allocation. Pages resident already (every step after the first) cost a
// mincore call.
void claim_for_write(void* begin, size_t bytes);

}  // namespace hone::cpu_pages
