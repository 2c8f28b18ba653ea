/* Error reporting: every library function that fails leaves a one-line message here.
 * The message is per thread, so worker threads and the caller never clobber each other. */
#ifndef CI_BASE_ERROR_H
#define CI_BASE_ERROR_H

/* Status codes returned by library functions: 0 is success, negative is failure. */
enum { CI_OK = 0, CI_ERR = -1 };

/* Records a printf-style message as the calling thread's last error. Returns CI_ERR so
 * callers can write `return ci_fail("...")`. */
int ci_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prepends "prefix: " to the current last error (adds context while unwinding). Returns CI_ERR. */
int ci_fail_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* For a file parser's failure whose cause may be the file itself: when path cannot be opened for
 * reading, records "cannot open PATH: <reason>" (strerror) and returns 1; else records nothing and
 * returns 0 (the caller reports the parse error). Keeps a JSON library's wording about unopenable
 * files ("unable to open ...", line -1) away from users. */
int ci_fail_if_unopenable(const char *path);

/* The calling thread's last error message ("" when none). Valid until the next ci_fail. */
const char *ci_last_error(void);

/* Clears the calling thread's last error. */
void ci_clear_error(void);

#endif
