/* comm/ — psshim's communication among the ranks of one node.
 *
 * Replicated chunks (parameters, optimizer state that DDP keeps identical on every rank)
 * are kept on host once per node: each of the node's N ranks holds 1/N of such a chunk's
 * host copy, and a page-in copies its own shard host->device, then all-gathers the rest in
 * place. The group is the ranks of one node (LOCAL_RANK of LOCAL_WORLD_SIZE): a multi-node
 * job forms one independent group per node and nothing crosses nodes (comm/README.md).
 *
 * The ranks meet in a POSIX shared-memory segment named from the job (rendezvous,
 * configuration agreement, pinned-host accounting) and talk through an NCCL communicator
 * of psshim's own, never the framework's; NCCL is loaded with dlopen("libnccl.so.2")
 * (PSSHIM_NCCL overrides the path) only when a group forms.
 *
 * Every failure reports one line through the error sink ("psshim: ..." on stderr unless
 * psc_set_error_sink says otherwise) and returns false. Every wait is bounded by
 * PSSHIM_COMM_TIMEOUT_S (seconds, default 120) and ends early when a peer's process is
 * gone. One thread at a time drives comm (the allocator's lock), except the host accounting
 * calls and legacy CUDA IPC, which any thread may make. */
#ifndef PSSHIM_COMM_H
#define PSSHIM_COMM_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors ---- */
/* Where failure lines go (without the "psshim: " prefix); NULL restores stderr. */
void psc_set_error_sink(void (*sink)(const char *line));

/* ---- where this process sits (torchrun's variables) ---- */
struct psc_ranks {
  int rank, world_size;             /* RANK, WORLD_SIZE */
  int local_rank, local_world_size; /* LOCAL_RANK, LOCAL_WORLD_SIZE: psshim's group */
  int node_rank;                    /* GROUP_RANK, else NODE_RANK, else 0 */
  double timeout_s;                 /* PSSHIM_COMM_TIMEOUT_S */
  char job_key[256];                /* names the node segment: see psc_ranks_read */
};
enum psc_found { PSC_ALONE = 0, PSC_GROUP = 1, PSC_BAD = -1 };
/* PSC_ALONE when WORLD_SIZE is unset or 1 (one getenv, nothing else) or this rank is alone
 * on its node; PSC_GROUP with *r filled; PSC_BAD after one line naming the variable. The job
 * key holds TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT and MASTER_ADDR:MASTER_PORT,
 * those set (a run id, or an address and a port, is required), the uid and the node rank
 * (two jobs, restarts, users or simulated nodes on one host must not meet). */
enum psc_found psc_ranks_read(struct psc_ranks *r);

/* ---- configuration every rank of the node must share ---- */
struct psc_config {
  uint64_t chunk_size;  /* PSSHIM_CHUNK_SIZE, bytes */
  uint64_t gpu_budget;  /* PSSHIM_GPU_BUDGET, bytes as resolved */
  uint64_t host_budget; /* PSSHIM_HOST_BUDGET, bytes: the node's total for psc_host_reserve
                           (0: no node-wide limit) */
  char policy[16];      /* PSSHIM_POLICY */
};
/* Compares records[0..n) (index = local rank). True if all agree; else writes into line
 * e.g. "rank 1 has PSSHIM_CHUNK_SIZE=32M but rank 0 has 64M" (first differing rank, first
 * differing field). */
bool psc_check_config(const struct psc_config *records, int n, char *line, size_t len);

/* ---- shard geometry: rank r of n holds [offset, offset + len) of every replicated chunk ---- */
struct psc_shard {
  uint64_t offset, len;
};
/* True if chunk_size splits into n equal shards whose length is a multiple of align (0 =
 * 256 bytes; pass the host frame granularity to keep shards mappable); else one line saying
 * which multiple chunk sizes must be. */
bool psc_shard_check(uint64_t chunk_size, int n, uint64_t align);
struct psc_shard psc_shard_of(uint64_t chunk_size, int n, int rank);
/* The smallest multiple of align x (this node's rank count) that is at least preferred: a
 * chunk size every rank can shard in pieces of align. The count is LOCAL_WORLD_SIZE, else
 * WORLD_SIZE, else 1, read quietly: psc_node_join names a bad value. */
uint64_t psc_shardable_chunk_size(uint64_t preferred, uint64_t align);

/* ---- the node group ---- */
/* Reads the ranks; if alone, returns PSC_ALONE having touched nothing else. Otherwise meets
 * the node's other ranks (rank 0 creates the segment), exchanges configurations and refuses
 * a mismatch (psc_check_config) or a chunk size that does not shard (psc_shard_check with
 * shard_align). Needs no CUDA. After PSC_BAD this process is alone (the calls below are
 * no-ops); whether to stop is the caller's choice. */
enum psc_found psc_node_join(const struct psc_config *cfg, uint64_t shard_align);
/* This rank in the group, and the group's size (1 when alone). */
int psc_rank(void);
int psc_nranks(void);
/* Host-side barrier of the node's ranks. */
bool psc_barrier(void);
/* Every rank passes the hash of its allocation sequence up to the first iteration
 * boundary; false, with a line naming the first rank that differs from rank 0, if they
 * differ. */
