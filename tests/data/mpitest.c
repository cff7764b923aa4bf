/*
 * mpitest: the MPI payload of tests/integration/test_hpc_*.py and benchmarks/hpc.py (issue 13).
 * Written for singpy's test suite; compiled by tests/support/mpi.py with the host's `mpicc` (Open MPI).
 *
 * Each rank prints one line:
 *     rank R/N host H mntns mnt:[...] userns user:[...]
 * so that a test sees which rank it was, how many ranks the launcher started and which mount and user
 * namespaces the rank ran in. Then rank 0 prints the sum of all ranks from MPI_Allreduce:
 *     allreduce SUM
 * and, with at least 2 ranks, ranks 0 and 1 exchange a 4 MiB message ROUNDS times (each way), checking
 * the content; rank 0 prints
 *     pingpong ok BYTES
 * A 4 MiB message is above Open MPI's eager limit: shared-memory transport (btl/vader) moves it with its
 * single-copy mechanism (CMA, process_vm_readv), which fails between ranks in different user namespaces.
 * Exit status 0 only if everything matched.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BYTES (4 * 1024 * 1024)
#define ROUNDS 8

static void namespace(const char *name, char *out, size_t size)
{
    char path[64];
    ssize_t length;

    snprintf(path, sizeof path, "/proc/self/ns/%s", name);
    length = readlink(path, out, size - 1);
    if (length < 0) {
        snprintf(out, size, "none");
        return;
    }
    out[length] = '\0';
}

static int pingpong(int rank)
{
    unsigned char *buffer = malloc(BYTES);
    int round, i, peer = rank == 0 ? 1 : 0;

    if (buffer == NULL)
        return 1;
    for (round = 0; round < ROUNDS; round++) {
        if (rank == 0) {
            for (i = 0; i < BYTES; i += 4096)
                buffer[i] = (unsigned char)(round + i / 4096);
            MPI_Send(buffer, BYTES, MPI_BYTE, peer, round, MPI_COMM_WORLD);
            memset(buffer, 0, BYTES);
            MPI_Recv(buffer, BYTES, MPI_BYTE, peer, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (i = 0; i < BYTES; i += 4096) {
                if (buffer[i] != (unsigned char)(round + i / 4096 + 1)) {
                    fprintf(stderr, "pingpong: round %d: wrong byte at %d\n", round, i);
                    free(buffer);
                    return 1;
                }
            }
        } else {
            MPI_Recv(buffer, BYTES, MPI_BYTE, peer, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (i = 0; i < BYTES; i += 4096)
                buffer[i] = (unsigned char)(buffer[i] + 1);
            MPI_Send(buffer, BYTES, MPI_BYTE, peer, round, MPI_COMM_WORLD);
        }
    }
    free(buffer);
    return 0;
}

int main(int argc, char **argv)
{
    int rank, size, sum = 0, failed = 0, any_failed = 0;
    char host[256], mntns[64], userns[64];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    namespace("mnt", mntns, sizeof mntns);
    namespace("user", userns, sizeof userns);
    printf("rank %d/%d host %s mntns %s userns %s\n", rank, size, host, mntns, userns);
    fflush(stdout);

    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (sum != size * (size - 1) / 2)
        failed = 1;
    if (rank == 0) {
        printf("allreduce %d\n", sum);
        fflush(stdout);
    }

    if (size >= 2 && rank < 2)
        failed |= pingpong(rank);
    MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0 && size >= 2 && !any_failed) {
        printf("pingpong ok %d\n", BYTES);
        fflush(stdout);
    }

    MPI_Finalize();
    return any_failed;
}
