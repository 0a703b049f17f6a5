package epp

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/turnout/turnout/route/contract"
)

// The hand decoder against the go-control-plane types: the same bytes
// decoded both ways must give the picker the same request.

// seen is what the picker reads of a request, comparable.
type seen struct {
	Phase             protowire.Number
	Headers           []string // name=value
	Body              string
	EOS               bool
	HasConfig         bool
	ReqMode, RespMode filterv3.ProcessingMode_BodySendMode
	HasSubset         bool
	Subset            []string
	Served            string
}

// seenByHand is what decodeRequest gives the picker.
func seenByHand(r *procReq) seen {
	s := seen{Phase: r.phase, Body: string(r.body), EOS: r.eos, HasConfig: r.hasConfig, ReqMode: r.reqMode, RespMode: r.respMode}
	for _, h := range r.headers {
		s.Headers = append(s.Headers, string(h.name)+"="+string(h.value))
	}
	var sub contract.Subset
	s.HasSubset = subsetHint(r, &sub)
	for _, a := range sub.Addrs {
		s.Subset = append(s.Subset, string(a))
	}
	s.Served = string(servedAddr(r))
	return s
}

// seenByProto is the same read off the generated types, with the getters.
func seenByProto(m *extprocv3.ProcessingRequest) seen {
	var s seen
	var h *extprocv3.HttpHeaders
	var b *extprocv3.HttpBody
	switch r := m.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		s.Phase, h = fReqRequestHeaders, r.RequestHeaders
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		s.Phase, h = fReqResponseHeaders, r.ResponseHeaders
	case *extprocv3.ProcessingRequest_RequestBody:
		s.Phase, b = fReqRequestBody, r.RequestBody
	case *extprocv3.ProcessingRequest_ResponseBody:
		s.Phase, b = fReqResponseBody, r.ResponseBody
	case *extprocv3.ProcessingRequest_RequestTrailers:
		s.Phase = fReqRequestTrailers
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		s.Phase = fReqResponseTrailers
	}
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := string(hv.GetRawValue())
		if v == "" {
			v = hv.GetValue()
		}
		s.Headers = append(s.Headers, hv.GetKey()+"="+v)
	}
	s.EOS = h.GetEndOfStream() || b.GetEndOfStream()
	s.Body = string(b.GetBody())
	if pc := m.GetProtocolConfig(); pc != nil {
		s.HasConfig, s.ReqMode, s.RespMode = true, pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	md := m.GetMetadataContext()
	if ns := md.GetFilterMetadata()[NSSubset]; ns != nil {
		if v, ok := ns.GetFields()[MetaSubset]; ok {
			s.HasSubset = true
			add := func(a string) {
				if a = strings.TrimSpace(a); a != "" {
					s.Subset = append(s.Subset, a)
				}
			}
			switch k := v.GetKind().(type) {
			case *structpb.Value_ListValue:
				for _, e := range k.ListValue.GetValues() {
					add(e.GetStringValue())
				}
			case *structpb.Value_StringValue:
				for _, a := range strings.Split(k.StringValue, ",") {
					add(a)
				}
			}
		}
	}
	served := md.GetFilterMetadata()[NSDestination].GetFields()[MetaServed].GetStringValue()
	if i := strings.LastIndexByte(served, ','); i >= 0 {
		served = served[i+1:]
	}
	s.Served = strings.TrimSpace(served)
	return s
}

// sameBothWays decodes b both ways and fails the test when they differ;
// false when protobuf itself refuses b.
func sameBothWays(t *testing.T, b []byte) bool {
	t.Helper()
	m := &extprocv3.ProcessingRequest{}
	if err := proto.Unmarshal(b, m); err != nil {
		return false
	}
	var r procReq
	if err := decodeRequest(b, &r); err != nil {
		t.Fatalf("protobuf reads %x, the hand decoder fails: %v", b, err)
	}
	if got, want := seenByHand(&r), seenByProto(m); !reflect.DeepEqual(got, want) {
		t.Fatalf("%x (%v):\n by hand %+v\nby proto %+v", b, m, got, want)
	}
	return true
}

