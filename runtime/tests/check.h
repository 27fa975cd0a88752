/* check.h: the C unit tests' assertions. A failed CHECK prints where and why and
 * counts; CHECK_DONE() prints "N passed, N failed" and returns the exit status. */
#ifndef CR_CHECK_H
#define CR_CHECK_H
#include <stdio.h>
#include <string.h>

static int check_passed_, check_failed_;

#define CHECK(cond) do { if (cond) check_passed_++; else { check_failed_++; \
  fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define CHECK_EQ_INT(a, b) do { long long a_ = (long long)(a), b_ = (long long)(b); \
  if (a_ == b_) check_passed_++; else { check_failed_++; \
  fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b, a_, b_); } } while (0)
#define CHECK_NEAR(a, b, eps) do { double a_ = (a), b_ = (b); \
  if (a_ - b_ <= (eps) && b_ - a_ <= (eps)) check_passed_++; else { check_failed_++; \
  fprintf(stderr, "%s:%d: %s ~= %s failed: %.17g != %.17g\n", __FILE__, __LINE__, #a, #b, a_, b_); } } while (0)
#define CHECK_STR(a, b) do { const char *a_ = (a), *b_ = (b); \
  if (a_ && b_ && strcmp(a_, b_) == 0) check_passed_++; else { check_failed_++; \
  fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__, #a, #b, \
          a_ ? a_ : "(null)", b_ ? b_ : "(null)"); } } while (0)
#define CHECK_DONE() (printf("%d passed, %d failed\n", check_passed_, check_failed_), \
  (check_failed_ || !check_passed_) ? 1 : 0)

#endif
