#!/usr/bin/env bash
# Retrains the weak-phase mitigation models (issue 28, docs/mitigations.md, docs/results.md "Closing the weak
# phase"). Usage:
#   scripts/retrain_phasefix.sh deep NAME [OUT]   experiments/configs/deep/NAME.json by the held-out-0.6 rule
#   scripts/retrain_phasefix.sh demo NAME SEED [OUT]   experiments/configs/demo/NAME.json with train.seed SEED
#   scripts/retrain_phasefix.sh short NAME SEED [OUT]  the same cut to 500 steps (the budget of docs/results.md)
#   scripts/retrain_phasefix.sh finetune NAME FROM OUT  NAME's deep config from FROM's weights, by the rule
#   scripts/retrain_phasefix.sh follow NAME FROM OUT LEADER  its control, in lockstep with LEADER
#   scripts/retrain_phasefix.sh all                  the shipped models w8s8_staggered, w8s8_content, deep_phasefix
#   scripts/retrain_phasefix.sh seed SEED            deep_phasefix's recipe at seed SEED (config w8s8_staggered_sSEED)
#                                                    into data/models/deep_phasefix_sSEED, resumable (below)
#   scripts/retrain_phasefix.sh select SEED          deep_w8s8's recipe with the select kind (config select_sSEED)
#                                                    into data/models/deep_select_sSEED, resumable (below)
#   scripts/retrain_phasefix.sh layerstag SEED       deep_phasefix's recipe with per-layer grids (config
#                                                    w8s8_layerstag_sSEED: head_offsets "staggered_layers") into
#                                                    data/models/deep_layerstag_sSEED, resumable (below)
#   scripts/retrain_phasefix.sh overlap SEED         deep_phasefix's recipe with overlapping windows W16/S8 (config
#                                                    w16s8_staggered_sSEED: the same stride, so the same cache bytes)
#                                                    into data/models/deep_overlap_sSEED, resumable (below)
#   scripts/retrain_phasefix.sh park NAME            copy run NAME's unfinished state into data/runs/NAME (to commit)
# A seed, select, layerstag or overlap run takes hours; a session may stop in the middle. Each continues from out/phasefix/ where the
# last checkpoint is, else from data/runs/NAME/ (a parked state, committed by `park NAME`), else from scratch.
# Nothing is written under data/models/ before the run has reached step 8000.
# The deep recipe is retrain_deep.sh's: train 50 steps at a time (--resume is bit-identical to one run) until
# the first evaluation with held-out accuracy >= 0.6, at most 8000 steps. One thread (OMP_NUM_THREADS=1).
set -euo pipefail
cd "$(dirname "$0")/.."
PS=${PS:-build/phasescope}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
last_step() { grep '"type":"eval"' "$1/train.jsonl" | tail -1 | sed 's/.*"step":\([0-9]*\).*/\1/'; }
first_at() { # first_at CFG DIR ACC [INIT_FROM]: until held-out accuracy >= ACC (from INIT_FROM's weights if given)
  local cfg=$1 dir=$2 want=$3 init=${4:-} step=0 last acc
  if [ "${RESUME:-0}" != 1 ]; then # RESUME=1: continue a run that was interrupted (from its last checkpoint)
    rm -rf "$dir"
    $PS train --config "$cfg" --out "$dir" --stop-after 50 ${init:+--init-from "$init"} > /dev/null
  fi
  while :; do
    last=$(grep '"type":"eval"' "$dir/train.jsonl" | tail -1)
    step=$(sed 's/.*"step":\([0-9]*\).*/\1/' <<<"$last")
    acc=$(sed 's/.*"accuracy":\([0-9.eE+-]*\).*/\1/' <<<"$last")
    awk -v a="$acc" -v w="$want" 'BEGIN { exit !(a >= w) }' && break
    [ "$step" -ge 8000 ] && { echo "$dir: held-out accuracy $acc < $want after 8000 steps" >&2; return 1; }
    $PS train --config "$cfg" --out "$dir" --resume --stop-after $((step + 50)) > /dev/null
  done
  echo "$dir: stopped at step $step (held-out accuracy $acc)"
  echo "$step" > "$dir/stopped_at"
  rm -f "$dir"/optimizer-*.safetensors
  $PS render "$dir/train.jsonl" --out "$dir" > /dev/null
}
follow() { # follow CFG DIR LEADER INIT_FROM: the control of a fine-tune, trained in lockstep with the run in
  # LEADER (never past its step) and stopped at the step LEADER stopped at (LEADER/stopped_at)
  local cfg=$1 dir=$2 lead=$3 init=$4 step=0 ls
  if [ "${FOLLOW_RESUME:-0}" != 1 ]; then # FOLLOW_RESUME=1: continue a follower that was interrupted
    rm -rf "$dir"
    $PS train --config "$cfg" --out "$dir" --stop-after 50 --init-from "$init" > /dev/null
  fi
  while :; do
    step=$(last_step "$dir")
    if [ -f "$lead/stopped_at" ] && [ "$step" -ge "$(cat "$lead/stopped_at")" ]; then break; fi
    ls=$(last_step "$lead" 2>/dev/null || echo 0)
    if [ "$step" -ge "${ls:-0}" ] && [ ! -f "$lead/stopped_at" ]; then sleep 15; continue; fi
    $PS train --config "$cfg" --out "$dir" --resume --stop-after $((step + 50)) > /dev/null
  done
  echo "$dir: stopped at step $step with its leader $lead"
  echo "$step" > "$dir/stopped_at"
  rm -f "$dir"/optimizer-*.safetensors
  $PS render "$dir/train.jsonl" --out "$dir" > /dev/null
}
rule_then_end() { # rule_then_end CFG RULE_DIR CONT_DIR NAME: train CFG from scratch by the held-out-0.6 rule into
  # RULE_DIR, then on from the rule's weights (a fresh optimizer) to step 8000 into CONT_DIR, then copy it to
  # data/models/NAME (the rule's checkpoint stays in RULE_DIR). Resumable: continues from out/phasefix/ where the
  # last checkpoint is, else from data/runs/NAME/{rule,cont} (a parked state, `park NAME`), else from scratch.
  local cfg=$1 rule=$2 cont=$3 name=$4 park=data/runs/$4 s d
  for d in rule cont; do # restore a parked phase that out/ lacks
    [ -d "$park/$d" ] && [ ! -f "${!d}/train.jsonl" ] && { mkdir -p "${!d}"; cp -r "$park/$d/." "${!d}/"; }
  done
  if [ ! -f "$rule/stopped_at" ]; then
    RESUME=$([ -f "$rule/train.jsonl" ] && echo 1 || echo 0) first_at "$cfg" "$rule" 0.6
  fi
  s=$(cat "$rule/stopped_at")
  if [ -f "$cont/train.jsonl" ]; then
    $PS train --config "$cfg" --out "$cont" --resume --stop-after $((8000 - s)) > /dev/null
  else
    $PS train --config "$cfg" --out "$cont" --init-from "$rule" --stop-after $((8000 - s)) > /dev/null
  fi
  rm -rf "data/models/$name" "$park"
  cp -r "$cont" "data/models/$name"
  rm -f data/models/$name/optimizer-*.safetensors
  $PS render "data/models/$name/train.jsonl" --out "data/models/$name" > /dev/null
  echo "data/models/$name: step 8000 (rule at step $s)"
}
demo_seed() { # demo_seed NAME SEED DIR [STEPS]: the 1-layer recipe with another seed (and step budget)
  local name=$1 seed=$2 dir=$3 steps=${4:-} cfg
  cfg=$(mktemp --suffix=.json)
  sed -e "s/\"seed\": *[0-9]*/\"seed\": $seed/" ${steps:+-e "s/\"steps\": *[0-9]*/\"steps\": $steps/"} \
    "experiments/configs/demo/$name.json" > "$cfg"
  rm -rf "$dir"
  $PS train --config "$cfg" --out "$dir" > /dev/null
  rm -f "$cfg" "$dir"/optimizer-*.safetensors
  echo "$dir: trained (seed $seed)"
}
case "${1:-all}" in
  deep) first_at "experiments/configs/deep/$2.json" "${3:-out/phasefix/deep_$2}" 0.6 ;;
  finetune) # finetune NAME FROM OUT: NAME's config from FROM's weights, by the held-out-0.6 rule
    first_at "experiments/configs/deep/$2.json" "$4" 0.6 "$3" ;;
  follow) # follow NAME FROM OUT LEADER
    follow "experiments/configs/deep/$2.json" "$4" "$5" "$3" ;;
  demo) demo_seed "$2" "$3" "${4:-out/phasefix/$2_s$3}" ;;
  short) # short NAME SEED [OUT]: the 1-layer recipe cut to 500 steps (what this machine allowed; docs/results.md)
    demo_seed "$2" "$3" "${4:-out/phasefix/short_$2_s$3}" 500 ;;
  all) # the shipped mitigation models (one thread): the 1-layer staggered model (the demo recipe cut to 500 steps,
    # seed 1), the 1-layer content-chunk model (the demo recipe, 1500 steps, seed 1) and deep_phasefix (deep
    # staggered grids from scratch by the held-out-0.6 rule, then continued to step 8000 as deep_w8s8 was trained,
    # from the rule's checkpoint with a fresh optimizer state: docs/results.md "Closing the weak phase")
    demo_seed w8s8_staggered 1 data/models/w8s8_staggered 500
    $PS render data/models/w8s8_staggered/train.jsonl --out data/models/w8s8_staggered > /dev/null
    demo_seed w8s8_content 1 data/models/w8s8_content
    $PS render data/models/w8s8_content/train.jsonl --out data/models/w8s8_content > /dev/null
    first_at experiments/configs/deep/w8s8_staggered.json out/phasefix/deep_w8s8_staggered 0.6
    s=$(cat out/phasefix/deep_w8s8_staggered/stopped_at)
    rm -rf data/models/deep_phasefix
    $PS train --config experiments/configs/deep/w8s8_staggered.json --out data/models/deep_phasefix \
      --init-from out/phasefix/deep_w8s8_staggered --stop-after $((8000 - s)) > /dev/null
    rm -f data/models/deep_phasefix/optimizer-*.safetensors ;;
  seed) # seed SEED: deep_phasefix's recipe (the two phases of `all`) at another seed, resumable
    rule_then_end "experiments/configs/deep/w8s8_staggered_s$2.json" out/phasefix/deep_w8s8_staggered_s$2 \
      out/phasefix/deep_phasefix_s$2 "deep_phasefix_s$2" ;;
  select) # select SEED: deep_w8s8's recipe with the select kind (issue 46), the same two phases, resumable
    rule_then_end "experiments/configs/deep/select_s$2.json" out/phasefix/deep_select_s$2_rule out/phasefix/deep_select_s$2 \
      "deep_select_s$2" ;;
  layerstag) # layerstag SEED: deep_phasefix's recipe with o_{l,g} = (g + 3l) mod 8 (docs/mitigations.md 1c), resumable
    rule_then_end "experiments/configs/deep/w8s8_layerstag_s$2.json" out/phasefix/deep_layerstag_s$2_rule \
      out/phasefix/deep_layerstag_s$2 "deep_layerstag_s$2" ;;
  overlap) # overlap SEED: deep_phasefix's recipe with W16/S8 windows on staggered grids (issue 46), resumable
    rule_then_end "experiments/configs/deep/w16s8_staggered_s$2.json" out/phasefix/deep_overlap_s$2_rule \
      out/phasefix/deep_overlap_s$2 "deep_overlap_s$2" ;;
  park) # park NAME: an unfinished run's state (weights, AdamW state, logs) into data/runs/NAME to be committed
    # (NAME deep_phasefix_sSEED, deep_select_sSEED, deep_layerstag_sSEED or deep_overlap_sSEED)
    park=data/runs/$2
    case "$2" in
      deep_phasefix_s*) rule=out/phasefix/deep_w8s8_staggered_s${2#deep_phasefix_s} ;;
      deep_select_s*|deep_layerstag_s*|deep_overlap_s*) rule=out/phasefix/$2_rule ;;
      *) echo "park: unknown run $2" >&2; exit 2 ;;
    esac
    rm -rf "$park"
    for d in rule:$rule cont:out/phasefix/$2; do
      [ -f "${d#*:}/train.jsonl" ] || continue
      mkdir -p "$park/${d%%:*}"
      cp "${d#*:}"/*.json* "${d#*:}"/model.safetensors "$park/${d%%:*}/" 2>/dev/null || true
      # the AdamW state only where the phase goes on (a finished rule phase restarts from its weights alone)
      if [ -f "${d#*:}/stopped_at" ]; then cp "${d#*:}/stopped_at" "$park/${d%%:*}/"
      else cp "${d#*:}"/optimizer-*.safetensors "$park/${d%%:*}/" 2>/dev/null || true; fi
    done
    echo "parked in $park: $(ls "$park" 2>/dev/null | tr '\n' ' ')" ;;
  *) echo "usage: $0 deep NAME [OUT] | demo NAME SEED [OUT] | short NAME SEED [OUT] | finetune NAME FROM OUT | follow NAME FROM OUT LEADER | all | seed SEED | select SEED | layerstag SEED | overlap SEED | park NAME" >&2; exit 2 ;;
esac
