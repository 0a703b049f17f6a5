package bench

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTransportTable writes the rows as an aligned table.
func WriteTransportTable(w io.Writer, rows []TransportRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "transport\tconns\tdecisions\terrors\tdecisions/s\tp50 ms\tp99 ms\tCPU µs/decision\tCPU vs SPOE\trounds' range")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.3f\t%.3f\t%.1f\t%.2fx\t%.2f-%.2fx\n", r.Target, r.Conns, r.Requests, r.Errors, r.RPS, r.P50, r.P99, r.CPUPerDecision, r.CPURatio, r.CPURatioMin, r.CPURatioMax)
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
