#!/usr/bin/env bash
# Start the 4 vLLM replicas of one host (one per GPU), matching turnout.yaml:
#   ./vllm-serve.sh            on gpu-a (10.0.0.11) and on gpu-b (10.0.0.12)
# Replica i: GPU i, --port 800i = the endpoint's address, KV events on 555(7+i)
# = kv_events, replay on 556(7+i) = kv_replay, --block-size = kv-aware's
# block_size, and every name of the deployment's `models:` in
# --served-model-name (vLLM answers 404 for a name it does not list).
set -euo pipefail
MODEL=${MODEL:-meta-llama/Llama-3.1-8B-Instruct}
NAMES=${NAMES:-"meta-llama/Llama-3.1-8B-Instruct llama"}   # = deployments[].models
for i in 0 1 2 3; do
  # shellcheck disable=SC2086  # NAMES is a list of names
  CUDA_VISIBLE_DEVICES=$i vllm serve "$MODEL" \
    --host 0.0.0.0 --port $((8000 + i)) \
    --served-model-name $NAMES \
    --enable-prefix-caching --block-size 16 \
    --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:$((5557 + i))\", \"replay_endpoint\": \"tcp://*:$((5567 + i))\"}" \
    >"vllm-$i.log" 2>&1 &
done
wait
