/* pause: the sandbox (infra) process of the nodelet test bed.
 *
 * Holds the pod's namespaces open and does nothing else: it exits 0 on
 * SIGINT or SIGTERM, reaps any child handed to it (it runs as PID 1 of the
 * pod's PID namespace), and otherwise sleeps in pause() forever.
 * Built with: gcc -static -O2 -o pause pause.c
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_child(int sig)
{
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    errno = saved;
}

static int handle(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(void)
{
    if (handle(SIGINT, on_stop, 0) || handle(SIGTERM, on_stop, 0) ||
        handle(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART)) {
        static const char msg[] = "pause: sigaction failed\n";
        (void)!write(2, msg, sizeof msg - 1);
        return 1;
    }
    for (;;)
        pause();
    return 42; /* not reached */
}
