package bench

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"
)

// WriteTransportTable writes the rows as an aligned table.
func WriteTransportTable(w io.Writer, rows []TransportRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	paced := slices.ContainsFunc(rows, func(r TransportRow) bool { return r.PacedRPS > 0 })
	head := "transport\tconns\tdecisions\terrors\tdecisions/s\tp50 ms\tp99 ms\tCPU µs/decision\tdecisions/s/core\tCPU vs SPOE\trounds' range\tCPU vs trivial"
	if paced {
		head += "\tpaced decisions/s\tpaced p50 ms\tpaced p99 ms\tpaced p99.9 ms\tclient late p99 ms\tsends queued\tpaced CPU µs/decision\tserver p50 µs\tserver p99 µs\tserver >100 µs\tserver timed"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.1f\t%.0f\t%.2fx\t%.2f-%.2fx\t%.2fx", r.Target, r.Conns, r.Requests, r.Errors, r.RPS, r.P50, r.P99, r.CPUPerDecision, r.PerCore, r.CPURatio, r.CPURatioMin, r.CPURatioMax, r.TrivialRatio)
		if paced {
			fmt.Fprintf(tw, "\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.1f%%\t%.1f", r.PacedRPS, r.PacedP50, r.PacedP99, r.PacedP999, r.PacedLateP99, 100*r.PacedQueued, r.PacedCPU)
			if r.ServerTimed > 0 {
				fmt.Fprintf(tw, "\t%.1f\t%.1f\t%.2f%%\t%d", r.ServerP50, r.ServerP99, 100*r.ServerOver100, r.ServerTimed)
			} else {
				fmt.Fprint(tw, "\t-\t-\t-\t-")
			}
		}
		fmt.Fprintln(tw)
	}
	for _, r := range rows {
		if r.FirstErr != "" {
			fmt.Fprintf(tw, "first error, %s: %s\n", r.Target, r.FirstErr)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeStallTable(w, rows)
}

// writeStallTable writes the stall probes taken before the paced rows,
// one line per row and CPU (nothing without them).
func writeStallTable(w io.Writer, rows []TransportRow) error {
	if !slices.ContainsFunc(rows, func(r TransportRow) bool { return len(r.Stalls) > 0 }) {
		return nil
	}
	fmt.Fprintln(w, "\nVM stall probe: a thread spinning on each turnout and bench CPU for the paced run's length, just before it; time it did not run, in stretches over 50 and 100 µs")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "before paced row\tCPU (of)\ts\tlost >50 µs\t>50 µs /s\tlost >100 µs\t>100 µs /s\tlongest ms\tto other tasks\tno switch (irq, VM) >50 / >100 µs\tprobe's runtime\tkernel: run-queue wait\tsteal\tirq+softirq\tLOC /s\tIPI /s")
	for _, r := range rows {
		for _, p := range r.Stalls {
			sec := p.Duration.Seconds()
			fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.2f%%\t%.0f\t%.2f%%\t%.0f\t%.3f\t%.2f%%\t%.2f%% / %.2f%%\t%.2f%%\t%.2f%%\t%.2f%%\t%.2f%%\t%.0f\t%.0f\n",
				r.Target, probedCPU(p), sec, 100*p.Lost50, float64(p.N50)/sec, 100*p.Lost100, float64(p.N100)/sec, float64(p.Max)/1e6,
				100*p.Tasks, 100*p.NoSwitch, 100*p.NoSwitch100, 100*p.Own, 100*p.RunDelay, 100*p.Steal, 100*p.IRQ, p.LOCPerSec, p.IPIPerSec)
		}
	}
	return tw.Flush()
}

// probedCPU names a probed CPU and whose it is.
func probedCPU(p StallProbe) string {
	if p.Bench {
		return strconv.Itoa(p.CPU) + " (bench)"
	}
	return strconv.Itoa(p.CPU) + " (turnout)"
}

// CheckTransports fails unless every transport answered decisions with
// few errors (the smoke check).
func CheckTransports(rows []TransportRow) error {
	var errs []error
	for _, r := range rows {
		if r.Requests == 0 || r.Errors*100 > r.Requests {
			errs = append(errs, fmt.Errorf("%s: %d decisions, %d errors (%s)", r.Target, r.Requests, r.Errors, r.FirstErr))
		}
	}
	return errors.Join(errs...)
}
