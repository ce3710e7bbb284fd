#!/usr/bin/env bash
# Tests of the MPI transport (cargo feature `mpi`) on the system OpenMPI:
# the comm crate's MPI tests (2 and 3 ranks under mpirun), then shardlm under
# `mpirun -np 2|3` against the single-process output (bit-identical ids), and
# a failing rank ending the job.
#
# Needs mpirun, mpicc (or pkg-config's ompi-c) and libclang; on Debian:
#   apt-get install -y openmpi-bin libopenmpi-dev libclang-dev
# Builds only the crates the feature changes, in the shared target dir; the
# MPI build of shardlm is copied to target/mpi/shardlm.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v mpirun >/dev/null; then
  echo "test-mpi: mpirun not found; install OpenMPI (Debian: apt-get install -y openmpi-bin libopenmpi-dev libclang-dev)" >&2
  exit 1
fi
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo)
target=${CARGO_TARGET_DIR:-target}

start=$SECONDS
echo "== comm: MPI transport tests"
cargo test --release -p shardlm-comm --features mpi --lib --test mpi
cargo build --release -p shardlm --features mpi
mkdir -p "$target/mpi"
cp "$target/release/shardlm" "$target/mpi/shardlm"
bin=$target/mpi/shardlm
echo "== built and tested comm with MPI in $((SECONDS - start))s"

ids() { grep -o '"output_ids":\[[^]]*\]'; }
args=(run --model tests/fixtures/tiny/llama --prompt-ids 1,2,3 --max-tokens 4 --json --ignore-eos --threads 1)
want=$("$bin" "${args[@]}" | ids)
[ -n "$want" ] || { echo "test-mpi: no output ids from the single-process run" >&2; exit 1; }
check() { # label, command...
  local label=$1 got
  shift
  got=$(timeout 120 "$@" | ids)
  if [ "$got" != "$want" ]; then
    echo "test-mpi: $label gave $got, single process gave $want" >&2
    exit 1
  fi
  echo "ok: $label $got"
}
echo "== shardlm under mpirun vs one process: $want"
check "mpirun -np 2 (pipeline)" "${MPIRUN[@]}" -np 2 "$bin" "${args[@]}"
check "mpirun -np 3 (pipeline)" "${MPIRUN[@]}" -np 3 "$bin" "${args[@]}"
check "mpirun -np 2 (tensor)" "${MPIRUN[@]}" -np 2 "$bin" "${args[@]}" --strategy tensor

echo "== a failing rank ends the job"
set +e
out=$(timeout 60 "${MPIRUN[@]}" -np 3 "$bin" launch-probe --fail-rank 1 --sleep-rank 0 --sleep-rank 2 --sleep-ms 600000 2>&1)
rc=$?
set -e
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then
  echo "test-mpi: rank 1 failed but the job $([ $rc -eq 0 ] && echo succeeded || echo hung):" >&2
  echo "$out" >&2
  exit 1
fi
echo "ok: job ended with an error"
echo "== MPI tests passed in $((SECONDS - start))s"
