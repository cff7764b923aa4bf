/* singpy.kernel._native: the system calls of the launch path, without ctypes.
 *
 * `import ctypes` costs ~1.7 ms of every `singpy exec` (benchmarks/README.md, "Where the time goes"), for
 * a handful of calls Python 3.11's `os` lacks. This module exports exactly those, each a direct call that
 * raises OSError (errno set) on failure; singpy.kernel.syscalls wraps them into KernelError messages.
 * singpy.kernel._libcalls is the same interface through ctypes, used where this module was not built
 * (a plain source tree), so nothing here may behave differently from it.
 *
 * Paths and strings arrive as bytes (os.fsencode), or None where the kernel takes NULL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <linux/capability.h>
#include <sched.h>
#include <stdint.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442 /* one number on every architecture (the unified table of Linux >= 5.3) */
#endif

/* struct mount_attr of <linux/mount.h>, spelled out: Debian 12's headers predate it on some arches. */
struct singpy_mount_attr {
    uint64_t attr_set;
    uint64_t attr_clr;
    uint64_t propagation;
    uint64_t userns_fd;
};

/* "O&" converter: bytes -> its buffer, None -> NULL. The bytes object stays owned by the caller's tuple. */
static int optional_bytes(PyObject *object, void *out) {
    if (object == Py_None) {
        *(const char **)out = NULL;
        return 1;
    }
    if (!PyBytes_Check(object)) {
        PyErr_Format(PyExc_TypeError, "expected bytes or None, not %.50s", Py_TYPE(object)->tp_name);
        return 0;
    }
    if ((size_t)PyBytes_GET_SIZE(object) != strlen(PyBytes_AS_STRING(object))) {
        PyErr_SetString(PyExc_ValueError, "embedded null byte");
        return 0;
    }
    *(const char **)out = PyBytes_AS_STRING(object);
    return 1;
}

/* The common tail: None on success, OSError from errno otherwise. */
static PyObject *result(long value) {
    if (value != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *native_unshare(PyObject *self, PyObject *args) {
    int flags;
    if (!PyArg_ParseTuple(args, "i:unshare", &flags))
        return NULL;
    return result(unshare(flags));
}

static PyObject *native_setns(PyObject *self, PyObject *args) {
    int fd, nstype;
    if (!PyArg_ParseTuple(args, "ii:setns", &fd, &nstype))
        return NULL;
    return result(setns(fd, nstype));
}

static PyObject *native_mount(PyObject *self, PyObject *args) {
    const char *source, *target, *fstype, *data;
    unsigned long flags;
    int value;
    if (!PyArg_ParseTuple(args, "O&yO&kO&:mount", optional_bytes, &source, &target, optional_bytes, &fstype,
                          &flags, optional_bytes, &data))
        return NULL;
    Py_BEGIN_ALLOW_THREADS /* a FUSE mount may wait for its server */
    value = mount(source, target, fstype, flags, data);
    Py_END_ALLOW_THREADS
    return result(value);
}

static PyObject *native_umount2(PyObject *self, PyObject *args) {
    const char *target;
    int flags, value;
    if (!PyArg_ParseTuple(args, "yi:umount2", &target, &flags))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    value = umount2(target, flags);
    Py_END_ALLOW_THREADS
    return result(value);
}

static PyObject *native_pivot_root(PyObject *self, PyObject *args) {
    const char *new_root, *put_old;
    if (!PyArg_ParseTuple(args, "yy:pivot_root", &new_root, &put_old))
        return NULL;
    return result(syscall(SYS_pivot_root, new_root, put_old));
}

static PyObject *native_mount_setattr(PyObject *self, PyObject *args) {
    int fd;
    const char *path;
    unsigned int at_flags;
    unsigned long long attr_set, attr_clr, propagation, userns_fd;
    if (!PyArg_ParseTuple(args, "iyIKKKK:mount_setattr", &fd, &path, &at_flags, &attr_set, &attr_clr,
                          &propagation, &userns_fd))
        return NULL;
    struct singpy_mount_attr attr = {attr_set, attr_clr, propagation, userns_fd};
    return result(syscall(SYS_mount_setattr, fd, path, at_flags, &attr, sizeof(attr)));
}

static PyObject *native_sethostname(PyObject *self, PyObject *args) {
    const char *name;
    Py_ssize_t length;
    if (!PyArg_ParseTuple(args, "y#:sethostname", &name, &length))
        return NULL;
    return result(sethostname(name, (size_t)length));
}

static PyObject *native_prctl(PyObject *self, PyObject *args) {
    int option;
    unsigned long arg2 = 0, arg3 = 0, arg4 = 0, arg5 = 0;
    if (!PyArg_ParseTuple(args, "i|kkkk:prctl", &option, &arg2, &arg3, &arg4, &arg5))
        return NULL;
    return result(prctl(option, arg2, arg3, arg4, arg5) < 0 ? -1 : 0);
}

/* capget/capset of this thread, version 3 (two 32-bit halves per set): six numbers, the effective, permitted
 * and inheritable sets' low halves, then their high halves, as struct __user_cap_data_struct[2] lays them out. */
static PyObject *native_capget(PyObject *self, PyObject *args) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &header, data) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return Py_BuildValue("(IIIIII)", data[0].effective, data[0].permitted, data[0].inheritable,
                         data[1].effective, data[1].permitted, data[1].inheritable);
}

static PyObject *native_capset(PyObject *self, PyObject *args) {
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (!PyArg_ParseTuple(args, "IIIIII:capset", &data[0].effective, &data[0].permitted, &data[0].inheritable,
                          &data[1].effective, &data[1].permitted, &data[1].inheritable))
        return NULL;
    return result(syscall(SYS_capset, &header, data));
}

static PyMethodDef methods[] = {
    {"unshare", native_unshare, METH_VARARGS, "unshare(flags): unshare(2)."},
    {"setns", native_setns, METH_VARARGS, "setns(fd, nstype): setns(2)."},
    {"mount", native_mount, METH_VARARGS, "mount(source, target, fstype, flags, data): mount(2)."},
    {"umount2", native_umount2, METH_VARARGS, "umount2(target, flags): umount2(2)."},
    {"pivot_root", native_pivot_root, METH_VARARGS, "pivot_root(new_root, put_old): pivot_root(2)."},
    {"mount_setattr", native_mount_setattr, METH_VARARGS,
     "mount_setattr(fd, path, at_flags, attr_set, attr_clr, propagation, userns_fd): mount_setattr(2)."},
    {"sethostname", native_sethostname, METH_VARARGS, "sethostname(name): sethostname(2)."},
    {"prctl", native_prctl, METH_VARARGS, "prctl(option, arg2=0, arg3=0, arg4=0, arg5=0): prctl(2), result 0."},
    {"capget", native_capget, METH_NOARGS, "capget(): this thread's capability sets (six 32-bit halves)."},
    {"capset", native_capset, METH_VARARGS, "capset(six halves): set this thread's capability sets."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "The launch path's system calls (see singpy.kernel._libcalls).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
