/* What the tests' IPC programs share (C and CUDA C++): a child process forked before either
 * process touched CUDA, with a channel each way between the two (a Unix socket, which also
 * carries file descriptors). tests/toolkit.py puts this folder on every C program's include
 * path; the runtime tests add it to theirs. */
#ifndef VGPU_FORKED_CHILD_H
#define VGPU_FORKED_CHILD_H

#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

struct forked {
    pid_t pid;  /* the child's, in the parent; 0 in the child */
    int in;     /* what the other process writes */
    int out;    /* to the other process */
};

/* Fork, keeping each process's ends of the channels; 1 in both processes, 0 on failure. */
static int fork_with_channels(struct forked *f)
{
    int down[2], up[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, down) != 0 ||
            socketpair(AF_UNIX, SOCK_STREAM, 0, up) != 0)
        return 0;
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

/* The file descriptor `fd` sent over `channel` (an `out`) with `size` bytes of `data` beside
 * it: a descriptor crosses processes only as SCM_RIGHTS. 1 when it went. */
static int send_fd(int channel, int fd, const void *data, size_t size)
{
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov;
    struct msghdr msg;
    memset(control, 0, sizeof control);
    memset(&msg, 0, sizeof msg);
    iov.iov_base = (void *)data;
    iov.iov_len = size;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(channel, &msg, 0) == (ssize_t)size;
}

/* What send_fd sent, from `channel` (an `in`): the descriptor (-1 on failure), its `size`
 * bytes of data into `data`. */
static int receive_fd(int channel, void *data, size_t size)
{
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov;
    struct msghdr msg;
    memset(control, 0, sizeof control);
    memset(&msg, 0, sizeof msg);
    iov.iov_base = data;
    iov.iov_len = size;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    if (recvmsg(channel, &msg, MSG_WAITALL) != (ssize_t)size) return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c == NULL || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) return -1;
    int fd;
    memcpy(&fd, CMSG_DATA(c), sizeof(int));
    return fd;
}

/* Whether the child `pid` exited with status 0. */
static int child_succeeded(pid_t pid)
{
    int status = -1;
    return waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

#endif
