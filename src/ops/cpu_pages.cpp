// Zeroing without making memory resident, and claiming pages before a product reads them.
#include "ops/cpu_pages.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace hone::cpu_pages {

namespace {

size_t page_size() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

// Whether [begin, end) has a bit set. Read 64 bytes at a time, stopping at the first that
// are not zero: a page read as the kernel's zero page costs a pass over cached memory, a
// written one little more than its clearing.
bool nonzero(const char* begin, const char* end) {
  uint64_t any = 0;
  const char* p = begin;
  for (; p + 64 <= end && any == 0; p += 64) {
    uint64_t words[8];
    std::memcpy(words, p, 64);
    for (const uint64_t w : words) any |= w;
  }
  for (; p < end && any == 0; ++p) any |= uint8_t(*p);
  return any != 0;
}

// Clears [begin, end) unless it is all zero bits already.
void clear_nonzero(char* begin, char* end) {
  if (nonzero(begin, end)) std::memset(begin, 0, size_t(end - begin));
}

// The same for a whole page, whose zeros are written with streaming stores: they skip
// reading the lines they replace (which memset's stores do), about a third less time for
// the gradients' pages after a step. The caller fences the stores.
void clear_nonzero_page(char* p, size_t page) {
  if (!nonzero(p, p + page)) return;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (size_t i = 0; i < page; i += 16) _mm_stream_si128(reinterpret_cast<__m128i*>(p + i), zero);
#else
  std::memset(p, 0, page);
#endif
}

// mincore's answer for the pages [first, last) (page-aligned) in this thread's vector: bit 0
// of each byte set where the page is resident. False where mincore fails.
bool resident_pages(char* first, char* last, std::vector<unsigned char>& resident) {
  resident.resize(size_t(last - first) / page_size());
  return mincore(first, size_t(last - first), resident.data()) == 0;
}

}  // namespace

// Zeroes bytes [begin, end) without making resident a page that is not: memory the
// process never wrote (a fresh arena's, a word embedding's rows no batch has used, with
// their gradients and moments) stays out of its resident set. Resident pages are cleared
// where they are not zero already. A page that is not resident was never written or is
// swapped out: MADV_DONTNEED drops it, and it reads as zeros from then on. That holds for
// private anonymous memory, which is what the CPU backend's tensors live in (its arenas
// and host vectors; page-locked buffers are always resident, so never dropped).
void zero_bytes(char* begin, char* end) {
  const uintptr_t page = page_size();
  char* first = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page);
  char* last = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(end) / page * page);
  if (first >= last) return clear_nonzero(begin, end);
  clear_nonzero(begin, first);
  clear_nonzero(last, end);
  const size_t pages = size_t(last - first) / page;
  thread_local std::vector<unsigned char> resident;
  if (!resident_pages(first, last, resident)) std::fill(resident.begin(), resident.end(), 1);
  for (size_t i = 0; i < pages;) {  // runs of pages that are not resident
    if (resident[i] & 1) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < pages && !(resident[j] & 1)) ++j;
    if (madvise(first + i * page, (j - i) * page, MADV_DONTNEED) != 0)
      std::fill(resident.begin() + ptrdiff_t(i), resident.begin() + ptrdiff_t(j), 1);  // cleared below
    i = j;
  }
  const unsigned char* in_core = resident.data();  // this thread's: the loop's threads read it here
#pragma omp parallel
  {
#pragma omp for schedule(static) nowait
    for (size_t i = 0; i < pages; ++i)
      if (in_core[i] & 1) clear_nonzero_page(first + i * page, page);
#if defined(__SSE2__)
    _mm_sfence();  // this thread's streaming stores are visible before the region's barrier
#endif
  }
}

void claim_for_write(void* begin, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (bytes == 0) return;
  const uintptr_t page = page_size();
  char* first = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(begin) / page * page);
  char* last = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(begin) + bytes + page - 1) / page * page);
  thread_local std::vector<unsigned char> resident;
  if (!resident_pages(first, last, resident)) return;
  for (const unsigned char r : resident)
    if (!(r & 1)) {
      // A hint: a kernel without MADV_POPULATE_WRITE (before 5.14) answers EINVAL, and
      // the product then faults its pages in as before.
      madvise(first, size_t(last - first), MADV_POPULATE_WRITE);
      return;
    }
#else
  (void)begin;
  (void)bytes;
#endif
}

}  // namespace hone::cpu_pages
