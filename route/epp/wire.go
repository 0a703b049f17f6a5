package epp

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The answers every routed request gets (the pick, each body chunk passed
// on) are encoded here, straight to the wire format, instead of as a
// ProcessingResponse tree that protobuf sizes and marshals by reflection:
// no structpb map for the metadata, and a chunk's bytes are sent from
// where they came in, not copied. The codec sends these as they are and
// every other message as grpc-go's own proto codec does.

// wireAnswer is a ProcessingResponse already encoded: its buffers in order.
type wireAnswer struct{ bufs mem.BufferSlice }

// codec is the Endpoint Picker server's gRPC codec.
type codec struct{}

var _ encoding.CodecV2 = codec{}

// Name is grpc-go's proto codec's: the content-subtype does not change.
func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(*wireAnswer); ok {
		return w.bufs, nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("epp codec: cannot marshal %T", v)
	}
	size := proto.Size(m)
	opts := proto.MarshalOptions{UseCachedSize: true} // sized just above
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("epp codec: %w", err)
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	b, err := opts.MarshalAppend((*buf)[:0], m)
	if err != nil {
		pool.Put(buf)
		return nil, fmt.Errorf("epp codec: %w", err)
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("epp codec: cannot unmarshal into %T", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// Field numbers (envoy/service/ext_proc/v3, envoy/config/core/v3,
// google/protobuf/struct.proto).
const (
	fRespRequestHeaders  protowire.Number = 1 // ProcessingResponse
	fRespRequestBody     protowire.Number = 3
	fRespResponseBody    protowire.Number = 4
	fRespDynamicMetadata protowire.Number = 8
	fPhaseResponse       protowire.Number = 1 // HeadersResponse, BodyResponse
	fCommonHeaders       protowire.Number = 2 // CommonResponse
	fCommonBody          protowire.Number = 3
	fCommonClearCache    protowire.Number = 5
	fMutationSet         protowire.Number = 1 // HeaderMutation.set_headers
	fOptionHeader        protowire.Number = 1 // HeaderValueOption
	fOptionAppendAction  protowire.Number = 3
	fHeaderKey           protowire.Number = 1 // HeaderValue
	fHeaderRawValue      protowire.Number = 3
	fBodyStreamed        protowire.Number = 3 // BodyMutation.streamed_response
	fStreamedBody        protowire.Number = 1 // StreamedBodyResponse
	fStreamedEOS         protowire.Number = 2
	fStructFields        protowire.Number = 1 // Struct.fields (map entries)
	fEntryKey            protowire.Number = 1
	fEntryValue          protowire.Number = 2
	fValueString         protowire.Number = 3 // Value
	fValueStruct         protowire.Number = 5

	// HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
	overwriteOrAdd = 2
)

// sizeField is a length-delimited field's size: tag, length, content.
func sizeField(n protowire.Number, content int) int {
	return protowire.SizeTag(n) + protowire.SizeBytes(content)
}

func appendField(b []byte, n protowire.Number, content int) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(content))
}

func sizeHeaderValue(k, v string) int {
	return sizeField(fHeaderKey, len(k)) + sizeField(fHeaderRawValue, len(v))
}

func sizeHeaderOption(k, v string) int {
	return sizeField(fOptionHeader, sizeHeaderValue(k, v)) + protowire.SizeTag(fOptionAppendAction) + protowire.SizeVarint(overwriteOrAdd)
}

func appendHeaderOption(b []byte, k, v string) []byte {
	b = appendField(b, fMutationSet, sizeHeaderOption(k, v))
	b = appendField(b, fOptionHeader, sizeHeaderValue(k, v))
	b = appendField(b, fHeaderKey, len(k))
	b = append(b, k...)
	b = appendField(b, fHeaderRawValue, len(v))
	b = append(b, v...)
	b = protowire.AppendTag(b, fOptionAppendAction, protowire.VarintType)
	return protowire.AppendVarint(b, overwriteOrAdd)
}

// routedAnswer is the pick's answer in phase (request_headers, or
// request_body for BUFFERED): the destination header over any the client
// sent, the content-length when known (cl), clear_route_cache, and the
// pick again as envoy.lb dynamic metadata.
func routedAnswer(phase protowire.Number, dest, cl string) *wireAnswer {
	mutation := sizeField(fMutationSet, sizeHeaderOption(HdrDestination, dest))
	if cl != "" {
		mutation += sizeField(fMutationSet, sizeHeaderOption(hdrContentLengthName, cl))
	}
	common := sizeField(fCommonHeaders, mutation) + protowire.SizeTag(fCommonClearCache) + protowire.SizeVarint(1)
	phaseMsg := sizeField(fPhaseResponse, common)
	innerEntry := sizeField(fEntryKey, len(MetaDestination)) + sizeField(fEntryValue, sizeField(fValueString, len(dest)))
	innerStruct := sizeField(fStructFields, innerEntry)
	outerEntry := sizeField(fEntryKey, len(NSDestination)) + sizeField(fEntryValue, sizeField(fValueStruct, innerStruct))
	outerStruct := sizeField(fStructFields, outerEntry)

	b := make([]byte, 0, sizeField(phase, phaseMsg)+sizeField(fRespDynamicMetadata, outerStruct))
	b = appendField(b, phase, phaseMsg)
	b = appendField(b, fPhaseResponse, common)
	b = appendField(b, fCommonHeaders, mutation)
	b = appendHeaderOption(b, HdrDestination, dest)
	if cl != "" {
		b = appendHeaderOption(b, hdrContentLengthName, cl)
	}
	b = protowire.AppendTag(b, fCommonClearCache, protowire.VarintType)
	b = protowire.AppendVarint(b, 1)

	b = appendField(b, fRespDynamicMetadata, outerStruct)
	b = appendField(b, fStructFields, outerEntry)
	b = appendField(b, fEntryKey, len(NSDestination))
	b = append(b, NSDestination...)
	b = appendField(b, fEntryValue, sizeField(fValueStruct, innerStruct))
	b = appendField(b, fValueStruct, innerStruct)
	b = appendField(b, fStructFields, innerEntry)
	b = appendField(b, fEntryKey, len(MetaDestination))
	b = append(b, MetaDestination...)
	b = appendField(b, fEntryValue, sizeField(fValueString, len(dest)))
	b = appendField(b, fValueString, len(dest))
	b = append(b, dest...)
	return &wireAnswer{bufs: mem.BufferSlice{mem.SliceBuffer(b)}}
}

// streamedAnswer passes a body chunk on in phase (request_body or
// response_body): a streamed_response body mutation carrying the chunk's
// own bytes, which are only read until the answer is written.
func streamedAnswer(phase protowire.Number, chunk []byte, eos bool) *wireAnswer {
	streamed := 0
	if len(chunk) > 0 {
		streamed = sizeField(fStreamedBody, len(chunk))
	}
	if eos {
		streamed += protowire.SizeTag(fStreamedEOS) + protowire.SizeVarint(1)
	}
	mutation := sizeField(fBodyStreamed, streamed)
	common := sizeField(fCommonBody, mutation)
	phaseMsg := sizeField(fPhaseResponse, common)

	b := make([]byte, 0, sizeField(phase, phaseMsg)-len(chunk))
	b = appendField(b, phase, phaseMsg)
	b = appendField(b, fPhaseResponse, common)
	b = appendField(b, fCommonBody, mutation)
	b = appendField(b, fBodyStreamed, streamed)
	if len(chunk) == 0 {
		if eos {
			b = protowire.AppendTag(b, fStreamedEOS, protowire.VarintType)
			b = protowire.AppendVarint(b, 1)
		}
		return &wireAnswer{bufs: mem.BufferSlice{mem.SliceBuffer(b)}}
	}
	b = appendField(b, fStreamedBody, len(chunk))
	head := len(b)
	if eos {
		b = protowire.AppendTag(b, fStreamedEOS, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	bufs := mem.BufferSlice{mem.SliceBuffer(b[:head]), mem.SliceBuffer(chunk)}
	if eos {
		bufs = append(bufs, mem.SliceBuffer(b[head:]))
	}
	return &wireAnswer{bufs: bufs}
}