bool psc_check_alloc_hash(uint64_t hash);
/* Destroys the communicator (if any) and leaves the group; the last rank out removes the
 * segment. */
void psc_node_leave(void);

/* ---- the socket star: sharded chunks' checksums and frames (star.c) ---- */
/* Collective over the node's ranks, host side, each wait bounded by PSSHIM_COMM_TIMEOUT_S;
 * the connections are made on first use. On a failure (a peer gone, a timeout) one line is
 * written, the star is closed for good and this and every later call returns false at
 * once; the peers' calls then fail at once too. */
/* Every rank passes count checksums (0: not a candidate); afterwards agree[i] is true on
 * every rank iff every rank passed the same nonzero sums[i]. */
bool psc_agree_checksums(const uint64_t *sums, size_t count, bool *agree);
#define PSC_MAX_RANKS 64 /* ranks of one node */
/* Every rank passes a file descriptor (or -1: it cannot take part, and gets none); afterwards
 * fds[r] (room for PSC_MAX_RANKS) holds rank r's (new descriptors the caller closes; -1 where
 * rank r passed none). Each is like this rank's own, the same kind of file of the same size,
 * or the exchange fails (one line; the star is closed) and none is returned. Only the job's
 * own ranks reach the star: each end checks the other's credentials (comm/README.md). */
bool psc_share_fds(int mine, int fds[]);
/* Closes the star for good (psc_node_leave does); the peers' next exchange fails. */
void psc_star_close(void);

/* ---- legacy CUDA IPC of psshim's memory (ipc.c) ---- */
/* A process that exported a handle answers those that open it, over an abstract unix socket
 * named from its pid and a random token, with file descriptors; only this user's processes
 * get in (each end checks the other's SO_PEERCRED). Waits are bounded by
 * PSSHIM_COMM_TIMEOUT_S. Usable by any thread, with or without a node group. */
#define PSC_IPC_QUESTION 64 /* bytes: the handle itself */
#define PSC_IPC_ANSWER 64
/* Answers a question: fills answer and *fds (malloc'd; the service closes and frees them)
 * and returns their count, or -1 to refuse it. Runs on the service's thread. */
typedef int (*psc_ipc_answer_fn)(const unsigned char question[PSC_IPC_QUESTION],
                                 unsigned char answer[PSC_IPC_ANSWER], int **fds);
/* This process's token (random, nonzero), the service started by the first call (later
 * calls pass the same function); 0 after one line when it cannot start. */
uint64_t psc_ipc_serve(psc_ipc_answer_fn answer);
/* Asks the service of process pid (token) the question: the count of descriptors in *fds
 * (malloc'd; the caller closes and frees them) with answer filled, or -1 after one line
 * (the process has ended, refuses, or is not who holds the socket). */
int psc_ipc_ask(int32_t pid, uint64_t token, const unsigned char question[PSC_IPC_QUESTION],
                unsigned char answer[PSC_IPC_ANSWER], int **fds);

/* ---- pinned host memory shared by the node's ranks ---- */
/* Reserves bytes of the node's PSSHIM_HOST_BUDGET for this rank: false (nothing reserved)
 * if the ranks together would exceed it once the bytes of dead ranks are reclaimed. Alone,
 * always true: the allocator's own budget is the only limit. */
bool psc_host_reserve(uint64_t bytes);
void psc_host_release(uint64_t bytes);
/* Bytes reserved by the node's ranks (a dead rank's until a reservation reclaims them);
 * 0 when alone. */
uint64_t psc_host_reserved(void);

/* ---- the NCCL communicator (after psc_node_join returned PSC_GROUP) ---- */
/* Loads NCCL, takes rank 0's unique id through the segment and builds the communicator on
 * the current CUDA context's device (each rank on its own GPU). stream_query (the driver's
 * cuStreamQuery) lets psc_stream_wait poll instead of block. A failure here or on a peer
 * gives the communicator up for good. */
bool psc_comm_init(CUresult (*stream_query)(CUstream));
/* Enqueue on stream; buffers are device addresses of this rank's GPU. When NCCL fails, a
 * peer is gone or a wait times out, the line is written, the communicator is aborted and
 * every later call returns false at once, without another line. */
/* buf holds bytes; this rank's shard (psc_shard_of geometry: offset rank*bytes/n) is in
 * place; afterwards the whole buf is. */
bool psc_allgather_inplace(CUdeviceptr buf, size_t bytes, CUstream stream);
/* mins and maxs both hold this rank's count u64 checksums; afterwards mins holds the
 * minimum and maxs the maximum over the ranks. Checksum i is replicated on every rank iff
 * mins[i] == maxs[i]. */
bool psc_checksums_minmax(CUdeviceptr mins, CUdeviceptr maxs, size_t count, CUstream stream);
/* bytes at buf on rank root are copied to buf on every rank. */
bool psc_broadcast(CUdeviceptr buf, size_t bytes, int root, CUstream stream);
/* Waits for stream with the timeout, watching NCCL's asynchronous errors and the peers'
 * processes; on failure aborts the communicator so stuck kernels end. Use it for every host
 * wait on work that includes a collective. */
bool psc_stream_wait(CUstream stream);

#endif
