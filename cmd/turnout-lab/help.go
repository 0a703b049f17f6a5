package main

import "github.com/turnout/turnout/internal/cli"

// The commands' help texts (one example each; TestHelp checks them).
const prog = "turnout-lab"

var (
	mockCmd = cli.Command{
		Prog:     prog,
		Synopsis: "turnout-lab mock [--listen ADDR] [--name NAME] [--model NAMES] [flags]",
		About: `Runs one OpenAI-compatible mock vLLM replica (chat, completions, SSE, /health,
/metrics with vLLM's prefix-cache counters, /tokenize, optional KV-cache events)
for demos and tests.`,
		Example: "turnout-lab mock --listen 127.0.0.1:8001 --name llama-0 --model meta-llama/Llama-3.1-8B-Instruct,llama --time-scale 0.05",
	}
	benchReplayCmd = cli.Command{
		Prog:     prog,
		Synopsis: "turnout-lab bench replay|azure --trace FILE [--mode sim|e2e] [--policies SPECS] [flags]",
		About:    `Replays a request trace against every policy and reports prefix-cache hit ratios, load balance and latency (BENCHMARKS.md).`,
		Example:  "turnout-lab bench replay --trace synthetic --limit 200",
	}
	benchFlowCmd = cli.Command{
		Prog:     prog,
		Synopsis: "turnout-lab bench flow [--trace FILE] [--loads 1.2,1.5] [--critical-share F] [flags]",
		About:    `Replays a trace through HAProxy (or nginx) + turnout + mock replicas at multiples of their capacity with two classes and several tenants, and reports TTFT per class with and without flow control and for HAProxy's plain leastconn (BENCHMARKS.md).`,
		Example:  "turnout-lab bench flow --trace synthetic --limit 200 --loads 1.5",
	}
	benchSLOCmd = cli.Command{
		Prog:     prog,
		Synopsis: "turnout-lab bench slo [--trace FILE] [--compress C] [--objective 1s] [--seeds 1,2,3] [flags]",
		About:    `Replays a trace in the sim with a critical and a sheddable class, both with a TTFT objective, and reports each class's attainment for round robin, prefix-affinity, predicted-ttft, and predicted-ttft with flow control's objective (SLO routing and shedding; BENCHMARKS.md).`,
		Example:  "turnout-lab bench slo --trace synthetic --limit 400 --compress 1.5",
	}
	benchCostCmd = cli.Command{
		Prog:     prog,
		Synopsis: "turnout-lab bench cost [--duration D] [--rounds N] [flags]",
		About:    `Measures what a decision costs: /internal/route against a trivial handler, HAProxy and nginx alone against with turnout.`,
		Example:  "turnout-lab bench cost --duration 2s --rounds 3 --nginx ''",
	}
	benchTrivialCmd = cli.Command{
		Prog:     prog,
		Synopsis: "turnout-lab bench trivial [--listen ADDR]",
		About:    `Serves the trivial fasthttp handler that bench cost compares /internal/route with.`,
		Example:  "turnout-lab bench trivial --listen 127.0.0.1:9099",
	}
)
