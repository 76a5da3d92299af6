#!/usr/bin/env bash
# The Qwen3-0.6B shape end to end on the CPU (issue 15): a 28-layer, d 1024, 16/8-head, vocab 151936,
# tied-embedding model with random weights is written as Hugging Face publishes it (sharded BF16,
# config with the newer keys), converted to one float32 file, and both are run on the same prompt:
# the logits must agree (the float32 file holds exactly the BF16 values, so to float rounding of the
# forward itself). Reports peak memory (RSS) of each step and seconds per 1K tokens.
#   scripts/check_qwen3_shape.sh [full|w8s8] [T]
# Needs about 8 GB of memory and 3 GB of disk under ${TMPDIR:-/tmp}.
set -euo pipefail
cd "$(dirname "$0")/.."
PS=${PS:-build/phasescope}
kind=${1:-full}
T=${2:-512}
dir=$(mktemp -d "${TMPDIR:-/tmp}/ps-qwen3-XXXXXX")
trap 'rm -rf "$dir"' EXIT
measure() { # label, command...: runs it, prints peak RSS and wall time
  local label=$1; shift
  /usr/bin/time -f "$label: %e s wall, %M KB peak RSS" "$@" 2>&1 >/dev/null | grep -v '^$' | tail -1
}
python3 - "$T" > "$dir/tokens.json" <<'EOF'
import json, random, sys
random.seed(7)
print(json.dumps([[random.randrange(151936) for _ in range(int(sys.argv[1]))]]))
EOF
measure "init (sharded BF16, Hugging Face layout)" \
  $PS init --config "experiments/configs/qwen3-0.6b/$kind.json" --out "$dir/hf" --format hf --dtype bf16 --shard-mb 400 --seed 3
measure "convert to one float32 file" $PS init --from "$dir/hf" --out "$dir/f32"
measure "info" $PS info --model "$dir/hf"
measure "forward T=$T from the BF16 shards" $PS forward --model "$dir/hf" --tokens "$dir/tokens.json" --out "$dir/a.safetensors"
measure "forward T=$T from the float32 file" $PS forward --model "$dir/f32" --tokens "$dir/tokens.json" --out "$dir/b.safetensors"
python3 - "$dir/a.safetensors" "$dir/b.safetensors" <<'EOF'
import json, struct, sys, array
def read(p):
    with open(p, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        h = json.loads(f.read(n))
        base = 8 + n
        t = h['logits.0']
        f.seek(base + t['data_offsets'][0])
        a = array.array('f')
        a.frombytes(f.read(t['data_offsets'][1] - t['data_offsets'][0]))
        return a
a, b = read(sys.argv[1]), read(sys.argv[2])
num = max(abs(x - y) for x, y in zip(a, b))
den = max(abs(y) for y in b)
print(f"logits: max |a-b| / max |b| = {num / den:.3g} over {len(a)} values")
sys.exit(0 if num / den < 1e-5 else 1)
EOF
