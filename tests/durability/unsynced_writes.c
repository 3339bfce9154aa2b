/* unsynced_writes.c: LD_PRELOAD shim that makes kill -9 behave like a power cut
 * for Redis' append-only file.
 *
 * write() to a file whose path contains ".aof" is held in this process' memory
 * until fsync()/fdatasync() of that descriptor, and only then written to the
 * file. Killing the process therefore loses exactly the AOF writes that were
 * never synced, which the OS page cache would otherwise keep. (Files written
 * with stdio, like rewrite outputs, are not intercepted; Redis syncs those.)
 * See docs/decisions.md, "Durability test". Built by tests/durability/conftest.py.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_FD 65536

struct held {
  char *data;
  size_t len, cap;
};

static struct held held[MAX_FD];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static ssize_t (*real_write)(int, const void *, size_t);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_close)(int);

static void init(void) {
  if (!real_write) {
    real_write = dlsym(RTLD_NEXT, "write");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_close = dlsym(RTLD_NEXT, "close");
  }
}

/* Checked on every write: descriptors are reused, and stdio closes bypass us. */
static int is_aof(int fd) {
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  return strstr(path, ".aof") != NULL && strstr(path, "manifest") == NULL;
}

ssize_t write(int fd, const void *buf, size_t count) {
  init();
  if (fd < 0 || fd >= MAX_FD || !is_aof(fd)) return real_write(fd, buf, count);
  pthread_mutex_lock(&mu);
  struct held *h = &held[fd];
  if (h->len + count > h->cap) {
    size_t cap = h->cap ? h->cap : 65536;
    while (cap < h->len + count) cap *= 2;
    char *grown = realloc(h->data, cap);
    if (!grown) {
      pthread_mutex_unlock(&mu);
      return -1;
    }
    h->data = grown;
    h->cap = cap;
  }
  memcpy(h->data + h->len, buf, count);
  h->len += count;
  pthread_mutex_unlock(&mu);
  return (ssize_t)count;
}

static int flush_held(int fd) {
  if (fd < 0 || fd >= MAX_FD) return 0;
  pthread_mutex_lock(&mu);
  struct held *h = &held[fd];
  size_t off = 0;
  while (off < h->len) {
    ssize_t n = real_write(fd, h->data + off, h->len - off);
    if (n <= 0) break;
    off += (size_t)n;
  }
  h->len = 0;
  pthread_mutex_unlock(&mu);
  return 0;
}

int fsync(int fd) {
  init();
  flush_held(fd);
  return real_fsync(fd);
}

int fdatasync(int fd) {
  init();
  flush_held(fd);
  return real_fdatasync(fd);
}

/* Closing without a sync keeps nothing: what a power cut does to it. */
int close(int fd) {
  init();
  if (fd >= 0 && fd < MAX_FD) {
    pthread_mutex_lock(&mu);
    held[fd].len = 0;
    pthread_mutex_unlock(&mu);
  }
  return real_close(fd);
}
