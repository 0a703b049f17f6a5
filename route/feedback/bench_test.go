package feedback

import (
	"fmt"
	"net/netip"
	"testing"
)

// BenchmarkFeedbackDatagram: one HAProxy feedback datagram (source check,
// token, parse, per-endpoint metrics), without a live decision to close.
func BenchmarkFeedbackDatagram(b *testing.B) {
	s := mustServer(b, fmt.Sprintf(feedbackCfg, "127.0.0.1:5140", "", "s3cret-token-0123456789"))
	dgram := []byte("<134>Nov 21 10:00:00 haproxy[1]: turnout-done id=0123456789abcdef srv=b status=200 ms=1234 ttfb=12 tok=s3cret-token-0123456789 be=llama_mixed tw=0 tc=0 retries=0\n")
	src := netip.MustParseAddr("127.0.0.1")
	b.ReportAllocs()
	for b.Loop() {
		s.Datagram(src, dgram)
	}
}
