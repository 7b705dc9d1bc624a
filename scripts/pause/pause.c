/*
 * Tessera's sandbox ("pause") process for the test Kubernetes node.
 *
 * Every pod sandbox runs one process that holds its namespaces open and does nothing
 * else. It is PID 1 of the pod when the pod shares its PID namespace, so it must reap
 * orphans that are re-parented to it and must leave promptly when the runtime stops the
 * sandbox (SIGTERM, or SIGINT from a terminal). No registry outside this machine is
 * reachable, so the tests build this image themselves instead of pulling
 * registry.k8s.io/pause.
 *
 * Written for Tessera; built static (gcc -static) so the image needs no libc.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define VERSION "tessera-pause 1"

static volatile sig_atomic_t stop;

static void on_stop(int sig) {
    (void)sig;
    stop = 1;
}

/* Reaps every exited child; SIGCHLD coalesces, so one signal may stand for many. */
static void reap(int sig) {
    int saved = errno;
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int handle(int sig, void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sigemptyset(&sa.sa_mask);
    /* SA_NOCLDSTOP: a stopped child is not one to reap. */
    sa.sa_flags = sig == SIGCHLD ? SA_NOCLDSTOP | SA_RESTART : SA_RESTART;
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "-v") == 0 || strcmp(argv[1], "--version") == 0)) {
        puts(VERSION);
        return 0;
    }
    if (getpid() != 1) {
        /* Not fatal: the runtime decides the PID namespace; say so for whoever debugs. */
        fputs("pause: not PID 1, orphans will not be re-parented here\n", stderr);
    }
    /* Block the signals we wait for, so none lands between the check and the wait. */
    sigset_t wait_for, during_wait;
    sigemptyset(&wait_for);
    sigaddset(&wait_for, SIGINT);
    sigaddset(&wait_for, SIGTERM);
    sigaddset(&wait_for, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &wait_for, &during_wait) != 0 || handle(SIGINT, on_stop) != 0 ||
        handle(SIGTERM, on_stop) != 0 || handle(SIGCHLD, reap) != 0) {
        perror("pause: install signal handlers");
        return 2;
    }
    sigdelset(&during_wait, SIGINT);
    sigdelset(&during_wait, SIGTERM);
    sigdelset(&during_wait, SIGCHLD);
    while (!stop) {
        sigsuspend(&during_wait);
    }
    return 0;
}
