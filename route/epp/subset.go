package epp

import (
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/turnout/turnout/route/contract"
)

// What the gateway sends in metadata_context (filter_metadata): the
// subset hint of the request phase and the served endpoint of the
// response phase.

// subsetHint reads the subset hint into sub: false when the gateway sent
// none (every endpoint may be picked). A hint that is present but empty,
// or lists nothing turnout routes to, is a hint all the same: the
// decision refuses it with 503, as the protocol requires.
func subsetHint(md *corev3.Metadata, sub *contract.Subset) bool {
	ns := md.GetFilterMetadata()[NSSubset]
	if ns == nil {
		return false
	}
	v, ok := ns.GetFields()[MetaSubset]
	if !ok {
		return false
	}
	sub.Addrs = sub.Addrs[:0]
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			addAddr(sub, e.GetStringValue())
		}
	case *structpb.Value_StringValue:
		// Not the protocol's list, but unambiguous: ip:port,ip:port.
		for a := range strings.SplitSeq(k.StringValue, ",") {
			addAddr(sub, a)
		}
	}
	return true
}

// servedAddr is the endpoint the gateway reports as having served ("" when
// not reported). After retries the gateway may list several; the last one
// answered.
func servedAddr(md *corev3.Metadata) string {
	s := md.GetFilterMetadata()[NSDestination].GetFields()[MetaServed].GetStringValue()
	if i := strings.LastIndexByte(s, ','); i >= 0 {
		s = s[i+1:]
	}
	return strings.TrimSpace(s)
}

func addAddr(sub *contract.Subset, a string) {
	if a = strings.TrimSpace(a); a != "" {
		sub.Addrs = append(sub.Addrs, viewOf(a))
	}
}
