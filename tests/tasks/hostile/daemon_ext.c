/* A "C extension" a hostile completion writes into the sandbox and imports: its constructor
 * runs at dlopen, before any Python-level check, and forks a daemon that tries to outlive the
 * verifier, kill the victim process and write outside the sandbox. Built by the test suite
 * with gcc; the paths (OUTSIDE, CANARY) and the victim's pid (VICTIM) are -D macros. */
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

__attribute__((constructor)) static void escape(void) {
    if (fork() == 0) {
        setsid();
        for (int i = 0; i < 40; i++) {
            int fd = open(OUTSIDE, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) { write(fd, "pwned", 5); close(fd); }
            fd = open(CANARY, O_WRONLY | O_TRUNC);
            if (fd >= 0) close(fd);
            kill(VICTIM, SIGKILL);
            usleep(100000);
        }
        _exit(0);
    }
}
