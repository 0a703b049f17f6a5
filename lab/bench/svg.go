package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// ChartOptions label the hit-ratio-vs-imbalance chart.
type ChartOptions struct {
	Title string
	// GoalImbalance draws the load goal (max/mean) as a vertical line.
	GoalImbalance float64
	// GoalHitFraction draws fraction x infinite bound as a horizontal line.
	GoalHitFraction float64
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 760, 460
	padL, padR     = 70, 230
	padT, padB     = 50, 60
)

// palette gives each named row a distinct colour; sweep rows are grey.
var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"}

// WriteSVG draws hit ratio (y) against per-replica load max/mean (x): one
// labelled dot per row in rows and a small grey dot per row in sweep, with
// the infinite-cache and pooled bounds and the goals as lines. Up and left
// is better.
func WriteSVG(w io.Writer, rows, sweep []Row, o ChartOptions) error {
	all := append(append([]Row(nil), rows...), sweep...)
	xmax, inf, pooled := 1.2, 0.0, 0.0
	for i := range all {
		if all[i].Note != "" {
			continue
		}
		xmax = max(xmax, all[i].LoadReq)
		inf = max(inf, all[i].InfBound)
		pooled = max(pooled, all[i].Pooled)
	}
	const xmin = 1.0
	// Ticks fine enough that 1.05 and 1.10 are told apart near the goal.
	step := 0.25
	switch {
	case xmax-xmin <= 0.35:
		step = 0.05
	case xmax-xmin <= 0.8:
		step = 0.1
	}
	xmax = math.Ceil((xmax+step/2)/step) * step
	plotW := float64(chartW - padL - padR)
	plotH := float64(chartH - padT - padB)
	x := func(v float64) float64 { return padL + (v-xmin)/(xmax-xmin)*plotW }
	y := func(v float64) float64 { return padT + (1-v)*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(o.Title))
	// Grid and axes.
	for i := 0; i <= 10; i++ {
		v := float64(i) / 10
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x(xmin), y(v), x(xmax), y(v))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%.1f</text>`+"\n", x(xmin)-6, y(v)+4, v)
	}
	for v := xmin; v <= xmax+1e-9; v += step {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", x(v), y(0), x(v), y(1))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.2f</text>`+"\n", x(v), y(0)+18, v)
	}
	fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#333"/>`+"\n", x(xmin), y(1), plotW, plotH)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">per-replica load max/mean (requests) — lower is better</text>`+"\n", x(xmin)+plotW/2, chartH-15)
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">prefix-cache hit ratio — higher is better</text>`+"\n", padT+plotH/2)

	hline := func(v float64, colour, label string) {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="6 4"/>`+"\n", x(xmin), y(v), x(xmax), y(v), colour)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="%s" font-size="11">%s</text>`+"\n", x(xmin)+4, y(v)-4, colour, html.EscapeString(label))
	}
	if inf > 0 {
		hline(inf, "#444", fmt.Sprintf("infinite cache %.3f", inf))
		if o.GoalHitFraction > 0 {
			hline(inf*o.GoalHitFraction, "#2ca02c", fmt.Sprintf("goal %.0f%% of infinite", o.GoalHitFraction*100))
		}
	}
	// The pooled-capacity line only says something when capacity binds.
	if pooled > 0 && inf-pooled > 0.005 {
		hline(pooled, "#999", fmt.Sprintf("pooled LRU (all replicas' capacity) %.3f", pooled))
	}
	if g := o.GoalImbalance; g > xmin && g < xmax {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#2ca02c" stroke-dasharray="6 4"/>`+"\n", x(g), y(0), x(g), y(1))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#2ca02c" font-size="11">goal ≤ %.2f</text>`+"\n", x(g)+4, y(1)+14, g)
	}
	for i := range sweep {
		r := &sweep[i]
		if r.Note != "" {
			continue
		}
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="#bbb"><title>%s</title></circle>`+"\n",
			x(r.LoadReq), y(r.HitRatio), html.EscapeString(fmt.Sprintf("%s hit %.3f load %.3f", r.Label(), r.HitRatio, r.LoadReq)))
	}
	legendY := padT + 10
	for i := range rows {
		r := &rows[i]
		if r.Note != "" {
			continue
		}
		c := palette[i%len(palette)]
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="6" fill="%s" stroke="black" stroke-width="0.5"><title>%s</title></circle>`+"\n",
			x(r.LoadReq), y(r.HitRatio), c, html.EscapeString(fmt.Sprintf("%s hit %.3f load %.3f", r.Label(), r.HitRatio, r.LoadReq)))
		legendY += 18
		fmt.Fprintf(&b, `<circle cx="%d" cy="%d" r="6" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			chartW-padR+20, legendY, c, chartW-padR+32, legendY+4, html.EscapeString(shorten(r.Label(), 30)))
	}
	if len(sweep) > 0 {
		legendY += 18
		fmt.Fprintf(&b, `<circle cx="%d" cy="%d" r="3" fill="#bbb"/><text x="%d" y="%d">sweep (%d)</text>`+"\n",
			chartW-padR+20, legendY, chartW-padR+32, legendY+4, len(sweep))
	}
	b.WriteString("</svg>\n")
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("svg: %w", err)
	}
	return nil
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