// words are the strings random messages are made of: the names the picker
// looks for, among others.
var words = []string{"", ":status", ":path", "content-length", "200", " 10.0.0.1:8000 ", "10.0.0.2:8000, 10.0.0.3:8000,",
	NSSubset, MetaSubset, NSDestination, MetaServed, "x-session-id", "héllo"}

// fill sets random fields of m, to depth levels of messages; one member
// of each oneof, or none.
func fill(rng *rand.Rand, m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	members := map[protoreflect.FullName]protoreflect.FieldDescriptor{}
	oneofs := m.Descriptor().Oneofs()
	for i := range oneofs.Len() {
		o := oneofs.Get(i)
		if n := rng.IntN(o.Fields().Len() + 1); n < o.Fields().Len() {
			members[o.FullName()] = o.Fields().Get(n)
		}
	}
	for i := range fields.Len() {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil {
			if members[o.FullName()] != fd {
				continue
			}
		} else if rng.IntN(3) == 0 {
			continue
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for range rng.IntN(3) {
				k := protoreflect.ValueOfString(words[rng.IntN(len(words))]).MapKey()
				if fd.MapValue().Kind() == protoreflect.MessageKind {
					if depth <= 0 {
						continue
					}
					v := mp.NewValue()
					fill(rng, v.Message(), depth-1)
					mp.Set(k, v)
				} else {
					mp.Set(k, scalar(rng, fd.MapValue()))
				}
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range rng.IntN(4) {
				if fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind {
					if depth <= 0 {
						continue
					}
					v := l.NewElement()
					fill(rng, v.Message(), depth-1)
					l.Append(v)
				} else {
					l.Append(scalar(rng, fd))
				}
			}
		case fd.Kind() == protoreflect.MessageKind || fd.Kind() == protoreflect.GroupKind:
			if depth > 0 {
				fill(rng, m.Mutable(fd).Message(), depth-1)
			}
		default:
			m.Set(fd, scalar(rng, fd))
		}
	}
}

func scalar(rng *rand.Rand, fd protoreflect.FieldDescriptor) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(rng.IntN(2) == 0)
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(rng.IntN(5) - 1))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(rng.Int32N(1000) - 500)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(rng.Int64() - rng.Int64())
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(rng.Uint32())
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(rng.Uint64())
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(rng.Float32())
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(rng.Float64())
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(words[rng.IntN(len(words))])
	case protoreflect.BytesKind:
		if rng.IntN(4) == 0 {
			return protoreflect.ValueOfBytes(bytes.Repeat([]byte{'b'}, rng.IntN(300)))
		}
		return protoreflect.ValueOfBytes([]byte(words[rng.IntN(len(words))]))
	}
	panic(fmt.Sprintf("no random %v", fd.Kind()))
}

// randomRequest is a random ProcessingRequest, usually with metadata the
// picker reads (a subset hint, a served endpoint) among random namespaces.
func randomRequest(rng *rand.Rand) *extprocv3.ProcessingRequest {
	m := &extprocv3.ProcessingRequest{}
	fill(rng, m.ProtoReflect(), 7)
	if rng.IntN(2) == 0 {
		if m.MetadataContext == nil {
			m.MetadataContext = &corev3.Metadata{}
		}
		if m.MetadataContext.FilterMetadata == nil {
			m.MetadataContext.FilterMetadata = map[string]*structpb.Struct{}
		}
		for _, ns := range []string{NSSubset, NSDestination} {
			if rng.IntN(3) == 0 {
				continue
			}
			st := &structpb.Struct{}
			fill(rng, st.ProtoReflect(), 3)
			if st.Fields == nil {
				st.Fields = map[string]*structpb.Value{}
			}
			v := &structpb.Value{}
			fill(rng, v.ProtoReflect(), 3)
			st.Fields[[]string{MetaSubset, MetaServed}[rng.IntN(2)]] = v
			m.MetadataContext.FilterMetadata[ns] = st
		}
	}
	return m
}

