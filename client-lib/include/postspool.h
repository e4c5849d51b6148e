/* libpostspool: announce file changes as Sarracenia v03 posts through the
 * node's postspoold daemon.
 *
 * A post call never hangs and never loses a post: within its time budget it
 * either hands the post to the daemon (which acknowledges once the post is in
 * its journal) or appends it to the spool directory (which the daemon adopts
 * later), or it returns an error code saying why neither worked.
 *
 * Thread-safe: one client may be used from many threads. Fork-safe: a child
 * process never reuses its parent's socket or spool descriptor. The library
 * never prints unless asked (options.log_stderr), never raises SIGPIPE, and
 * retries interrupted system calls.
 *
 * C ABI: plain structs, integer error codes; only postspool_* symbols are
 * exported. Link with `pkg-config --libs libpostspool`. */
#ifndef POSTSPOOL_H
#define POSTSPOOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* The function postspool_post has the name of struct postspool_post, which
 * C++ then calls `struct postspool_post` only; g++'s -Wshadow would warn
 * about the function hiding the struct's constructor in every C++ program
 * that includes this header. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#endif
extern "C" {
#endif

#define POSTSPOOL_VERSION_MAJOR 0
#define POSTSPOOL_VERSION_MINOR 3

/* Error codes: 0 is success, the others are negative. */
enum postspool_error {
  POSTSPOOL_OK = 0,
  POSTSPOOL_EINVAL = -1,      /* a bad argument or post field (see postspool_last_error) */
  POSTSPOOL_ENOMEM = -2,
  POSTSPOOL_ETIMEDOUT = -3,   /* the budget ran out before any transport took the post */
  POSTSPOOL_ENODAEMON = -4,   /* daemon unreachable and spool not writable (see errno detail) */
  POSTSPOOL_ENOSPACE = -5,    /* daemon full or unreachable, and the spool's disk is full */
  POSTSPOOL_EPERM = -6,       /* daemon unreachable, and the spool directory is not writable */
  POSTSPOOL_ETOOBIG = -7,     /* a field is above its limit */
  POSTSPOOL_EIO = -8,         /* daemon unreachable, and the spool write failed */
  POSTSPOOL_ECLOSED = -9      /* the client was closed */
};

/* Which transport took the post (postspool_post_result.transport). */
enum postspool_transport {
  POSTSPOOL_TRANSPORT_NONE = 0,
  POSTSPOOL_TRANSPORT_SOCKET = 1,
  POSTSPOOL_TRANSPORT_SPOOL = 2,
  POSTSPOOL_TRANSPORT_RING = 3
};

typedef struct postspool_client postspool_client;

struct postspool_options {
  uint32_t struct_size;      /* sizeof(struct postspool_options): set by postspool_options_init */
  const char *socket_path;   /* default $POSTSPOOL_SOCKET or /run/postspool/postspoold.sock */
  const char *spool_dir;     /* default $POSTSPOOL_SPOOL_DIR or /var/spool/postspool/incoming */
  uint32_t budget_ms;        /* whole post call; default $POSTSPOOL_BUDGET_MS or 5 */
  uint32_t socket_share_pct; /* share of the budget the socket may use before the spool; default 60 */
  int sync_spool;            /* fdatasync spool appends, fsync new segments (durability
                                "synced"; never syncfs); default 0 */
  int log_stderr;            /* print one line per failed post to stderr; default 0 */
  /* Since 0.2: */
  int use_ring;              /* try the daemon's shared-memory ring first; default
                                $POSTSPOOL_RING or 1 */
};

/* Fills *options with the defaults (reading the environment variables named above). */
void postspool_options_init(struct postspool_options *options);

/* Opens a client. Cheap: connects lazily on the first post. NULL options means defaults.
 * Returns 0 and sets *client, or a negative error code. */
int postspool_open(const struct postspool_options *options, postspool_client **client);
void postspool_close(postspool_client *client);

/* Identity methods (Sarracenia's identity.method). */
enum postspool_identity_method {
  POSTSPOOL_IDENTITY_NONE = 0,
  POSTSPOOL_IDENTITY_SHA512 = 1,    /* value: the 64-byte digest */
  POSTSPOOL_IDENTITY_MD5 = 2,       /* value: the 16-byte digest */
  POSTSPOOL_IDENTITY_COD = 3,       /* value: the algorithm name, e.g. "sha512" */
  POSTSPOOL_IDENTITY_RANDOM = 4,    /* value: text */
  POSTSPOOL_IDENTITY_ARBITRARY = 5  /* value: text */
};

/* File operation flags (Sarracenia's fileOp); combine with |. */
#define POSTSPOOL_OP_REMOVE 0x1u
#define POSTSPOOL_OP_DIRECTORY 0x2u

struct postspool_extra {
  const char *key;
  const char *value;
};

/* One post. Strings are NUL-terminated; NULL means absent. Initialise with
 * postspool_post_init, then set what applies. */
struct postspool_post {
  uint32_t struct_size;
  const char *base_url;      /* NULL: the daemon's post_baseUrl */
  const char *rel_path;      /* required, relative to base_url */
  const char *retrieve_path;
  const char *link;          /* symlink target (fileOp.link) */
  const char *hlink;         /* hard link: the other name (fileOp.hlink; sr3
                                subscribers do not apply it: post the file) */
  const char *rename;        /* the name the file had before (fileOp.rename):
                                its absolute path, which sr3 subscribers map
                                onto their tree (FORMAT.md, "fileOp values") */
  uint32_t op_flags;         /* POSTSPOOL_OP_* */
  int identity_method;       /* enum postspool_identity_method */
  const void *identity_value;
  size_t identity_size;
  int has_size;
  int64_t size;
  int has_mode;
  uint32_t mode;
  int has_mtime;
  int64_t mtime_ns;          /* ns since the epoch */
  int has_atime;
  int64_t atime_ns;
  const struct postspool_extra *extras;
  size_t extras_count;
};

void postspool_post_init(struct postspool_post *post);

struct postspool_post_result {
  uint8_t id[16];     /* the post's unique id (the AMQP message_id) */
  int transport;      /* enum postspool_transport */
};

/* Posts one file change. Returns 0 when a transport took the post, else a
 * negative error code; never takes longer than the budget (plus scheduling
 * delays). `result` may be NULL. */
int postspool_post(postspool_client *client, const struct postspool_post *post,
                   struct postspool_post_result *result);

/* Since 0.3: tells the daemon that this process could not make `count`
 * posts (a shim's post over its budget, or one that postspool_post
 * refused), so that they are counted on the node (metric
 * shim_posts_dropped_total, postspool status), not only in the process. The
 * count goes into the uid's shared-memory ring (FORMAT.md, "The
 * shared-memory ring"), which is asked of the daemon first if the process
 * has none. Returns 0 when the count is in the ring; POSTSPOOL_ENODAEMON
 * when the process has no ring (the daemon is unreachable, refuses rings,
 * or use_ring is 0): the count then stays with the caller. Never takes
 * longer than the budget; a count of 0 does nothing. */
int postspool_report_dropped(postspool_client *client, uint32_t count);

/* A static description of an error code. */
const char *postspool_strerror(int error);

/* The detail of the calling thread's last failed call on any client, e.g.
 * "rel_path is empty" or "spool: open /var/spool/...: Permission denied".
 * Valid until the thread's next call. */
const char *postspool_last_error(void);

#ifdef __cplusplus
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

#endif /* POSTSPOOL_H */
