package bench

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

var costHeader = []string{"group", "target", "loadgen", "conns", "requests", "errors", "rps", "rps_ratio", "p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms",
	"proxy_rss_mib", "rss_ratio", "turnout_rss_mib", "idle_before_mib", "proxy_cpu_us_per_req", "turnout_cpu_us_per_req",
	"proxy_syscalls_per_req", "proxy_faults_per_req", "proxy_cs_per_req", "round_rps", "note"}

func (r *CostRow) fields() []string {
	var rounds []string
	for _, v := range r.roundRPS {
		rounds = append(rounds, strconv.FormatFloat(v, 'f', 0, 64))
	}
	f3 := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	return []string{r.Group, r.Target, r.LoadGen, strconv.Itoa(r.Conns), strconv.Itoa(r.Requests), strconv.Itoa(r.Errors),
		f1(r.RPS), f3(r.Ratio), f3(r.P50), f3(r.P99), f3(r.AddedP50), f3(r.AddedP99),
		f1(r.ProxyRSS), f3(r.RSSRatio), f1(r.TurnoutRSS), f1(r.IdleBefore), f1(r.ProxyCPU), f1(r.TurnoutCPU),
		f3(r.ProxySyscalls), f3(r.ProxyFaults), f3(r.ProxyCtxSwitches), strings.Join(rounds, " "), r.Note}
}

// WriteCostCSV writes cost rows with a header.
func WriteCostCSV(w io.Writer, rows []CostRow) error {
	return writeCSV(w, costHeader, len(rows), func(i int) []string { return rows[i].fields() })
}

// WriteCostTable writes cost rows for terminals.
func WriteCostTable(w io.Writer, rows []CostRow) error {
	return writeTable(w, "group\ttarget\tloadgen\tconns\trequests\terrors\trps\tratio\tp50 ms\tp99 ms\t+p50 ms\t+p99 ms\tproxy MiB\tRSS ratio\tturnout MiB\tproxy µs/req\tturnout µs/req\tsyscalls/req\tfaults/req\tcs/req\t", len(rows), func(tw io.Writer, i int) {
		r := &rows[i]
		if r.Note != "" {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\n", r.Group, r.Target, r.Note)
			return
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.3f\t%+.3f\t%+.3f\t%s\t%.2f\t%.1f\t%.1f\t%.1f\t%.2f\t%.3f\t%.2f\t\n", r.Group, r.Target, r.LoadGen, r.Conns,
			r.Requests, r.Errors, r.RPS, r.Ratio, r.P50, r.P99, r.AddedP50, r.AddedP99, r.rssText(), r.RSSRatio, r.TurnoutRSS, r.ProxyCPU, r.TurnoutCPU,
			r.ProxySyscalls, r.ProxyFaults, r.ProxyCtxSwitches)
	})
}

// rssText is the proxy memory cell: the peak under load, or for the idle
// rows before -> with the idle connections.
func (r *CostRow) rssText() string {
	if r.Idle {
		return fmt.Sprintf("%.1f -> %.1f", r.IdleBefore, r.ProxyRSS)
	}
	if r.ProxyRSS == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", r.ProxyRSS)
}

// WriteCostMarkdown writes cost rows as a Markdown table.
func WriteCostMarkdown(w io.Writer, rows []CostRow) error {
	return writeMarkdown(w, "| group | target | load | rps | rps ratio | p50 ms | p99 ms | added p50 ms | added p99 ms | proxy RSS MiB | RSS ratio | turnout RSS MiB | proxy CPU µs/req | turnout CPU µs/req | errors |\n"+
		"|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", len(rows), func(b *strings.Builder, i int) {
		r := &rows[i]
		if r.Note != "" {
			fmt.Fprintf(b, "| %s | %s | %s ||||||||||||\n", r.Group, r.Target, r.Note)
			return
		}
		rps, ratio := fmt.Sprintf("%.0f", r.RPS), fmt.Sprintf("%.3f", r.Ratio)
		lat := fmt.Sprintf("%.3f | %.3f | %+.3f | %+.3f", r.P50, r.P99, r.AddedP50, r.AddedP99)
		if r.Probe || r.Idle {
			rps, ratio = "-", "-"
		}
		if r.Idle {
			lat = "- | - | - | -"
		}
		rssRatio, trss := "-", "-"
		if r.ProxyRSS > 0 {
			rssRatio = fmt.Sprintf("%.2f", r.RSSRatio)
		}
		if r.TurnoutRSS > 0 {
			trss = fmt.Sprintf("%.1f", r.TurnoutRSS)
		}
		pcpu, tcpu := "-", "-"
		if r.ProxyCPU > 0 {
			pcpu = fmt.Sprintf("%.1f", r.ProxyCPU)
		}
		if r.TurnoutCPU > 0 {
			tcpu = fmt.Sprintf("%.1f", r.TurnoutCPU)
		}
		fmt.Fprintf(b, "| %s | %s | %s c%d | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", r.Group, r.Target, r.LoadGen, r.Conns,
			rps, ratio, lat, r.rssText(), rssRatio, trss, pcpu, tcpu, r.Errors)
	})
}
