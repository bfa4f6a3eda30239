/*
 * Guarded access to mapped member files (see src/guard.rs).
 *
 * Touching a page of a file mapping that the file no longer backs (a file
 * truncated under the server, a page the file system cannot read or
 * allocate) raises SIGBUS, which would kill the server. A guarded call
 * catches a SIGBUS raised on its own thread while it runs and returns 1
 * instead: the handler jumps back to the call with siglongjmp, which Rust
 * cannot express, hence this file. SIGBUS raised anywhere else goes to the
 * handler that was there before (by default: the process dies as it would
 * have without this).
 */
#include <setjmp.h>
#include <signal.h>
#include <string.h>

/* The innermost guarded call of this thread, or NULL. */
static __thread sigjmp_buf *volatile guard_jump;
static struct sigaction previous;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
	sigjmp_buf *jump = guard_jump;

	if (jump) {
		guard_jump = NULL;
		siglongjmp(*jump, 1);
	}
	if (previous.sa_flags & SA_SIGINFO) {
		previous.sa_sigaction(sig, info, context);
		return;
	}
	if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
		previous.sa_handler(sig);
		return;
	}
	/* Returning re-runs the faulting access, which now gets the default. */
	signal(SIGBUS, SIG_DFL);
}

/* Install the handler (once per process: the caller sees to that). */
int raidkit_guard_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, &previous);
}

/*
 * Call f(arg); 0 when it returned, 1 when a SIGBUS on this thread cut it
 * short. The signal mask is saved and restored (sigsetjmp's second
 * argument), so SIGBUS, blocked while its handler runs, is unblocked again.
 */
int raidkit_guarded(void (*f)(void *), void *arg)
{
	sigjmp_buf here;
	sigjmp_buf *outer = guard_jump;

	if (sigsetjmp(here, 1)) {
		guard_jump = outer;
		return 1;
	}
	guard_jump = &here;
	f(arg);
	guard_jump = outer;
	return 0;
}
