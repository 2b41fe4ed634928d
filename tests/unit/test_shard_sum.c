/* The sharing checksum (allocator/shard.c, psa_shard_sum) changes when any single byte of a
 * chunk changes. Hashing a 2 MiB chunk once per byte of it would take hours, so the test
 * follows the hash's structure: a chunk's hash is its pages' hashes mixed in order, each page
 * hashed from its bytes alone. Every byte offset of a page is changed alone; every page of
 * a chunk is changed alone, through the whole chunk's hash; and the chunk's hash is shown to
 * be its pages' hashes, each taken at another address. A byte skipped anywhere in a chunk
 * fails one of the three. */
#include "allocator/sharing.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK (2u << 20) /* the smallest chunk psshim accepts */
#define SEED 0x5eed

static uint64_t rng = 0x243F6A8885A308D3ull;
static unsigned char next_byte(void)
{
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (unsigned char)(rng >> 24);
}

static unsigned char *random_bytes(size_t n)
{
  unsigned char *p = malloc(n);
  assert_non_null(p);
  for (size_t i = 0; i < n; i++)
    p[i] = next_byte();
  return p;
}

/* Each byte of a whole page, then of a partial one (one 32-byte block and 13 bytes more: the
 * byte-wise tail), changed alone in its lowest and in its highest bit. */
static void test_every_offset_of_a_page(void **state)
{
  (void)state;
  const size_t n = PSA_SUM_PAGE + 32 + 13;
  unsigned char *p = random_bytes(n);
  const uint64_t base = psa_shard_sum(SEED, p, n);
  size_t missed = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    for (unsigned bit = 0x01; bit <= 0x80; bit <<= 7) {
      p[i] ^= (unsigned char)bit;
      if (psa_shard_sum(SEED, p, n) == base && !missed++)
        first = i;
      p[i] ^= (unsigned char)bit;
    }
  if (missed)
    fail_msg("%zu single-bit changes leave a page's checksum as it was, the first at byte %zu", missed, first);
  free(p);
}

/* Every page of a chunk, through the whole chunk's hash: its first and last byte, and six
 * more spread over it at offsets that differ from page to page. */
static void test_every_page_of_a_chunk(void **state)
{
  (void)state;
  unsigned char *p = random_bytes(CHUNK);
  const uint64_t base = psa_shard_sum(SEED, p, CHUNK);
  for (size_t page = 0; page < CHUNK / PSA_SUM_PAGE; page++) {
    size_t at[8] = {0, PSA_SUM_PAGE - 1};
    for (int k = 2; k < 8; k++)
      at[k] = (page * 8 * 131 + (size_t)k * 677) % PSA_SUM_PAGE;
    for (int k = 0; k < 8; k++) {
      size_t i = page * PSA_SUM_PAGE + at[k];
      p[i] ^= 0x10;
      if (psa_shard_sum(SEED, p, CHUNK) == base)
        fail_msg("a change of byte %zu (page %zu) leaves the chunk's checksum as it was", i, page);
      p[i] ^= 0x10;
    }
  }
  free(p);
}

/* The chunk's hash is its pages' hashes in order, each hashed on its own at another address:
 * the whole-chunk path skips nothing that a page's hash sees. */
static void test_chunk_is_its_pages(void **state)
{
  (void)state;
  unsigned char *p = random_bytes(CHUNK), *page = malloc(PSA_SUM_PAGE + 3);
  assert_non_null(page);
  uint64_t h = SEED;
  for (size_t at = 0; at < CHUNK; at += PSA_SUM_PAGE) {
    memcpy(page + 3, p + at, PSA_SUM_PAGE); /* unaligned, elsewhere */
    h = psa_shard_sum(h, page + 3, PSA_SUM_PAGE);
  }
  assert_true(h == psa_shard_sum(SEED, p, CHUNK));
  free(page);
  free(p);
}

/* Two words of a page changed at once, in the sign bit of a double (bit 63) or of the float in
 * their lower half (bit 31), every pair: data that differs in two signs is not shared. */
static void test_two_signs_of_a_page(void **state)
{
  (void)state;
  unsigned char *p = random_bytes(PSA_SUM_PAGE);
  const uint64_t base = psa_shard_sum(SEED, p, PSA_SUM_PAGE);
  for (int byte = 3; byte <= 7; byte += 4)
    for (size_t a = 0; a < PSA_SUM_PAGE; a += 8)
      for (size_t b = a + 8; b < PSA_SUM_PAGE; b += 8) {
        p[a + byte] ^= 0x80, p[b + byte] ^= 0x80;
        if (psa_shard_sum(SEED, p, PSA_SUM_PAGE) == base)
          fail_msg("bit 7 of bytes %zu and %zu changed together leave a page's checksum as it was", a + byte, b + byte);
        p[a + byte] ^= 0x80, p[b + byte] ^= 0x80;
      }
  free(p);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_offset_of_a_page),
      cmocka_unit_test(test_every_page_of_a_chunk),
      cmocka_unit_test(test_chunk_is_its_pages),
      cmocka_unit_test(test_two_signs_of_a_page),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
