/*
 * vmarena.h: the C API of libvmarena, vmarena's memory as a shared library
 * that PyTorch (torch.cuda.memory.CUDAPluggableAllocator) or any C program
 * can load. Build the library with
 *
 *     go build -buildmode=c-shared -o libvmarena.so ./cmd/libvmarena
 *
 * Threads. Every function runs on the calling thread, start to end, and is
 * safe to call from any thread. On the cuda driver the library's calls use
 * the device's primary context (the one PyTorch and the CUDA runtime use)
 * and leave the thread's current context as the caller had it: the
 * primary context, when current, is used as it is; another context (one of
 * the caller's own) is replaced for the library's calls and is current
 * again when the function returns; a thread with none current is left the
 * primary context, as the CUDA runtime leaves it.
 *
 * Streams. Memory is not stream-ordered: vmarena_free may unmap the memory
 * and give it back at once, and CUDA's cuMemUnmap and cuMemRelease, unlike
 * cudaFree, do not wait for kernels still using it. PyTorch does not wait
 * either: CUDAPluggableAllocator calls free with the stream the memory was
 * allocated on when a tensor dies, its kernels perhaps still queued, and a
 * MemPool's caching allocator calls it when it releases a segment, having
 * waited only for the other streams that used it (record_stream), as it
 * relies on cudaFree's synchronization elsewhere. So on the cuda driver
 * vmarena_free first waits for the work queued so far on its stream
 * (cuStreamQuery, then cuStreamSynchronize if it is busy, on the calling
 * thread; NULL is the default stream of the device's primary context,
 * PyTorch's stream 0), then frees. Work
 * queued on other streams is the caller's to order (PyTorch's
 * record_stream). On acl vmarena_free waits likewise
 * (aclrtSynchronizeStream; NULL is the default stream of the calling
 * thread's current context, torch_npu's, and on a thread with no context
 * of the caller's the whole device is waited for). On the host driver the
 * stream argument is not looked at. vmarena_alloc's stream is not looked
 * at on any driver.
 *
 * Errors. A function that fails returns its error code (or NULL) and
 * records a message that vmarena_last_error returns on the same thread.
 * No Go panic ever crosses into C: each function recovers one and reports
 * it as VMARENA_ERR_OTHER.
 *
 * Environment, read at the first call that needs a device (and again after
 * vmarena_shutdown):
 *   VMARENA_DRIVER       host (the default: this machine's memory, through
 *                        memfd and mmap), cuda or acl.
 *   VMARENA_DEVICES      host: the number of logical devices (default 1),
 *                        numbered 0 up; cuda and acl: a comma-separated list
 *                        of device ordinals to open (default: every one).
 *                        The device arguments below are these ordinals (on
 *                        cuda the ordinals PyTorch uses, after
 *                        CUDA_VISIBLE_DEVICES).
 *   VMARENA_CAPACITY     the most memory per device the library may commit,
 *                        in bytes or with a unit (4096, 512MiB, 1.5GiB;
 *                        KiB..TiB are binary, KB..TB decimal: 80GB is
 *                        80 x 10^9 bytes).
 *                        Default: on host half of the memory available, on
 *                        cuda and acl the device's memory.
 *   VMARENA_TAG_MAX      the most one tag may hold per device (default: the
 *                        capacity).
 *   VMARENA_BACKUP_DIR   where VMARENA_SLEEP_FILE writes its backups
 *                        (default: $TMPDIR, else /tmp). It is first used
 *                        by such a sleep: one that cannot write there
 *                        fails naming the variable, the tag awake.
 *   VMARENA_HOST_CACHE   how much pinned host memory each device may keep
 *                        after a VMARENA_SLEEP_HOST wake for the next
 *                        sleep of the same sizes (default 0: every backup
 *                        is given back at wake). Pinning is what a sleep
 *                        and wake cost most on a GPU; stats_json reports
 *                        what is kept as host_cache_bytes.
 *   VMARENA_CUDA_LIBRARY the CUDA driver library to load (default
 *                        libcuda.so.1).
 *   VMARENA_ACL_LIBRARY  the AscendCL runtime to load (default
 *                        libascendcl.so).
 * A bad value makes the calls that need a device fail with
 * VMARENA_ERR_INVALID, naming the variable.
 */
#ifndef VMARENA_H
#define VMARENA_H

#include <stddef.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* PyTorch's stream type in the allocator's ABI. */
typedef void* cudaStream_t;

/* Return codes: 0 for success, a negative code per class of failure. */
#define VMARENA_OK                 0
#define VMARENA_ERR_INVALID       -1 /* a bad argument: size, pointer, tag, mode, or a variable above */
#define VMARENA_ERR_OUT_OF_MEMORY -2 /* the device, or the tag's VMARENA_TAG_MAX, is full */
#define VMARENA_ERR_BUSY          -3 /* in use: an allocation under a sleeping tag, vmarena_shutdown with allocations live */
#define VMARENA_ERR_UNSUPPORTED   -4 /* this build or driver cannot do it, or no vendor driver library loads */
#define VMARENA_ERR_CLOSED        -5 /* used after being closed */
#define VMARENA_ERR_NO_DEVICE     -6 /* no such device */
#define VMARENA_ERR_OTHER         -7 /* anything else, a recovered panic among them */

