package procmetrics

import (
	"regexp"
	"runtime"
	"strings"
	"testing"
)

func TestWriteMetrics(t *testing.T) {
	w, err := New("v1.2.3-test")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	w.WriteMetrics(&b)
	out := b.String()
	for _, re := range []string{
		`(?m)^turnout_build_info\{goversion="` + regexp.QuoteMeta(runtime.Version()) + `",version="v1\.2\.3-test"\} 1$`,
		`(?m)^go_goroutines [1-9][0-9]*$`,
		`(?m)^go_memstats_alloc_bytes [1-9]`,
		`(?m)^process_resident_memory_bytes [1-9]`,
		`(?m)^process_open_fds [1-9]`,
		`(?m)^process_start_time_seconds [1-9]`,
		`(?m)^# TYPE process_cpu_seconds_total counter$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("no match for %s in:\n%s", re, out)
		}
	}
	if strings.Contains(out, "# procmetrics:") {
		t.Errorf("gather error: %s", out)
	}
}

// BenchmarkWriteMetrics is the cost of one scrape's share (not on the decision path).
func BenchmarkWriteMetrics(b *testing.B) {
	w, err := New("bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		var sb strings.Builder
		w.WriteMetrics(&sb)
	}
}
