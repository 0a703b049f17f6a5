package epp

import (
	"bytes"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// decodeWire is what the gateway reads of an answer, through grpc-go
// (the codec) and through the inline server (appendTo, after a prefix
// already in the buffer): both must be the same message.
func decodeWire(t *testing.T, a *answer) *extprocv3.ProcessingResponse {
	t.Helper()
	bufs, err := codec{}.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	r := &extprocv3.ProcessingResponse{}
	if err := proto.Unmarshal(bufs.Materialize(), r); err != nil {
		t.Fatalf("not a ProcessingResponse: %v", err)
	}
	prefix := []byte("prefix")
	b := a.appendTo(prefix)
	if !bytes.Equal(b[len(prefix):], bufs.Materialize()) || string(b[:len(prefix)]) != "prefix" {
		t.Fatalf("appendTo and the codec disagree:\n%x\n%x", b, bufs.Materialize())
	}
	return r
}

func wantHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
}

// The pick's answer, as the go-control-plane types build it: the header,
// the content-length when known, clear_route_cache, envoy.lb metadata.
func wantRouted(phase protowire.Number, dest, cl string) *extprocv3.ProcessingResponse {
	set := []*corev3.HeaderValueOption{wantHeader(HdrDestination, dest)}
	if cl != "" {
		set = append(set, wantHeader("content-length", cl))
	}
	common := &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: set}}
	r := &extprocv3.ProcessingResponse{DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		NSDestination: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			MetaDestination: structpb.NewStringValue(dest),
		}}),
	}}}
	if phase == fRespRequestHeaders {
		r.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	} else {
		r.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	}
	return r
}

// A routed answer decodes to the same message the go-control-plane types
// make, lengths past one varint byte included.
func TestWire_RoutedAnswerIsTheProtoMessage(t *testing.T) {
	long := strings.TrimSuffix(strings.Repeat("10.200.300.400:65535,", 12), ",")
	for _, phase := range []protowire.Number{fRespRequestHeaders, fRespRequestBody} {
		for _, dest := range []string{"10.0.0.1:8000", "10.0.0.1:8000,10.0.0.2:8000", long} {
			for _, cl := range []string{"", "1234"} {
				got := decodeWire(t, &answer{kind: answerRouted, phase: phase, dest: []byte(dest), cl: []byte(cl)})
				if want := wantRouted(phase, dest, cl); !proto.Equal(got, want) {
					t.Errorf("phase %d dest %q cl %q:\n got %v\nwant %v", phase, dest, cl, got, want)
				}
			}
		}
	}
}

// A chunk passed on decodes to the streamed_response the go-control-plane
// types make, and its bytes are sent from the chunk itself.
func TestWire_StreamedAnswerIsTheProtoMessage(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 4096, 70000} {
		for _, eos := range []bool{false, true} {
			for _, phase := range []protowire.Number{fRespRequestBody, fRespResponseBody} {
				chunk := bytes.Repeat([]byte{'x'}, n)
				w := &answer{kind: answerStreamed, phase: phase, chunk: chunk, eos: eos}
				br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
					Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos}},
				}}}
				want := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
				if phase == fRespResponseBody {
					want.Response = &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}
				}
				if got := decodeWire(t, w); !proto.Equal(got, want) {
					t.Errorf("%d bytes eos %v phase %d: got %v", n, eos, phase, got)
				}
				if n > 0 && !sharesChunk(w.buffers(), chunk) {
					t.Errorf("%d bytes: the chunk was copied", n)
				}
			}
		}
	}
}

func sharesChunk(bufs mem.BufferSlice, chunk []byte) bool {
	for _, b := range bufs {
		if d := b.ReadOnlyData(); len(d) == len(chunk) && &d[0] == &chunk[0] {
			return true
		}
	}
	return false
}

// An empty answer lets its phase go on: the go-control-plane types' empty
// phase message.
func TestWire_ContinueAnswerIsTheProtoMessage(t *testing.T) {
	for phase, want := range map[protowire.Number]*extprocv3.ProcessingResponse{
		fRespRequestHeaders:   {Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
		fRespResponseHeaders:  {Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{}}},
		fRespResponseBody:     {Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}},
		fRespRequestTrailers:  {Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}},
		fRespResponseTrailers: {Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}},
	} {
		if got := decodeWire(t, &answer{kind: answerContinue, phase: phase}); !proto.Equal(got, want) {
			t.Errorf("phase %d: got %v, want %v", phase, got, want)
		}
	}
}

// Other messages go through as grpc-go's proto codec sends them.
func TestWire_CodecMarshalsOtherMessages(t *testing.T) {
	for _, m := range []*extprocv3.ProcessingResponse{
		{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}},
		{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{Body: bytes.Repeat([]byte("e"), 5000)}}},
	} {
		bufs, err := codec{}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		got := &extprocv3.ProcessingResponse{}
		if err := (codec{}).Unmarshal(bufs, got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, m) {
			t.Errorf("got %v, want %v", got, m)
		}
	}
	if _, err := (codec{}).Marshal("not a message"); err == nil {
		t.Error("a non-message was marshalled")
	}
}
