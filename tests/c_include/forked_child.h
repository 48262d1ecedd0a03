/* What the tests' IPC programs share (C and CUDA C++): a child process forked before either
 * process touched CUDA, with a pipe each way between the two. tests/toolkit.py puts this
 * folder on every C program's include path; the runtime tests add it to theirs. */
#ifndef VGPU_FORKED_CHILD_H
#define VGPU_FORKED_CHILD_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

struct forked {
    pid_t pid;  /* the child's, in the parent; 0 in the child */
    int in;     /* what the other process writes */
    int out;    /* to the other process */
};

/* Fork, keeping each process's ends of the pipes; 1 in both processes, 0 on failure. */
static int fork_with_pipes(struct forked *f)
{
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) return 0;
    f->pid = fork();
    if (f->pid < 0) return 0;
    int child = f->pid == 0;
    close(child ? down[1] : down[0]);
    close(child ? up[0] : up[1]);
    f->in = child ? down[0] : up[0];
    f->out = child ? up[1] : down[1];
    return 1;
}

/* All `size` bytes read from `fd` into `buffer` (or, `writing`, written to it); 1 when they
 * all went. */
static int transfer(int fd, void *buffer, size_t size, int writing)
{
    char *p = (char *)buffer;
    while (size) {
        ssize_t done = writing ? write(fd, p, size) : read(fd, p, size);
        if (done <= 0) return 0;
        p += done;
        size -= (size_t)done;
    }
    return 1;
}

/* Whether the child `pid` exited with status 0. */
static int child_succeeded(pid_t pid)
{
    int status = -1;
    return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#endif
