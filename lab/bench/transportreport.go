package bench

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
)

// WriteTransportTable writes the rows as an aligned table.
func WriteTransportTable(w io.Writer, rows []TransportRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	paced := slices.ContainsFunc(rows, func(r TransportRow) bool { return r.PacedRPS > 0 })
	head := "transport\tconns\tdecisions\terrors\tdecisions/s\tp50 ms\tp99 ms\tCPU µs/decision\tdecisions/s/core\tCPU vs SPOE\trounds' range\tCPU vs trivial"
	if paced {
		head += "\tpaced decisions/s\tpaced p50 ms\tpaced p99 ms\tpaced p99.9 ms\tclient late p99 ms\tsends queued\tpaced CPU µs/decision"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.1f\t%.0f\t%.2fx\t%.2f-%.2fx\t%.2fx", r.Target, r.Conns, r.Requests, r.Errors, r.RPS, r.P50, r.P99, r.CPUPerDecision, r.PerCore, r.CPURatio, r.CPURatioMin, r.CPURatioMax, r.TrivialRatio)
		if paced {
			fmt.Fprintf(tw, "\t%.0f\t%.3f\t%.3f\t%.3f\t%.3f\t%.1f%%\t%.1f", r.PacedRPS, r.PacedP50, r.PacedP99, r.PacedP999, r.PacedLateP99, 100*r.PacedQueued, r.PacedCPU)
		}
		fmt.Fprintln(tw)
	}
	for _, r := range rows {
		if r.FirstErr != "" {
			fmt.Fprintf(tw, "first error, %s: %s\n", r.Target, r.FirstErr)
		}
	}
	return tw.Flush()
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