// Random messages, alone and merged two by two (protobuf reads the
// concatenation of two messages as their merge), read the same both ways.
func TestDecode_SameAsProtoOnRandomMessages(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 37))
	var prev []byte
	hits := map[string]int{}
	for range 4000 {
		b, err := proto.Marshal(randomRequest(rng))
		if err != nil {
			t.Fatal(err)
		}
		if !sameBothWays(t, b) {
			t.Fatalf("protobuf refuses its own message %x", b)
		}
		sameBothWays(t, append(append([]byte{}, prev...), b...))
		prev = b
		var r procReq
		_ = decodeRequest(b, &r)
		s := seenByHand(&r)
		hits[fmt.Sprint("phase ", s.Phase)]++
		if len(s.Subset) > 0 {
			hits["subset"]++
		}
		if s.Served != "" {
			hits["served"]++
		}
		if s.HasConfig {
			hits["config"]++
		}
		if len(s.Headers) > 0 {
			hits["headers"]++
		}
	}
	// The random messages reach what the picker reads.
	for _, k := range []string{"subset", "served", "config", "headers", "phase 2", "phase 3", "phase 4", "phase 5", "phase 6", "phase 7"} {
		if hits[k] < 20 {
			t.Errorf("only %d random messages with %s: %v", hits[k], k, hits)
		}
	}
}