/* Sleep modes: what vmarena_sleep keeps of a tag's contents. */
#define VMARENA_SLEEP_DISCARD 0 /* nothing: the memory wakes with undefined contents */
#define VMARENA_SLEEP_HOST    1 /* a copy in host memory the library owns, freed at wake */
#define VMARENA_SLEEP_FILE    2 /* a copy in a file under VMARENA_BACKUP_DIR, removed at wake */

/*
 * vmarena_alloc allocates size bytes on device under the calling thread's
 * tag (see vmarena_set_tag) and returns its address, or NULL on error (a
 * size of 0 or less among them). PyTorch's CUDAPluggableAllocator alloc.
 */
extern void* vmarena_alloc(ssize_t size, int device, cudaStream_t stream);

/*
 * vmarena_free frees the allocation at ptr of device. size, when not 0,
 * must be the size it was allocated with. NULL is nothing to free. On the
 * cuda driver it first waits for the work queued on stream (see Streams
 * above). On error (a pointer not allocated, freed twice, a wrong size or
 * device, a stream whose wait fails) nothing is freed, the message goes to
 * vmarena_last_error and the stats count it in free_errors. PyTorch's
 * CUDAPluggableAllocator free.
 */
extern void vmarena_free(void* ptr, size_t size, int device, cudaStream_t stream);

/*
 * vmarena_set_tag makes tag the tag of the calling thread's allocations
 * that follow; NULL or "" is the default tag, "default". A tag is printable
 * ASCII of at most 128 bytes; a process may name 1,024 distinct tags. On
 * error the thread's tag does not change. Every function that takes a tag
 * reads at most 129 bytes of it: one with no NUL among them is
 * VMARENA_ERR_INVALID.
 */
extern int vmarena_set_tag(const char* tag);

/*
 * vmarena_sleep gives back the memory of the allocations under tag (NULL:
 * every tag; "" is the default tag, as for vmarena_set_tag) on every device, keeping their addresses, after the work that
 * used them; mode is a VMARENA_SLEEP_ value. It does not know the streams
 * the allocations were made on: sleep synchronizes each device whole first (cuda: cuCtxSynchronize in the device's primary
 * context, PyTorch's; acl: aclrtSynchronizeDevice; host: the driver's own
 * streams), so work queued on any stream has finished before a byte is
 * copied or unmapped. A libcuda or libascendcl without that call waits for
 * the library's own streams only. Sleeping a sleeping tag does
 * nothing; a tag that has never allocated is VMARENA_ERR_INVALID; a
 * mode the driver cannot keep (VMARENA_SLEEP_HOST or _FILE on a driver
 * whose memory cannot be read back) is VMARENA_ERR_UNSUPPORTED and leaves
 * the tag awake.
 */
extern int vmarena_sleep(const char* tag, int mode);

/*
 * vmarena_wake takes the memory of tag (NULL: every tag; "": the default
 * tag) back at the same addresses with the same access, and restores the
 * contents its sleep kept.
 * Waking an awake tag does nothing; a wake that fails leaves the tag
 * asleep, its backup whole.
 */
extern int vmarena_wake(const char* tag);

/*
 * vmarena_last_error is the message of the calling thread's last failed
 * call ("" if none): a NUL-terminated string of at most 1,023 bytes in
 * thread-local storage the library owns. The pointer stays valid for the
 * thread's life; its contents change at the thread's next failed call. A
 * call that succeeds does not clear it.
 */
extern const char* vmarena_last_error(void);

/*
 * vmarena_stats_json reports the library's state as one JSON object:
 *   {"driver": "host", "open": true, "free_errors": 0,
 *    "devices": [{"device": 0, "tags": [{"tag": "default", "live": 1,
 *      "asleep": false, "mode": "discard", "awake_bytes": 2097152,
 *      "asleep_bytes": 0, "backup_bytes": 0, "cycles": 0}]}]}
 * Devices and tags appear once they have allocated. awake_bytes is the
 * memory committed under the tag (whole chunks: at least its live bytes),
 * asleep_bytes what its sleep gave back, backup_bytes what its backup
 * holds, cycles its completed sleep and wake cycles. The string is the
 * caller's: free it with vmarena_free_string. NULL on error.
 */
extern char* vmarena_stats_json(void);

/*
 * vmarena_free_string frees a string vmarena_stats_json returned. NULL is
 * nothing to free; any other pointer (a string freed already, one the
 * library did not return, a pointer inside one) frees nothing, and the
 * message goes to vmarena_last_error.
 */
extern void vmarena_free_string(char* s);

/*
 * vmarena_shutdown closes every device's memory and the driver, returning
 * what the library holds to the system; the next call opens them again,
 * reading the environment anew. While any allocation is live it returns
 * VMARENA_ERR_BUSY and closes nothing.
 */
extern int vmarena_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif /* VMARENA_H */
