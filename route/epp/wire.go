package epp

import (
	"fmt"
	"slices"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The answers every routed request gets (the pick, each body chunk passed
// on, the phases let through unchanged) are encoded here, straight to the
// wire format, instead of as a ProcessingResponse tree that protobuf sizes
// and marshals by reflection: no structpb map for the metadata, and
// appended to the inline server's own buffer; through grpc-go, a chunk's
// bytes are sent from where they came in, not copied. The codec sends
// these as they are, decodes requests by hand (decode.go), and handles
// every other message as grpc-go's own proto codec does.

// answer is one of the hot ProcessingResponses, not yet encoded.
type answer struct {
	kind answerKind
	// phase is the ProcessingResponse oneof's field (fRespRequestHeaders ...).
	phase protowire.Number
	// answerRouted: the pick (ip:port,...) and the content-length ("" left
	// out).
	dest []byte
	cl   []byte
	// answerStreamed: the chunk passed on, and its end_of_stream.
	chunk []byte
	eos   bool
}

type answerKind uint8

const (
	// answerContinue is phase's empty answer: the phase goes on unchanged.
	answerContinue answerKind = iota
	// answerRouted is the pick's answer in phase (request_headers, or
	// request_body for BUFFERED): the destination header over any the
	// client sent, the content-length when known, clear_route_cache, and
	// the pick again as envoy.lb dynamic metadata.
	answerRouted
	// answerStreamed passes a body chunk on in phase (request_body or
	// response_body) as a streamed_response body mutation.
	answerStreamed
)

// codec is the Endpoint Picker server's gRPC codec.
type codec struct{}

var _ encoding.CodecV2 = codec{}

// Name is grpc-go's proto codec's: the content-subtype does not change.
func (codec) Name() string { return "proto" }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	if a, ok := v.(*answer); ok {
		return a.buffers(), nil
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
	if r, ok := v.(*procReq); ok {
		// The request views its bytes: a buffer of its own, not pooled.
		if err := decodeRequest(data.Materialize(), r); err != nil {
			return fmt.Errorf("epp codec: %w", err)
		}
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("epp codec: cannot unmarshal into %T", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// sizeField is a length-delimited field's size: tag, length, content.
func sizeField(n protowire.Number, content int) int {
	return protowire.SizeTag(n) + protowire.SizeBytes(content)
}

func appendField(b []byte, n protowire.Number, content int) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(content))
}

func sizeHeaderValue[V string | []byte](k string, v V) int {
	return sizeField(fHeaderKey, len(k)) + sizeField(fHeaderRawValue, len(v))
}

func sizeHeaderOption[V string | []byte](k string, v V) int {
	return sizeField(fOptionHeader, sizeHeaderValue(k, v)) + protowire.SizeTag(fOptionAppendAction) + protowire.SizeVarint(overwriteOrAdd)
}

func appendHeaderOption[V string | []byte](b []byte, k string, v V) []byte {
	b = appendField(b, fMutationSet, sizeHeaderOption(k, v))
	b = appendField(b, fOptionHeader, sizeHeaderValue(k, v))
	b = appendField(b, fHeaderKey, len(k))
	b = append(b, k...)
	b = appendField(b, fHeaderRawValue, len(v))
	b = append(b, v...)
	b = protowire.AppendTag(b, fOptionAppendAction, protowire.VarintType)
	return protowire.AppendVarint(b, overwriteOrAdd)
}

// buffers is a as grpc-go sends it: a chunk's bytes are not copied.
func (a *answer) buffers() mem.BufferSlice {
	if a.kind != answerStreamed || len(a.chunk) == 0 {
		return mem.BufferSlice{mem.SliceBuffer(a.appendTo(nil))}
	}
	head := a.appendHead(nil)
	bufs := mem.BufferSlice{mem.SliceBuffer(head), mem.SliceBuffer(a.chunk)}
	if a.eos {
		bufs = append(bufs, mem.SliceBuffer(appendEOS(nil)))
	}
	return bufs
}

// appendTo appends a's encoding to b.
func (a *answer) appendTo(b []byte) []byte {
	b = a.appendHead(b)
	if a.kind == answerStreamed && len(a.chunk) > 0 {
		b = append(b, a.chunk...)
		if a.eos {
			b = appendEOS(b)
		}
	}
	return b
}

// appendHead appends a's encoding up to a streamed chunk's bytes (all of
// it for the other kinds).
func (a *answer) appendHead(b []byte) []byte {
	switch a.kind {
	case answerRouted:
		return appendRouted(b, a.phase, a.dest, a.cl)
	case answerStreamed:
		return appendStreamedHead(b, a.phase, a.chunk, a.eos)
	}
	return appendField(b, a.phase, 0)
}

func appendRouted(b []byte, phase protowire.Number, dest, cl []byte) []byte {
	mutation := sizeField(fMutationSet, sizeHeaderOption(HdrDestination, dest))
	if len(cl) > 0 {
		mutation += sizeField(fMutationSet, sizeHeaderOption(hdrContentLengthName, cl))
	}
	common := sizeField(fCommonHeaders, mutation) + protowire.SizeTag(fCommonClearCache) + protowire.SizeVarint(1)
	phaseMsg := sizeField(fPhaseResponse, common)
	innerEntry := sizeField(fEntryKey, len(MetaDestination)) + sizeField(fEntryValue, sizeField(fValueString, len(dest)))
	innerStruct := sizeField(fStructFields, innerEntry)
	outerEntry := sizeField(fEntryKey, len(NSDestination)) + sizeField(fEntryValue, sizeField(fValueStruct, innerStruct))
	outerStruct := sizeField(fStructFields, outerEntry)

	b = slices.Grow(b, sizeField(phase, phaseMsg)+sizeField(fRespDynamicMetadata, outerStruct))
	b = appendField(b, phase, phaseMsg)
	b = appendField(b, fPhaseResponse, common)
	b = appendField(b, fCommonHeaders, mutation)
	b = appendHeaderOption(b, HdrDestination, dest)
	if len(cl) > 0 {
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
	return append(b, dest...)
}

// appendStreamedHead appends a streamed answer up to its chunk's bytes
// (the chunk's tag and length included; without a chunk, all of it).
func appendStreamedHead(b []byte, phase protowire.Number, chunk []byte, eos bool) []byte {
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
	b = appendField(b, phase, phaseMsg)
	b = appendField(b, fPhaseResponse, common)
	b = appendField(b, fCommonBody, mutation)
	b = appendField(b, fBodyStreamed, streamed)
	if len(chunk) == 0 {
		if eos {
			b = appendEOS(b)
		}
		return b
	}
	return appendField(b, fStreamedBody, len(chunk))
}

func appendEOS(b []byte) []byte {
	b = protowire.AppendTag(b, fStreamedEOS, protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}