// The hand-made cases random messages rarely make: oneof members and
// kinds switched, values sent in parts, fields with another wire type.
func TestDecode_MergesAsProto(t *testing.T) {
	tag := func(b []byte, n protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(b, n, typ) }
	msg := func(n protowire.Number, parts ...[]byte) []byte {
		var c []byte
		for _, p := range parts {
			c = append(c, p...)
		}
		return protowire.AppendBytes(tag(nil, n, protowire.BytesType), c)
	}
	str := func(n protowire.Number, s string) []byte { return msg(n, []byte(s)) }
	varint := func(n protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(tag(nil, n, protowire.VarintType), v)
	}
	hint := func(value ...[]byte) []byte {
		return msg(fReqMetadata, msg(fMetadataFilter, str(fEntryKey, NSSubset),
			msg(fEntryValue, msg(fStructFields, str(fEntryKey, MetaSubset), msg(fEntryValue, value...)))))
	}
	list := func(addrs ...string) []byte {
		var l [][]byte
		for _, a := range addrs {
			l = append(l, msg(fListValues, str(fValueString, a)))
		}
		return msg(fValueList, l...)
	}
	hdr := func(k, v string) []byte { return msg(fMapHeaders, str(fHeaderKey, k), str(fHeaderRawValue, v)) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	for name, b := range map[string][]byte{
		"headers in two parts":       cat(msg(fReqRequestHeaders, msg(fHeadersMap, hdr(":path", "/a"))), msg(fReqRequestHeaders, msg(fHeadersMap, hdr("x", "1")), varint(fHeadersEOS, 1))),
		"oneof switched":             cat(msg(fReqRequestHeaders, msg(fHeadersMap, hdr(":path", "/a"))), msg(fReqRequestBody, str(fBodyBytes, "b"))),
		"oneof switched back":        cat(msg(fReqRequestBody, str(fBodyBytes, "b"), varint(fBodyEOS, 1)), msg(fReqRequestHeaders), msg(fReqRequestBody, str(fBodyBytes, "c"))),
		"eos with another wire type": msg(fReqRequestBody, protowire.AppendBytes(tag(nil, fBodyEOS, protowire.BytesType), []byte{1})),
		"value and raw_value":        msg(fReqRequestHeaders, msg(fHeadersMap, msg(fMapHeaders, str(fHeaderKey, "k"), str(fHeaderValue, "v"), str(fHeaderRawValue, "")))),
		"list in two parts":          hint(list("10.0.0.1:8000"), list("10.0.0.2:8000")),
		"list in two entry parts":    hint(list("10.0.0.1:8000")),
		"list then string":           hint(list("10.0.0.1:8000"), str(fValueString, "10.0.0.3:8000")),
		"string then list":           hint(str(fValueString, "10.0.0.3:8000"), list("10.0.0.1:8000")),
		"list, bool, list":           hint(list("10.0.0.1:8000"), varint(fValueBool, 1), list("10.0.0.2:8000")),
		"kind with wrong wire type":  hint(list("10.0.0.1:8000"), varint(fValueString, 1), varint(fValueList, 3)),
		"empty hint":                 hint(),
		"hint replaced by its ns":    cat(hint(list("10.0.0.1:8000")), msg(fReqMetadata, msg(fMetadataFilter, str(fEntryKey, NSSubset)))),
		"config in two parts":        cat(msg(fReqProtocolConfig, varint(fConfigRequestMode, 2)), msg(fReqProtocolConfig, varint(fConfigResponseMode, 6))),
		"unknown fields and a group": cat(varint(99, 5), tag(nil, 98, protowire.StartGroupType), varint(1, 1), tag(nil, 98, protowire.EndGroupType), msg(fReqRequestTrailers, msg(fHeadersMap, hdr("a", "b")))),
	} {
		t.Run(name, func(t *testing.T) {
			if !sameBothWays(t, b) {
				t.Fatalf("protobuf refuses %x", b)
			}
		})
	}
	// Malformed input is an error, not a partial request.
	var r procReq
	for _, b := range [][]byte{{0x12}, {0x12, 0x05, 0x0a}, {0x00}, {0x22, 0x02, 0x0a, 0x05}, tag(nil, 5, protowire.EndGroupType)} {
		if err := decodeRequest(b, &r); err == nil {
			t.Errorf("%x decoded", b)
		}
	}
}

// Arbitrary bytes protobuf reads are read the same by hand.
func FuzzDecodeRequest(f *testing.F) {
	rng := rand.New(rand.NewPCG(2, 37))
	for range 32 {
		b, err := proto.Marshal(randomRequest(rng))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { sameBothWays(t, b) })
}

// BenchmarkDecodeRequest decodes what a gateway sends for one request:
// the headers message (with the subset hint and protocol_config), then
// the ~4 KiB body; allocs/op must stay 0 (r keeps its room across calls).
func BenchmarkDecodeRequest(b *testing.B) {
	hdrs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}
	for i := range 16 {
		hdrs = append(hdrs, &corev3.HeaderValue{Key: fmt.Sprintf("x-header-%d", i), RawValue: []byte(strings.Repeat("v", 24))})
	}
	list := structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("10.0.0.1:8000"), structpb.NewStringValue("10.0.0.2:8000")}})
	headers, err := proto.Marshal(&extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: hdrs},
		}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			NSSubset: {Fields: map[string]*structpb.Value{MetaSubset: list}},
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
	})
	if err != nil {
		b.Fatal(err)
	}
	body, err := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: bytes.Repeat([]byte("x"), 4<<10), EndOfStream: true},
	}})
	if err != nil {
		b.Fatal(err)
	}
	var r procReq
	b.ReportAllocs()
	for b.Loop() {
		if err := decodeRequest(headers, &r); err != nil || len(r.headers) != len(hdrs) || len(r.subset) != 2 {
			b.Fatalf("headers: %v, %d headers, subset %q", err, len(r.headers), r.subset)
		}
		if err := decodeRequest(body, &r); err != nil || len(r.body) != 4<<10 || !r.eos {
			b.Fatalf("body: %v", err)
		}
	}
}
